"""The agent loop's own cost per turn, as history grows.

One turn = `run_agent_step` on a scripted model with no latency: the model streams one tool call
(`add`), the loop validates and executes it on a CalculatorEnvironment and appends the result.
Measured from the same starting state with 10, 100 and 1000 messages of history.

Reference in the same run: the bare provider call alone (`stream_scripted`, the same events
with a no-op consumer) — what a turn costs before the loop adds anything. The difference is the
loop's own overhead (environment clone, schema validation, tool execution, message building).

Run: python benchmarks/agent_loop.py [--repeats 2000]
Last line: JSON with per_turn_us_10, per_turn_us_100, per_turn_us_1000 (and the reference figures).
"""

from __future__ import annotations

import argparse
import json
import time

import trio

from rollouts import Actor, AgentState, CalculatorEnvironment, Message, RunConfig, Trajectory, Usage
from rollouts.agents import run_agent_step
from rollouts.events import ignore_chunk
from rollouts.providers.scripted import ScriptedModel, ScriptedReply, ScriptedToolCall, stream_scripted

REPLY = ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 1}),), usage=Usage(100, 10))


def _history(n: int) -> tuple[Message, ...]:
    msgs = [Message("system", "You are a calculator.")]
    while len(msgs) < n:
        msgs.append(Message("user", f"question {len(msgs)}: what is 2 + 2?"))
        msgs.append(Message("assistant", "It is 4. " * 8))
    return tuple(msgs[:n])


async def _time_per_call(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(min(50, repeats)):  # warm-up
        await fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            await fn()
        best = min(best, (time.perf_counter() - t0) / repeats)
    return best * 1e6


async def main(base_repeats: int) -> None:
    model = ScriptedModel(lambda req: REPLY, chunk_size=16)
    rc = RunConfig()
    results: dict[str, float] = {}
    print(
        f"{'history':>8} {'turn (us)':>10} {'provider only (us)':>19} {'loop overhead (us)':>19} {'turn/provider':>14}"
    )
    for n in (10, 100, 1000):
        state = AgentState(
            actor=Actor(Trajectory(_history(n)), model.endpoint),
            environment=CalculatorEnvironment(),
        )
        repeats = base_repeats if n < 1000 else max(1, base_repeats // 2)

        async def step(state: AgentState = state, n: int = n) -> None:
            new = await run_agent_step(state, rc)
            assert len(new.actor.trajectory.messages) == n + 2

        async def provider_only(state: AgentState = state) -> None:
            await stream_scripted(state.actor, ignore_chunk)

        turn = await _time_per_call(step, repeats)
        bare = await _time_per_call(provider_only, repeats)
        results[f"per_turn_us_{n}"] = round(turn, 1)
        results[f"provider_only_us_{n}"] = round(bare, 1)
        results[f"loop_overhead_us_{n}"] = round(turn - bare, 1)
        print(f"{n:>8} {turn:>10.1f} {bare:>19.1f} {turn - bare:>19.1f} {turn / bare:>14.2f}")
    growth = results["per_turn_us_1000"] / results["per_turn_us_10"]
    results["growth_1000_vs_10"] = round(growth, 2)
    print(f"per-turn cost at 1000 messages / at 10 messages: {growth:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2000, help="turns per timed round (half at 1000 messages)")
    trio.run(main, parser.parse_args().repeats)
