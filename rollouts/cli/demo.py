"""`rollouts demo`: a calculator agent, streamed turn by turn.

Until the embedded local model lands this runs on a scripted model (deterministic replies that
stream exactly like a real provider's)."""

from __future__ import annotations

import argparse

import trio

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Message, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.events import StreamEvent, TextDelta, TextEnd, ToolCallEnd, ToolResultReceived
from rollouts.providers.scripted import ScriptedModel, ScriptedReply, ScriptedToolCall
from rollouts.run_config import RunConfig

QUESTION = "What is (7 + 5) * 3 / 4?"


def _scripted_calculator() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedReply(
                "First I add 7 and 5.", (ScriptedToolCall("add", {"value": 7}), ScriptedToolCall("add", {"value": 5}))
            ),
            ScriptedReply("Now multiply by 3.", (ScriptedToolCall("multiply", {"value": 3}),)),
            ScriptedReply("Then divide by 4.", (ScriptedToolCall("divide", {"value": 4}),)),
            ScriptedReply("The result is 9.", (ScriptedToolCall("complete_task", {"final_result": "9"}),)),
        ],
        name="demo-calculator",
    )


async def _print_event(event: StreamEvent) -> None:
    if isinstance(event, TextDelta):
        print(event.delta, end="", flush=True)
    elif isinstance(event, TextEnd):
        print()
    elif isinstance(event, ToolCallEnd):
        args = ", ".join(f"{k}={v}" for k, v in event.tool_call.arguments.items())
        print(f"  -> {event.tool_call.name}({args})", flush=True)
    elif isinstance(event, ToolResultReceived):
        print(f"  <- {event.result.content}", flush=True)


async def run_demo() -> int:
    model = _scripted_calculator()
    print(f"user: {QUESTION}\n(model: scripted calculator)\n")
    state = AgentState(
        actor=Actor(Trajectory((Message("user", QUESTION),)), model.endpoint),
        environment=CalculatorEnvironment(),
    )
    states = await run_agent(state, RunConfig(on_chunk=_print_event, max_turns=8))
    final = states[-1]
    assert isinstance(final.environment, CalculatorEnvironment)
    print(f"\nfinal answer: {final.environment.current_value:g} (stop: {final.stop}, turns: {final.turn_idx})")
    return 0


def main(args: argparse.Namespace | None = None) -> int:
    return trio.run(run_demo)
