"""The small built-in environments (calculator, no tools) also survive a JSON round trip of
their serialized state mid-run, and the run continues on the restored copy. The others have
the same test in their own files (coding, git worktree, browsing, compose, the docs example)."""

from __future__ import annotations

import json

from _env_helpers import run, tool_messages

from rollouts import BasicEnvironment, CalculatorEnvironment, StopReason
from rollouts.providers.scripted import tool_call


async def test_calculator_round_trips_mid_run_and_continues() -> None:
    first = await run(CalculatorEnvironment(), [tool_call("add", value=6), "thinking"])
    mid = first[-1]
    assert mid.environment is not None
    data = json.loads(json.dumps(await mid.environment.serialize()))
    restored = await CalculatorEnvironment.deserialize(data)
    assert restored.current_value == 6
    second = await run(
        restored, [tool_call("multiply", value=7), tool_call("complete_task", final_result="42")], state=mid
    )
    final = second[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert "Current value: 42" in tool_messages(final)[1].text
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 42


async def test_basic_environment_round_trips_mid_run_and_continues() -> None:
    first = await run(BasicEnvironment(), ["hello"])
    mid = first[-1]
    assert mid.environment is not None
    restored = await BasicEnvironment.deserialize(json.loads(json.dumps(await mid.environment.serialize())))
    second = await run(restored, ["again"], state=mid)
    assert [m.text for m in second[-1].messages if m.role == "assistant"] == ["hello", "again"]
