"""A calculator agent on a scripted model: the agent loop, streamed events and the final state.

Run: python examples/calculator_agent.py
Swap `model.endpoint` for a real one, e.g. Endpoint("anthropic", "claude-sonnet-4-5", api_key=...),
and the same code runs against that provider.
"""

from __future__ import annotations

import trio

from rollouts import (
    Actor,
    AgentState,
    CalculatorEnvironment,
    Message,
    RunConfig,
    ScriptedModel,
    StreamEvent,
    Trajectory,
    handle_stop_max_turns,
    run_agent,
    tool_call,
)
from rollouts.events import TextDelta, ToolCallEnd, ToolResultReceived


async def print_event(event: StreamEvent) -> None:
    if isinstance(event, TextDelta):
        print(event.delta, end="", flush=True)
    elif isinstance(event, ToolCallEnd):
        print(f"-> {event.tool_call.name}({dict(event.tool_call.arguments)})")
    elif isinstance(event, ToolResultReceived):
        print(f"<- {event.result.content}")


async def main() -> None:
    model = ScriptedModel(
        [tool_call("add", value=2), tool_call("multiply", value=21), tool_call("complete_task", final_result="42")]
    )
    state = AgentState(
        actor=Actor(Trajectory((Message("user", "What is 2 * 21?"),)), model.endpoint),
        environment=CalculatorEnvironment(),
    )
    states = await run_agent(state, RunConfig(on_chunk=print_event, handle_stop=handle_stop_max_turns(10)))
    final = states[-1]
    assert isinstance(final.environment, CalculatorEnvironment)
    print(f"stop={final.stop} value={final.environment.current_value:g} turns={final.turn_idx}")


if __name__ == "__main__":
    trio.run(main)
