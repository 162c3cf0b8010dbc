"""One conversation, five providers: the same calculator agent run gives equivalent trajectories on
Anthropic, OpenAI chat, OpenAI Responses, Google and an OpenAI-compatible server (each through its
real SDK against the fake server), and a conversation that changes provider mid-way continues
with thinking and tool-call ids transformed for each new provider."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from rollouts.agents import run_agent
from rollouts.dtypes import (
    Actor,
    AgentState,
    Endpoint,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCallContent,
    Trajectory,
    Usage,
)
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.events import StreamDone, TextDelta, ThinkingDelta, ToolCallDelta, ToolCallEnd
from rollouts.providers._transform import map_tool_call_id
from rollouts.run_config import RunConfig
from rollouts.testing import FakeServer, ScriptedReply, ScriptedToolCall, open_fake_server
from tests._provider_helpers import Recorder, call

SYSTEM = "You are a calculator. Use the tools."
QUESTION = "What is (0 + 5) * 3?"
SAFE_64 = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

SCRIPT = [
    ScriptedReply(
        "I'll add 5 first.",
        thinking="Start from 0, add 5.",
        tool_calls=(ScriptedToolCall("add", {"value": 5}),),
        usage=Usage(input_tokens=120, output_tokens=30),
    ),
    ScriptedReply(
        tool_calls=(ScriptedToolCall("divide", {"value": 0}), ScriptedToolCall("multiply", {"value": 3})),
        usage=Usage(input_tokens=180, output_tokens=40),
    ),
    ScriptedReply(
        "The answer is 15.",
        tool_calls=(ScriptedToolCall("complete_task", {"final_result": "15"}),),
        usage=Usage(input_tokens=260, output_tokens=20),
    ),
]


def _endpoint(provider: str, srv: FakeServer) -> Endpoint:
    if provider == "anthropic":
        return Endpoint("anthropic", "claude-haiku-4-5", api_base=srv.url, api_key="k")
    if provider == "google":
        return Endpoint("google", "gemini-2.5-flash", api_base=srv.url, api_key="k")
    if provider == "openai":
        return Endpoint("openai", "gpt-4o-mini", api_base=srv.base_url, api_key="k")
    if provider == "openai-responses":
        return Endpoint("openai-responses", "gpt-4.1", api_base=srv.base_url, api_key="k")
    assert provider == "openai-compatible"
    return Endpoint("openai-compatible", "fake-model", api_base=srv.base_url)


def _system_prompt_sent(provider: str, body: dict[str, Any]) -> str:
    if provider == "anthropic":
        return str(body["system"][0]["text"])
    if provider == "google":
        return str(body["systemInstruction"]["parts"][0]["text"])
    if provider == "openai-responses":
        return str(body["instructions"])
    assert body["messages"][0]["role"] == "system"
    return str(body["messages"][0]["content"])


def _tool_outputs_sent(provider: str, body: dict[str, Any]) -> list[str]:
    """The tool results in a request, in order, in each API's own shape."""
    if provider == "anthropic":
        return [
            b["content"]
            for m in body["messages"]
            if m["role"] == "user"
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
    if provider == "google":
        return [
            next(iter(p["functionResponse"]["response"].values()))
            for c in body["contents"]
            for p in c["parts"]
            if "functionResponse" in p
        ]
    if provider == "openai-responses":
        return [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def _normalise(messages: tuple[Message, ...]) -> list[tuple[Any, ...]]:
    """What must be equal across providers: roles, text, thinking text, calls, results."""
    out: list[tuple[Any, ...]] = []
    ids: dict[str, int] = {}
    for m in messages:
        if m.role == "tool":
            out.append(("tool", ids[m.tool_call_id or ""], m.text, bool((m.details or {}).get("is_error"))))
            continue
        thinking = "".join(b.thinking for b in m.blocks if isinstance(b, ThinkingContent))
        calls = []
        for b in m.blocks:
            if isinstance(b, ToolCallContent):
                ids[b.id] = len(ids)
                calls.append((ids[b.id], b.name, dict(b.arguments)))
        out.append((m.role, m.text, thinking, tuple(calls)))
    return out


PROVIDERS = ["anthropic", "openai", "openai-responses", "google", "openai-compatible"]


async def _run(provider: str) -> tuple[AgentState, list[dict[str, Any]], Recorder]:
    async with open_fake_server(SCRIPT) as srv:
        msgs = (Message("system", SYSTEM), Message("user", QUESTION))
        state = AgentState(Actor(Trajectory(msgs), _endpoint(provider, srv)), environment=CalculatorEnvironment())
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        return states[-1], [r.json for r in srv.scripted_requests], rec


async def test_the_same_conversation_is_equivalent_on_all_five_providers() -> None:
    results = {p: await _run(p) for p in PROVIDERS}
    reference = _normalise(results["anthropic"][0].messages)
    assert [r[0] for r in reference] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
    ]
    assert reference[2] == ("assistant", "I'll add 5 first.", "Start from 0, add 5.", ((0, "add", {"value": 5}),))
    for provider, (final, requests, rec) in results.items():
        assert _normalise(final.messages) == reference, provider
        assert final.stop == StopReason.TASK_COMPLETED, provider
        assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 15
        # events: every call streamed text/thinking/arguments in pieces and ended with usage
        done = rec.of(StreamDone)
        assert [d.finish_reason for d in done] == ["tool_use"] * 3, provider
        assert [(d.usage.input_tokens, d.usage.output_tokens) for d in done] == [(120, 30), (180, 40), (260, 20)], (
            provider
        )
        assert len(rec.of(TextDelta)) > 2 and len(rec.of(ThinkingDelta)) >= 1 and rec.of(ToolCallDelta), provider
        assert [e.tool_call.name for e in rec.of(ToolCallEnd)] == ["add", "divide", "multiply", "complete_task"]
        # usage on the messages; cost where the model has a price
        usages = [m.usage for m in final.messages if m.role == "assistant"]
        assert all(u is not None for u in usages)
        total = final.actor.trajectory.total_usage()
        assert (total.input_tokens, total.output_tokens) == (560, 90), provider
        # every model here has a price except the self-hosted "fake-model"
        assert (total.cost_usd > 0) == (provider != "openai-compatible"), provider
        # what each server received: the system prompt every time, the tool results on later turns
        assert len(requests) == 3
        for body in requests:
            assert _system_prompt_sent(provider, body) == SYSTEM, provider
        assert _tool_outputs_sent(provider, requests[1]) == ["Added 5 to 0. Current value: 5"], provider
        outputs = _tool_outputs_sent(provider, requests[2])
        assert len(outputs) == 3 and "divide by zero" in outputs[1] and outputs[2].endswith("Current value: 15"), (
            provider
        )


async def test_a_conversation_that_switches_provider_continues_correctly() -> None:
    plan = "Plan: add 5, then multiply by 3."
    async with (
        open_fake_server([ScriptedReply(thinking=plan, tool_calls=(ScriptedToolCall("add", {"value": 5}, id="call_x"),))]) as responses_srv,
        open_fake_server([ScriptedReply("Multiplying.", thinking="Now multiply.", tool_calls=(ScriptedToolCall("multiply", {"value": 3}, id="toolu_m"),))]) as anthropic_srv,
        open_fake_server([ScriptedReply(thinking="Check it.", tool_calls=(ScriptedToolCall("subtract", {"value": 0}),))]) as google_srv,
        open_fake_server([ScriptedReply("15", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "15"}, id="call_done"),))]) as chat_srv,
    ):  # fmt: skip
        endpoints = [
            _endpoint("openai-responses", responses_srv),
            _endpoint("anthropic", anthropic_srv),
            _endpoint("google", google_srv),
            _endpoint("openai", chat_srv),
        ]

        def switch(state: AgentState) -> AgentState:
            actor = replace(state.actor, endpoint=endpoints[min(state.turn_idx, 3)])
            return replace(state, actor=actor)

        msgs = (Message("system", SYSTEM), Message("user", QUESTION))
        start = AgentState(Actor(Trajectory(msgs), endpoints[0]), environment=CalculatorEnvironment())
        states = await run_agent(start, RunConfig(on_step_start=switch))
        anthropic_body = anthropic_srv.last_request.json
        google_body = google_srv.last_request.json
        chat_body = chat_srv.last_request.json
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 15
    assert [m.provider for m in final.messages if m.role == "assistant"] == [
        "openai-responses",
        "anthropic",
        "google",
        "openai",
    ]

    # The stored trajectory is untouched: the Responses reasoning block keeps its origin and id.
    first = final.messages[2]
    assert first.content[0] == ThinkingContent(
        plan, signature='{"id":"rs_fake_0","encrypted_content":null}', provider="openai-responses"
    )
    responses_id = first.get_tool_calls()[0].id
    assert responses_id == "call_x|fc_fake_0_0"

    # Anthropic received the foreign reasoning as text and a safe id, the same in call and result.
    mapped = map_tool_call_id(responses_id)
    assert SAFE_64.match(mapped)
    assert anthropic_body["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": f"<thinking>\n{plan}\n</thinking>"},
            {"type": "tool_use", "id": mapped, "name": "add", "input": {"value": 5}},
        ],
    }
    result = anthropic_body["messages"][2]["content"][0]
    assert (result["type"], result["tool_use_id"], result["content"]) == (
        "tool_result",
        mapped,
        "Added 5 to 0. Current value: 5",
    )

    # Google received both earlier providers' thinking as text; Anthropic's signature is not sent.
    model_turns = [c for c in google_body["contents"] if c["role"] == "model"]
    assert model_turns[0]["parts"] == [
        {"text": f"<thinking>\n{plan}\n</thinking>"},
        {"functionCall": {"name": "add", "args": {"value": 5}}},
    ]
    assert model_turns[1]["parts"] == [
        {"text": "<thinking>\nNow multiply.\n</thinking>"},
        {"text": "Multiplying."},
        {"functionCall": {"name": "multiply", "args": {"value": 3}}},
    ]
    assert "sig_fake" not in str(google_body)

    # OpenAI chat: every id at most 40 characters, calls and results paired; Google's
    # signature-only block dropped, its thought text kept as text.
    assistant = [m for m in chat_body["messages"] if m["role"] == "assistant"]
    tool_msgs = [m for m in chat_body["messages"] if m["role"] == "tool"]
    call_ids = [tc["id"] for m in assistant for tc in m["tool_calls"]]
    assert [m["tool_call_id"] for m in tool_msgs] == call_ids
    assert all(len(i) <= 40 for i in call_ids) and call_ids[1] == "toolu_m"
    assert assistant[0]["content"] == f"<thinking>\n{plan}\n</thinking>"
    assert assistant[2]["content"] == "<thinking>\nCheck it.\n</thinking>"
    assert [m["content"] for m in tool_msgs][-1] == "Subtracted 0 from 15. Current value: 15"


@pytest.mark.parametrize("provider", ["anthropic", "openai-responses", "google"])
async def test_a_pending_tool_call_from_another_provider_gets_a_synthetic_result(provider: str) -> None:
    history = (
        Message("system", SYSTEM),
        Message("user", QUESTION),
        Message(
            "assistant",
            (TextContent("Adding."), ToolCallContent("call_1|fc_9", "add", {"value": 5})),
            provider="openai-responses",
        ),
        Message("user", "Never mind, just say hi."),
    )
    async with open_fake_server(["hi"]) as srv:
        actor = Actor(Trajectory(history), _endpoint(provider, srv))
        out, _ = await call(actor)
        body = srv.last_request.json
    assert out.trajectory.messages[-1].text == "hi"
    assert out.trajectory.messages[:4] == history  # the stored history is not rewritten
    outputs = _tool_outputs_sent(provider, body)
    assert outputs == ["No result: this tool call was not executed."]
