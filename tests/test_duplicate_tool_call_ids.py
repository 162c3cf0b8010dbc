"""Issue 33 item 5: duplicate tool-call ids in one reply passed through unchanged, so the next
request carried two calls with one id and one result (the second result became user text).
A repeated (or empty) id becomes unique, the provider's id kept where it is unique, on every
provider path: each SDK format through the fake server, the lean HTTP transport, and the
scripted provider."""

from __future__ import annotations

from typing import Any

import pytest

from rollouts import CalculatorEnvironment, RunConfig, ScriptedModel, run_agent
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, TextContent, ToolCallContent, Trajectory
from rollouts.providers._aggregate import unique_tool_call_ids
from rollouts.testing import FakeServer, ScriptedReply, ScriptedToolCall, open_fake_server

REPLIES = [
    ScriptedReply(
        "Adding twice.",
        tool_calls=(
            ScriptedToolCall("add", {"value": 5}, id="dup"),
            ScriptedToolCall("add", {"value": 7}, id="dup"),
            ScriptedToolCall("multiply", {"value": 2}, id="once"),
        ),
    ),
    ScriptedReply("Done: 24.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "24"}, id="end"),)),
]


def _endpoint(provider: str, srv: FakeServer) -> Endpoint:
    if provider == "anthropic":
        return Endpoint("anthropic", "claude-haiku-4-5", api_base=srv.url, api_key="k")
    if provider == "google":
        return Endpoint("google", "gemini-2.5-flash", api_base=srv.url, api_key="k")
    if provider == "openai-responses":
        return Endpoint("openai-responses", "gpt-4.1", api_base=srv.base_url, api_key="k")
    transport = "http" if provider == "http" else "sdk"
    return Endpoint("openai-compatible", "fake-model", api_base=srv.base_url, api_key="k", transport=transport)


def _check(states: list[AgentState]) -> None:
    messages = states[-1].actor.trajectory.messages
    calls = messages[1].get_tool_calls()
    ids = [c.id for c in calls]
    sent_ids = [i.partition("|")[0] for i in ids]  # (the Responses provider's ids are `call|item`)
    assert sent_ids[0] == "dup" and sent_ids[2] == "once" and len(set(sent_ids)) == 3  # unique; unique ones kept
    results = [m for m in messages if m.role == "tool"][:3]
    assert [m.tool_call_id for m in results] == ids  # every call has its own result
    assert "Current value: 24" in results[2].text  # (0 + 5 + 7) * 2: both adds ran
    assert states[-1].environment.current_value == 24  # type: ignore[union-attr]


@pytest.mark.parametrize("provider", ["openai-compatible", "http", "anthropic", "openai-responses", "google"])
async def test_duplicate_tool_call_ids_made_unique(provider: str) -> None:
    async with open_fake_server(list(REPLIES)) as srv:
        state = AgentState(
            actor=Actor(Trajectory((Message("user", "go"),)), _endpoint(provider, srv)),
            environment=CalculatorEnvironment(),
        )
        states = await run_agent(state, RunConfig())
        second = srv.scripted_requests[1].json
    _check(states)
    if provider in ("openai-compatible", "http"):  # what goes back to the model: three ids, three results
        sent = second["messages"]
        call_ids = [c["id"] for c in sent[1]["tool_calls"]]
        assert len(set(call_ids)) == 3
        assert [m["tool_call_id"] for m in sent[2:5]] == call_ids and all(m["role"] == "tool" for m in sent[2:5])


async def test_duplicate_tool_call_ids_made_unique_scripted() -> None:
    model = ScriptedModel(list(REPLIES))
    state = AgentState(
        actor=Actor(Trajectory((Message("user", "go"),)), model.endpoint), environment=CalculatorEnvironment()
    )
    _check(await run_agent(state, RunConfig()))


def test_duplicate_tool_call_ids_rule() -> None:
    def call(i: str) -> Any:
        return ToolCallContent(i, "add", {})

    text = TextContent("x")
    got = unique_tool_call_ids([text, call("a"), call("a"), call("a_2"), call(""), call("")])
    assert [b.id for b in got if isinstance(b, ToolCallContent)] == ["a", "a_3", "a_2", "call_2", "call_3"]
    responses = unique_tool_call_ids([call("c|fc_1"), call("c|fc_2")])
    assert [b.id for b in responses if isinstance(b, ToolCallContent)] == ["c|fc_1", "c_2|fc_2"]
    same = [call("a"), call("b")]
    assert list(unique_tool_call_ids(same)) == same
