"""compose(): routing by name, collisions and prefixes, serialization of every part."""

# Assertions inspect real files synchronously on purpose (quick stat calls in tests).
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _env_helpers import calls, run, tool_messages

from rollouts import CalculatorEnvironment, RunConfig, StopReason, ToolCall
from rollouts.environments import (
    BasicEnvironment,
    CodingEnvironment,
    ComposedEnvironment,
    check_environment,
    compose,
)
from rollouts.environments.base import clone_environment
from rollouts.providers.scripted import tool_call


async def _call(env: ComposedEnvironment, name: str, **args):
    return await env.exec_tool(ToolCall("c1", name, args), None, RunConfig())  # type: ignore[arg-type]


async def test_tools_are_routed_to_their_environment(tmp_path: Path) -> None:
    env = compose(CalculatorEnvironment(), CodingEnvironment(tmp_path, preset="read_only"), BasicEnvironment())
    names = [t.name for t in env.get_tools()]
    assert names == ["add", "subtract", "multiply", "divide", "complete_task", "read", "ls", "glob", "grep"]
    assert "Current value: 5" in (await _call(env, "add", value=5)).content
    (tmp_path / "f.txt").write_text("hello\n")
    assert (await _call(env, "read", path="f.txt")).content == "1\thello"
    r = await _call(env, "write", path="f.txt", content="x")
    assert r.is_error and "Unknown tool 'write'" in r.content
    assert env.get_status_info() == {"value": "5", "root": str(tmp_path.resolve()), "preset": "read_only"}


async def test_collisions_are_refused_unless_prefixed(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = CodingEnvironment(tmp_path / "a"), CodingEnvironment(tmp_path / "b")
    with pytest.raises(ValueError, match=r"tool name 'read' is offered by both .*prefixes="):
        compose(a, b)
    with pytest.raises(ValueError, match="one per environment"):
        compose(a, b, prefixes=("a_",))
    env = compose(a, b, prefixes=("a_", "b_"))
    assert [t.name for t in env.get_tools()][:2] == ["a_read", "a_write"]
    assert {t.name for t in env.get_tools()} >= {"b_read", "b_bash", "a_grep"}
    await _call(env, "a_write", path="x.txt", content="in a\n")
    await _call(env, "b_write", path="x.txt", content="in b\n")
    assert (tmp_path / "a" / "x.txt").read_text() == "in a\n"
    assert (tmp_path / "b" / "x.txt").read_text() == "in b\n"
    assert "in b" in (await _call(env, "b_bash", command="cat x.txt")).content
    # A prefix for one part only is enough when it removes the collision.
    assert "read" in [t.name for t in compose(a, b, prefixes=("", "other_")).get_tools()]
    with pytest.raises(TypeError, match="not an Environment"):
        compose(a, object())  # type: ignore[arg-type]


async def test_confirmation_and_session_hooks_are_routed(tmp_path: Path) -> None:
    env = compose(CalculatorEnvironment(), CodingEnvironment(tmp_path, confirm_bash=True), prefixes=("calc_", ""))
    assert env.requires_confirmation(ToolCall("1", "bash", {}))
    assert not env.requires_confirmation(ToolCall("1", "calc_add", {}))
    assert not env.requires_confirmation(ToolCall("1", "nope", {}))


async def test_serializes_every_part_with_its_type(tmp_path: Path) -> None:
    env = compose(CalculatorEnvironment(3), CodingEnvironment(tmp_path), prefixes=("c_", ""))
    data = json.loads(json.dumps(await env.serialize()))
    assert [p["type"] for p in data["parts"]] == [
        "rollouts.environments.calculator:CalculatorEnvironment",
        "rollouts.environments.coding:CodingEnvironment",
    ]
    assert data["parts"][0]["state"] == {"current_value": 3.0} and data["prefixes"] == ["c_", ""]
    restored = await ComposedEnvironment.deserialize(data)
    assert isinstance(restored.parts[0], CalculatorEnvironment) and restored.parts[0].current_value == 3.0
    assert isinstance(restored.parts[1], CodingEnvironment) and restored.parts[1].root == str(tmp_path.resolve())
    await check_environment(
        env, calls=[ToolCall("1", "c_multiply", {"value": 2}), ToolCall("2", "write", {"path": "a", "content": "b"})]
    )


async def test_agent_run_round_trips_mid_run_and_continues(tmp_path: Path) -> None:
    env = compose(CalculatorEnvironment(), CodingEnvironment(tmp_path))
    first = await run(env, [tool_call("add", value=20), tool_call("write", path="v.txt", content="20"), "paused"])
    mid = first[-1]
    assert mid.environment is not None
    restored = await ComposedEnvironment.deserialize(json.loads(json.dumps(await mid.environment.serialize())))
    assert isinstance(restored.parts[0], CalculatorEnvironment) and restored.parts[0].current_value == 20
    second = await run(
        restored,
        [
            calls(("multiply", {"value": 2}), ("bash", {"command": "cat v.txt"})),
            tool_call("complete_task", final_result="40"),
        ],
        state=mid,
    )
    final = second[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    msgs = tool_messages(final)
    assert "Current value: 40" in msgs[2].text and msgs[3].text.startswith("20")
    final_env = final.environment
    assert isinstance(final_env, ComposedEnvironment)
    clone = await clone_environment(final_env)
    assert await clone.serialize() == await final_env.serialize()
