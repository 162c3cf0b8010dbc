"""The OpenAI chat provider through the real `openai` SDK (and the lean HTTP transport) against
the fake server: events, final Message, Usage, and what the server received."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import trio

from rollouts.agents import run_agent
from rollouts.dtypes import (
    Actor,
    AgentState,
    Endpoint,
    ImageContent,
    Message,
    StopReason,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolCallContent,
    Trajectory,
    Usage,
)
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import AuthenticationError
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)
from rollouts.providers import get_provider_function
from rollouts.providers._pricing import with_cost
from rollouts.providers.openai_chat import uses_responses_api
from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.run_config import RunConfig
from rollouts.testing import FakeTurn, open_fake_server

TRANSPORTS = pytest.mark.parametrize("transport", ["sdk", "http"])
ADD = Tool("add", "Add a number.", {"type": "object", "properties": {"value": {"type": "number"}}})
MUL = Tool("multiply", "Multiply.", {"type": "object", "properties": {"value": {"type": "number"}}})


class Recorder:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _actor(base_url: str, transport: str = "sdk", *, model: str = "gpt-4o-mini", **ep: Any) -> Actor:
    endpoint = Endpoint("openai", model, api_base=base_url, api_key="sk-test", transport=transport, **ep)  # type: ignore[arg-type]
    msgs = (Message("system", "You are terse."), Message("user", "Say hello."))
    return Actor(Trajectory(msgs), endpoint)


async def _call(actor: Actor) -> tuple[Actor, Recorder]:
    rec = Recorder()
    fn = get_provider_function(actor.endpoint.provider, actor.endpoint.model)
    return await fn(actor, rec), rec


@TRANSPORTS
async def test_text_reply_exact_events_message_usage_and_request(transport: str) -> None:
    reported = Usage(input_tokens=30, output_tokens=4, cache_read_tokens=10, reasoning_tokens=1)
    usage = with_cost(reported, "gpt-4o-mini")  # priced from the shared table
    assert usage.cost_usd > 0
    async with open_fake_server([ScriptedReply("Hello there!", usage=reported)], chunk_size=5) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport, temperature=0.2, max_tokens=77))
    assert rec.events == [
        LLMCallStart("openai", "gpt-4o-mini"),
        StreamStart(attempt=1),
        TextStart(0),
        TextDelta(0, "Hello"),
        TextDelta(0, " ther"),
        TextDelta(0, "e!"),
        TextEnd(0, "Hello there!"),
        StreamDone("stop", usage),
    ]
    msg = actor.trajectory.messages[-1]
    assert (msg.role, msg.content, msg.provider, msg.model) == (
        "assistant",
        (TextContent("Hello there!"),),
        "openai",
        "gpt-4o-mini",
    )
    assert msg.usage == usage
    comp = actor.trajectory.completions[-1]
    assert (comp.finish_reason, comp.attempts, comp.message_index) == ("stop", 1, 2)
    body = srv.last_request.json
    assert srv.last_request.path == "/v1/chat/completions"
    assert srv.last_request.headers["authorization"] == "Bearer sk-test"
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
    ]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 77 and body["temperature"] == 0.2
    assert "tools" not in body


@TRANSPORTS
@pytest.mark.parametrize("interleave", [False, True])
async def test_parallel_tool_calls_stream_incrementally(transport: str, interleave: bool) -> None:
    reply = ScriptedReply(
        "Computing.",
        tool_calls=(
            ScriptedToolCall("add", {"value": 12.5}, id="call_a"),
            ScriptedToolCall("multiply", {"value": 3}, id="call_b"),
            ScriptedToolCall("add", {}, id="call_c"),
        ),
    )
    async with open_fake_server([reply], interleave_tool_calls=interleave) as srv:
        actor, rec = await _call(replace(_actor(srv.base_url, transport), tools=(ADD, MUL)))
    starts = rec.of(ToolCallStart)
    assert [(s.content_index, s.tool_call_id, s.tool_name) for s in starts] == [
        (1, "call_a", "add"),
        (2, "call_b", "multiply"),
        (3, "call_c", "add"),
    ]
    deltas_a = [d for d in rec.of(ToolCallDelta) if d.tool_call_id == "call_a"]
    assert len(deltas_a) > 2 and "".join(d.delta for d in deltas_a) == '{"value": 12.5}'
    assert deltas_a[-1].partial_args == {"value": 12.5}
    assert any(d.partial_args == {} for d in deltas_a)  # partial parses arrive before the end
    expected = [
        ToolCall("call_a", "add", {"value": 12.5}, '{"value": 12.5}'),
        ToolCall("call_b", "multiply", {"value": 3}, '{"value": 3}'),
        ToolCall("call_c", "add", {}, "{}"),
    ]
    last_end = {e.content_index: e.tool_call for e in rec.of(ToolCallEnd)}
    assert [last_end[i] for i in (1, 2, 3)] == expected
    if not interleave:  # each call ends before the next starts: the shared event grammar
        tool_events = [e for e in rec.events if isinstance(e, ToolCallStart | ToolCallEnd)]
        assert [(type(e).__name__, e.content_index) for e in tool_events] == [
            ("ToolCallStart", 1), ("ToolCallEnd", 1), ("ToolCallStart", 2), ("ToolCallEnd", 2),
            ("ToolCallStart", 3), ("ToolCallEnd", 3),
        ]  # fmt: skip
        assert [e.tool_call for e in rec.of(ToolCallEnd)] == expected
        assert rec.events.index(rec.of(TextEnd)[0]) < rec.events.index(starts[0])
    msg = actor.trajectory.messages[-1]
    assert msg.text == "Computing."
    assert list(msg.get_tool_calls()) == expected
    assert rec.of(StreamDone)[0].finish_reason == "tool_use"
    tools = srv.last_request.json["tools"]
    assert [t["function"]["name"] for t in tools] == ["add", "multiply"]
    assert tools[0] == {
        "type": "function",
        "function": {"name": "add", "description": "Add a number.", "parameters": dict(ADD.parameters)},
    }


@TRANSPORTS
async def test_agent_run_sends_tool_results_and_malformed_json_becomes_error_result(transport: str) -> None:
    script = [
        ScriptedReply(
            tool_calls=(ScriptedToolCall("add", {"value": 2}, id="c1"), ScriptedToolCall("add", '{"value": 3', id="c2"))
        ),
        ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 3}, id="c3"),)),
        ScriptedReply("Done.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "5"}, id="c4"),)),
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint("openai", "gpt-4o", api_base=srv.base_url, api_key="k", transport=transport)
        msgs = (Message("system", "You are a calculator."), Message("user", "What is 2 + 3?"))
        state = AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        requests = srv.scripted_requests
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert final.environment is not None and final.environment.current_value == 5  # type: ignore[attr-defined]
    errors = rec.of(ToolCallError)
    assert [(e.tool_call_id, e.raw_arguments) for e in errors] == [("c2", '{"value": 3')]
    tool_msgs = [m for m in final.messages if m.role == "tool"]
    assert tool_msgs[0].content == "Added 2 to 0. Current value: 2"
    assert tool_msgs[1].tool_call_id == "c2" and "not valid JSON" in tool_msgs[1].text
    assert tool_msgs[1].details is not None and tool_msgs[1].details["is_error"] is True
    # The second request carries the assistant's tool calls (malformed ones verbatim) and both results.
    sent = requests[1].json["messages"]
    assert sent[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"value": 2}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"value": 3'}},
        ],
    }
    assert sent[3] == {"role": "tool", "tool_call_id": "c1", "content": "Added 2 to 0. Current value: 2"}
    assert sent[4]["role"] == "tool" and sent[4]["tool_call_id"] == "c2" and "not valid JSON" in sent[4]["content"]
    assert len(requests) == 3
    assert len(requests[2].json["messages"]) == 7


async def test_reasoning_models_get_reasoning_parameters_and_no_temperature() -> None:
    async with open_fake_server(["ok", "ok", "ok"]) as srv:
        await _call(_actor(srv.base_url, model="o3-mini", temperature=0.7, thinking={"effort": "high"}, max_tokens=500))
        await _call(_actor(srv.base_url, model="gpt-5", thinking={"budget_tokens": 1000}))
        await _call(_actor(srv.base_url, model="gpt-5-mini", extra_params={"reasoning_effort": "minimal", "seed": 7}))
        bodies = [r.json for r in srv.scripted_requests]
    assert bodies[0]["reasoning_effort"] == "high" and bodies[0]["max_completion_tokens"] == 500
    assert "temperature" not in bodies[0] and "max_tokens" not in bodies[0]
    assert bodies[1]["reasoning_effort"] == "low"
    assert bodies[2]["reasoning_effort"] == "minimal" and bodies[2]["seed"] == 7


@TRANSPORTS
async def test_images_and_unknown_extra_params_reach_the_server(transport: str) -> None:
    async with open_fake_server(["a cat"]) as srv:
        actor = _actor(srv.base_url, transport, extra_params={"top_k": 5, "api": "chat"})
        image_msg = Message("user", (TextContent("What is this?"), ImageContent("image/png", data="aGVsbG8=")))
        url_msg = Message("user", (ImageContent(url="https://example.com/x.png"),))
        actor = replace(actor, trajectory=actor.trajectory.append(image_msg, url_msg))
        await _call(actor)
        body = srv.last_request.json
    assert body["messages"][2]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
    ]
    assert body["messages"][3]["content"] == [{"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]
    assert body["top_k"] == 5 and "api" not in body


async def test_thinking_blocks_are_not_sent_back_and_reasoning_content_is_read() -> None:
    async with open_fake_server([ScriptedReply("4", thinking="2+2 is 4")]) as srv:
        actor, _ = await _call(_actor(srv.base_url))
        msg = actor.trajectory.messages[-1]
        assert msg.content == (ThinkingContent("2+2 is 4", provider="openai"), TextContent("4"))
    async with open_fake_server(["next"]) as srv:
        ep = replace(actor.endpoint, api_base=srv.base_url)
        await _call(replace(actor, endpoint=ep, trajectory=actor.trajectory.append(Message("user", "again"))))
        assert srv.last_request.json["messages"][2] == {"role": "assistant", "content": "4"}


async def test_both_transports_produce_equal_messages_and_events() -> None:
    reply = ScriptedReply(
        "Let me add. ",
        thinking="think",
        tool_calls=(ScriptedToolCall("add", {"value": 1}, id="x"), ScriptedToolCall("add", "{bad", id="y")),
    )
    results = {}
    for transport in ("sdk", "http"):
        async with open_fake_server([reply], chunk_size=3) as srv:
            actor, rec = await _call(replace(_actor(srv.base_url, transport), tools=(ADD,)))
        msg = actor.trajectory.messages[-1]
        results[transport] = (replace(msg, timestamp=None), rec.events)
    assert results["sdk"] == results["http"]
    assert len(results["sdk"][0].content) == 4
    assert isinstance(results["sdk"][0].content[3], ToolCallContent) and results["sdk"][0].content[3].parse_error


async def test_missing_openai_key_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with open_fake_server(["never"]) as srv:
        actor = _actor(srv.base_url)
        actor = replace(actor, endpoint=replace(actor.endpoint, api_key=""))
        with pytest.raises(AuthenticationError, match="OPENAI_API_KEY"):
            await _call(actor)
        assert srv.requests == []
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    async with open_fake_server(["yes"]) as srv:
        await _call(replace(actor, endpoint=replace(actor.endpoint, api_base=srv.base_url)))
        assert srv.last_request.headers["authorization"] == "Bearer sk-from-env"


def test_responses_routing_rule() -> None:
    assert not uses_responses_api(Endpoint("openai", "gpt-4o"))
    assert uses_responses_api(Endpoint("openai", "o3-pro"))
    assert uses_responses_api(Endpoint("openai", "gpt-4o", extra_params={"api": "responses"}))
    assert not uses_responses_api(Endpoint("openai", "o3-pro", extra_params={"api": "chat"}))


@TRANSPORTS
async def test_cancellation_mid_stream_closes_the_connection(transport: str) -> None:
    long = FakeTurn("word " * 400, event_delay=0.02)
    async with open_fake_server([long]) as srv:
        rec = Recorder()
        with trio.CancelScope() as scope:

            async def on_chunk(event: StreamEvent) -> None:
                rec.events.append(event)
                if isinstance(event, TextDelta) and len(rec.of(TextDelta)) == 3:
                    scope.cancel()

            fn = get_provider_function("openai", "gpt-4o-mini")
            await fn(_actor(srv.base_url, transport), on_chunk)
        assert scope.cancelled_caught
        # The rest of the stream would take ~10 s (500 events, 20 ms apart): idle within 1 s means the
        # connection was closed at once (the server notices on its next write, <= 20 ms later).
        with trio.fail_after(1):
            await srv.wait_idle()
        assert srv.completed_streams == 0
        assert len(rec.of(TextDelta)) == 3


@TRANSPORTS
async def test_cancellation_during_slow_first_byte(transport: str) -> None:
    async with open_fake_server([FakeTurn("late", first_byte_delay=0.5)]) as srv:
        rec = Recorder()
        fn = get_provider_function("openai", "gpt-4o-mini")
        with trio.move_on_after(0.05) as scope:
            await fn(_actor(srv.base_url, transport), rec)
        assert scope.cancelled_caught
        assert [type(e) for e in rec.events] == [LLMCallStart]
        with trio.fail_after(2):  # the server notices when it writes, after its 0.5 s delay
            await srv.wait_idle()
        assert srv.completed_streams == 0


def test_assistant_content_is_null_only_beside_tool_calls() -> None:
    from rollouts.providers._chat_format import chat_messages

    thinking_only = Message("assistant", (ThinkingContent("hmm"),))
    calls_only = Message("assistant", (ToolCallContent("c", "add", {"value": 1}),))
    assert chat_messages((thinking_only,), compat=False) == [{"role": "assistant", "content": ""}]
    assert chat_messages((calls_only,), compat=False)[0]["content"] is None
    assert chat_messages((calls_only,), compat=True)[0]["content"] == ""


@TRANSPORTS
async def test_same_event_sequence_as_the_scripted_reference_provider(transport: str) -> None:
    from rollouts.providers.scripted import ScriptedModel

    reply = ScriptedReply(
        "Let me compute that for you.",
        tool_calls=(
            ScriptedToolCall("add", {"value": 2}, id="t1"),
            ScriptedToolCall("multiply", '{"value": 3,', id="t2"),
            ScriptedToolCall("add", {"value": 4}, id="t3"),
        ),
        usage=Usage(input_tokens=11, output_tokens=7),
    )
    model = ScriptedModel([reply], chunk_size=5)
    reference = Recorder()
    fn = get_provider_function("scripted", model.name)
    ref_actor = Actor(Trajectory((Message("user", "q"),)), model.endpoint, tools=(ADD, MUL))
    await fn(ref_actor, reference)
    async with open_fake_server([reply], chunk_size=5) as srv:
        _, rec = await _call(replace(_actor(srv.base_url, transport), tools=(ADD, MUL)))
    ours = [replace(e, usage=replace(e.usage, cost_usd=0.0)) if isinstance(e, StreamDone) else e for e in rec.events]
    assert isinstance(rec.events[-1], StreamDone) and rec.events[-1].usage.cost_usd > 0  # priced; scripted is not
    assert ours[1:] == reference.events[1:]
    assert len(rec.events) > 20


@TRANSPORTS
async def test_interleaved_parallel_tool_call_deltas_follow_the_event_grammar(transport: str) -> None:
    """Issue 13 item 10: a server that interleaves the deltas of parallel calls gets no early end
    and no delta for an ended block; the calls stream one after the other."""
    from tests._provider_helpers import assert_event_grammar

    reply = ScriptedReply(
        "Computing.",
        tool_calls=(
            ScriptedToolCall("add", {"value": 12.5}, id="call_a"),
            ScriptedToolCall("multiply", {"value": 3}, id="call_b"),
            ScriptedToolCall("add", '{"value": 4', id="call_c"),  # never completes
            ScriptedToolCall("add", {"value": 5}, id="call_d"),
        ),
    )
    async with open_fake_server([reply], interleave_tool_calls=True) as srv:
        actor, rec = await _call(replace(_actor(srv.base_url, transport), tools=(ADD, MUL)))
    events = rec.events[1:]  # after LLMCallStart
    assert_event_grammar(events[1:])  # after StreamStart
    ends = [e for e in events if isinstance(e, ToolCallEnd | ToolCallError)]
    assert [e.content_index for e in ends] == [1, 2, 3, 4]  # each call ends once, in order
    for call_id, raw in [("call_a", '{"value": 12.5}'), ("call_b", '{"value": 3}'), ("call_d", '{"value": 5}')]:
        assert "".join(d.delta for d in rec.of(ToolCallDelta) if d.tool_call_id == call_id) == raw
    calls = actor.trajectory.messages[-1].get_tool_calls()
    assert [(c.id, dict(c.arguments)) for c in calls] == [
        ("call_a", {"value": 12.5}),
        ("call_b", {"value": 3}),
        ("call_c", {}),
        ("call_d", {"value": 5}),
    ]
    assert calls[2].parse_error is not None and calls[2].raw_arguments == '{"value": 4'
