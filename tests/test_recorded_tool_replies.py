"""Issue 33 item 12, from real transcripts: text tool-call recovery on replies recorded from the
packaged models.

tests/data/recorded_tool_replies/*.jsonl holds the exact reply texts qwen2.5-coder-0.5b and
-1.5b wrote (before any parsing) when offered tools, on calc-steps chains ending with a
`submit_answer` tool of the user's own, the built-in calculator, and BFCL single calls
(benchmarks/record_tool_replies.py made them; its docstring says how to record them again).
`EXPECTED` below holds, for every recorded reply, the calls it holds (reviewed by hand). Each
reply is fed to the recovery code, alone and through the whole path (an OpenAI-compatible
server streaming it, the provider, the agent loop with a session), and:

* the recovered calls (name and arguments) are the expected ones;
* no fragment of a call stays as text beside a recovered call (a stray `{`, a code fence);
* the reply's stop reason, the run's stop reason and the session's status agree: a recovered
  call is `tool_use`, runs the tool and the run completes; no call ends the run
  `no_tool_called`, in the run and in its session.

A re-recording whose replies differ fails `test_recorded_replies_all_have_expectations` until
`EXPECTED` is reviewed and updated.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from rollouts import Message, RunConfig, run_agent
from rollouts.dtypes import Actor, AgentState, Endpoint, StopReason, Tool, ToolCall, ToolResult, Trajectory
from rollouts.environments.base import EnvironmentBase
from rollouts.providers import get_provider_function
from rollouts.providers._text_tool_calls import extract_text_tool_calls
from rollouts.store import FileSessionStore, SessionStatus
from rollouts.testing import ScriptedReply, open_fake_server

DATA = Path(__file__).parent / "data" / "recorded_tool_replies"
Key = tuple[str, str, int, int]  # model, prompt id, turn, seed
Calls = list[tuple[str, dict[str, Any]]]


def _load() -> list[dict[str, Any]]:
    rows = []
    for path in sorted(DATA.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def _key(row: dict[str, Any]) -> Key:
    return (row["model"], row["prompt_id"], row["turn"], row["seed"])


ROWS = _load()
IDS = [f"{m}-{p}-turn{t}-seed{s}" for m, p, t, s in map(_key, ROWS)]

# The calls each recorded reply holds, read by hand from the replies (see the module docstring).
EXPECTED: dict[Key, Calls] = {
    ("qwen2.5-coder-0.5b", "bfcl/simple_python_0", 0, 0): [
        ("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})
    ],
    ("qwen2.5-coder-0.5b", "bfcl/simple_python_1", 0, 0): [("math_factorial", {"number": 5})],
    ("qwen2.5-coder-0.5b", "bfcl/simple_python_2", 0, 0): [("math_hypot", {"x": 4, "y": 5})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 0, 0): [("add", {"value": 7})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 1, 0): [("multiply", {"value": 2})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 2, 0): [("add", {"value": 14})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 3, 0): [("multiply", {"value": 28})],
    ("qwen2.5-coder-0.5b", "calculator/calc-04", 0, 0): [("add", {"value": 20})],
    ("qwen2.5-coder-0.5b", "calculator/calc-04", 1, 0): [("multiply", {"value": 2})],
    ("qwen2.5-coder-0.5b", "calculator/calc-04", 2, 0): [("divide", {"value": 2})],
    ("qwen2.5-coder-0.5b", "calculator/calc-04", 3, 0): [("complete_task", {"final_result": "20"})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 0, 1): [("multiply", {"value": 7})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 0, 2): [("add", {"value": 7})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 1, 2): [("multiply", {"value": 2})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 2, 2): [("add", {"value": 14})],
    ("qwen2.5-coder-0.5b", "steps/calc-01", 3, 2): [("multiply", {"value": 28})],
    ("qwen2.5-coder-1.5b", "bfcl/simple_python_0", 0, 0): [
        ("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})
    ],
    ("qwen2.5-coder-1.5b", "bfcl/simple_python_1", 0, 0): [("math_factorial", {"number": 5})],
    ("qwen2.5-coder-1.5b", "bfcl/simple_python_2", 0, 0): [("math_hypot", {"x": 4, "y": 5, "z": 0})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 0, 0): [("add", {"value": 7})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 1, 0): [("multiply", {"value": 2})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 2, 0): [("submit_answer", {"answer": 14})],
    ("qwen2.5-coder-1.5b", "calculator/calc-04", 0, 0): [("add", {"value": 20})],
    ("qwen2.5-coder-1.5b", "calculator/calc-04", 1, 0): [("multiply", {"value": 2})],
    ("qwen2.5-coder-1.5b", "calculator/calc-04", 2, 0): [("complete_task", {"final_result": "40"})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 0, 1): [("add", {"value": 7})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 1, 1): [("add", {"value": 7})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 2, 1): [("add", {"value": 7})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 0, 2): [("add", {"value": 7})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 1, 2): [("multiply", {"value": 2})],
    ("qwen2.5-coder-1.5b", "steps/calc-01", 2, 2): [("submit_answer", {"answer": 14})],
}


def _tools(row: dict[str, Any]) -> tuple[Tool, ...]:
    return tuple(Tool(t["name"], t["description"], t["parameters"]) for t in row["tools"])


def _no_fragments(text: str) -> None:
    """Nothing of a call's JSON or its wrapper is left in `text` (prose around it may stay)."""
    for piece in ("{", "}", "```", '"name"', '"arguments"', "<tool_call>"):
        assert piece not in text, f"{piece!r} left beside a recovered call: {text!r}"
    assert text.count("`") % 2 == 0, f"half of an inline-code wrapper left beside a recovered call: {text!r}"


def test_recorded_replies_all_have_expectations() -> None:
    assert len(ROWS) >= 20 and {r["model"] for r in ROWS} == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    keys = [_key(r) for r in ROWS]
    assert len(set(keys)) == len(keys), "a reply recorded twice"
    assert set(keys) == set(EXPECTED), "re-recorded: review the replies and update EXPECTED"


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_recorded_reply_calls_are_recovered_without_fragments(row: dict[str, Any]) -> None:
    names = [t["name"] for t in row["tools"]]
    calls, rest = extract_text_tool_calls(row["reply"], names, limit=1)  # as `local` asks: one call a reply
    assert [(c.name, c.arguments) for c in calls] == EXPECTED[_key(row)]
    if calls:
        _no_fragments(rest.strip())
    else:
        assert rest == row["reply"]  # no call: the text is left exactly as written


class OfferedTools(EnvironmentBase):
    """Offers the recorded tools; a call to any of them completes the task."""

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.tools = tuple(tools)

    def get_tools(self) -> Sequence[Tool]:
        return self.tools

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        return ToolResult(tool_call.id, "ok", stop_reason=StopReason.TASK_COMPLETED)

    async def serialize(self) -> dict[str, Any]:
        return {
            "tools": [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in self.tools]
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> OfferedTools:
        return cls(_tools(data))


@pytest.mark.parametrize("row", ROWS, ids=IDS)
async def test_recorded_reply_through_the_server_and_the_agent_loop(row: dict[str, Any], tmp_path: Path) -> None:
    expected = EXPECTED[_key(row)]
    tools = _tools(row)
    reply = ScriptedReply(text=row["reply"], finish_reason="length" if row["finish_reason"] == "length" else None)
    async with open_fake_server([reply], chunk_size=3) as srv:
        ep = Endpoint(
            "openai-compatible",
            row["model"],
            api_base=srv.base_url,
            transport="http",
            extra_params={"parallel_tool_calls": False},  # as the `local` provider sends
        )
        # the provider alone: the message and its stop reason
        actor = Actor(Trajectory((Message("user", "go"),)), ep, tools=tools)
        msg = (await get_provider_function(ep.provider, ep.model)(actor, _ignore)).trajectory.messages[-1]
    calls = [(c.name, dict(c.arguments)) for c in msg.get_tool_calls()]
    assert calls == expected
    finish = (msg.details or {}).get("finish_reason")
    if row["finish_reason"] == "length":
        assert finish == "max_tokens"  # cut at max_tokens stays cut, call or not
    else:
        assert finish == ("tool_use" if expected else "stop")
    if expected:
        _no_fragments(msg.text)

    # the agent loop with a session: the run's stop reason and the session's status agree
    async with open_fake_server([reply], chunk_size=3) as srv:
        ep = Endpoint(
            "openai-compatible", row["model"], api_base=srv.base_url, extra_params={"parallel_tool_calls": False}
        )
        store = FileSessionStore(tmp_path / "sessions")
        state = AgentState(actor=Actor(Trajectory((Message("user", "go"),)), ep), environment=OfferedTools(tools))
        states = await run_agent(state, RunConfig(session_store=store, max_turns=3))
    final = states[-1]
    session, _ = await store.get(final.session_id)  # type: ignore[arg-type]
    if expected:
        assert final.stop == StopReason.TASK_COMPLETED and session.status == SessionStatus.COMPLETED
    else:
        assert final.stop == StopReason.NO_TOOL_CALLED and session.status == SessionStatus.NO_TOOL_CALLED


async def _ignore(event: object) -> None:
    return None
