"""The Anthropic provider through the real `anthropic` SDK against the fake server's Anthropic
wire format: events, final Message, Usage (cache tokens, cost) and what the server received."""

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
from rollouts.errors import AuthenticationError, ConfigurationError, ContextTooLongError, ProviderError, RateLimitError
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamError,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingSignature,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
)
from rollouts.providers._pricing import cost_usd
from rollouts.providers._retry import retry_policy
from rollouts.providers.anthropic import build_anthropic_request
from rollouts.run_config import RunConfig
from rollouts.testing import FakeTurn, ScriptedReply, ScriptedToolCall, http_error, open_fake_server
from rollouts.testing.fake_server.anthropic_format import AnthropicReply
from tests._provider_helpers import Recorder, call

MODEL = "claude-haiku-4-5"  # $1 / $5 per million, cache read $0.10, cache write $1.25
ADD = Tool("add", "Add a number.", {"type": "object", "properties": {"value": {"type": "number"}}})


@pytest.fixture(autouse=True)
def _fast_backoff() -> Any:
    with retry_policy(base_delay=0.01, max_delay=0.05):
        yield


def _actor(url: str, *messages: Message, tools: tuple[Tool, ...] = (), **ep: Any) -> Actor:
    endpoint = Endpoint("anthropic", MODEL, api_base=url, api_key="sk-ant-test", **ep)
    msgs = messages or (Message("system", "You are terse."), Message("user", "Say hello."))
    return Actor(Trajectory(msgs), endpoint, tools)


async def test_text_reply_exact_events_usage_with_cache_and_cost_and_request() -> None:
    usage = Usage(input_tokens=30, output_tokens=4, cache_read_tokens=1000, cache_write_tokens=200)
    async with open_fake_server([ScriptedReply("Hello there!", usage=usage)], chunk_size=5) as srv:
        actor, rec = await call(_actor(srv.url, temperature=0.2, max_tokens=77))
    expected_usage = replace(usage, cost_usd=(30 * 1 + 4 * 5 + 1000 * 0.1 + 200 * 1.25) / 1e6)
    assert rec.events == [
        LLMCallStart("anthropic", MODEL),
        StreamStart(attempt=1),
        TextStart(0),
        TextDelta(0, "Hello"),
        TextDelta(0, " ther"),
        TextDelta(0, "e!"),
        TextEnd(0, "Hello there!"),
        StreamDone("stop", expected_usage),
    ]
    msg = actor.trajectory.messages[-1]
    assert (msg.content, msg.provider, msg.model, msg.usage) == (
        (TextContent("Hello there!"),),
        "anthropic",
        MODEL,
        expected_usage,
    )
    assert (
        msg.usage is not None and msg.usage.cost_usd == pytest.approx(cost_usd(usage, MODEL)) and msg.usage.cost_usd > 0
    )
    comp = actor.trajectory.completions[-1]
    assert (comp.finish_reason, comp.attempts, comp.message_index) == ("stop", 1, 2)
    req = srv.last_request
    assert req.path == "/v1/messages"
    assert req.headers["authorization"] == "Bearer sk-ant-test" and "anthropic-version" in req.headers
    body = req.json
    assert body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}]}
    ]
    assert (body["model"], body["max_tokens"], body["stream"], body["temperature"]) == (MODEL, 77, True, 0.2)
    assert "tools" not in body and "thinking" not in body


async def test_calculator_agent_thinking_signatures_redacted_thinking_and_tool_results_go_back() -> None:
    script = [
        ScriptedReply(thinking="I should add 5.", tool_calls=(ScriptedToolCall("add", {"value": 5}, id="toolu_a"),)),
        AnthropicReply(
            redacted_thinking=("opaque-redacted-data",),
            thinking="Now divide and multiply.",
            signature="sig-second",
            tool_calls=(
                ScriptedToolCall("divide", {"value": 0}, id="toolu_b"),
                ScriptedToolCall("multiply", {"value": 3}, id="toolu_c"),
            ),
        ),
        ScriptedReply("Done.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "15"}, id="toolu_d"),)),
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint("anthropic", MODEL, api_base=srv.url, api_key="k", thinking={"budget_tokens": 2048})
        msgs = (Message("system", "You are a calculator."), Message("user", "Compute (0+5)/0*3."))
        state = AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        reqs = [r.json for r in srv.scripted_requests]
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 15
    assert len(reqs) == 3
    # every request: system prompt, tools with the last one cached, thinking on, no temperature
    for body in reqs:
        assert body["system"][0]["text"] == "You are a calculator."
        assert [t["name"] for t in body["tools"]] == ["add", "subtract", "multiply", "divide", "complete_task"]
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048} and "temperature" not in body
    # turn 2 got turn 1's thinking back verbatim, with its signature, and the tool result
    m = reqs[1]["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "user"]
    assert m[1]["content"] == [
        {"type": "thinking", "thinking": "I should add 5.", "signature": "sig_fake_0"},
        {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"value": 5}},
    ]
    assert m[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": "Added 5 to 0. Current value: 5",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    # turn 3: redacted thinking kept, two results merged into one user message, is_error set
    m = reqs[2]["messages"]
    assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant", "user"]
    assert m[3]["content"][:2] == [
        {"type": "redacted_thinking", "data": "opaque-redacted-data"},
        {"type": "thinking", "thinking": "Now divide and multiply.", "signature": "sig-second"},
    ]
    results = m[4]["content"]
    assert [(r["tool_use_id"], r.get("is_error", False)) for r in results] == [("toolu_b", True), ("toolu_c", False)]
    assert "divide by zero" in results[0]["content"]
    assert "cache_control" in results[1] and "cache_control" not in results[0]
    # the stored trajectory keeps thinking blocks with their origin
    second = final.actor.trajectory.messages[4]
    assert second.content[:2] == (
        ThinkingContent("", redacted=True, data="opaque-redacted-data", provider="anthropic"),
        ThinkingContent("Now divide and multiply.", signature="sig-second", provider="anthropic"),
    )
    # events of the first call: thinking with its signature, then the streamed tool call
    first_call = rec.events[: rec.events.index(rec.of(StreamDone)[0]) + 1]
    kinds = [type(e) for e in first_call]
    assert kinds[:3] == [LLMCallStart, StreamStart, ThinkingStart]
    assert ThinkingSignature(0, "sig_fake_0") in first_call
    assert ThinkingEnd(0, "I should add 5.", signature="sig_fake_0") in first_call
    deltas = [e for e in first_call if isinstance(e, ToolCallDelta)]
    assert "".join(d.delta for d in deltas) == '{"value": 5}' and deltas[-1].partial_args == {"value": 5}
    assert ToolCallEnd(1, ToolCall("toolu_a", "add", {"value": 5}, '{"value": 5}')) in first_call
    assert ThinkingStart(0, redacted=True) in rec.events


async def test_malformed_tool_json_is_a_tool_call_error_answered_with_an_error_result() -> None:
    script = [
        ScriptedReply(tool_calls=(ScriptedToolCall("add", '{"value": 5,,', id="toolu_bad"),)),
        ScriptedReply(tool_calls=(ScriptedToolCall("complete_task", {"final_result": "0"}, id="toolu_ok"),)),
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint("anthropic", MODEL, api_base=srv.url, api_key="k")
        state = AgentState(
            Actor(Trajectory((Message("user", "add 5"),)), endpoint), environment=CalculatorEnvironment()
        )
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        second = srv.scripted_requests[1].json
    errors = rec.of(ToolCallError)
    assert len(errors) == 1 and errors[0].raw_arguments == '{"value": 5,,' and errors[0].tool_name == "add"
    call_block = states[-1].actor.trajectory.messages[1].content[0]
    assert isinstance(call_block, ToolCallContent) and call_block.parse_error is not None
    # the unparseable call goes back as an (empty) tool_use and its error result
    assert second["messages"][1]["content"] == [{"type": "tool_use", "id": "toolu_bad", "name": "add", "input": {}}]
    result = second["messages"][2]["content"][0]
    assert result["is_error"] is True and "not valid JSON" in result["content"]
    assert states[-1].stop == StopReason.TASK_COMPLETED


def test_images_mid_conversation_system_messages_and_same_role_merging() -> None:
    msgs = (
        Message("system", "Be precise."),
        Message("user", (TextContent("What is this?"), ImageContent("image/png", data="iVBORw0KGgo="))),
        Message("user", (ImageContent("image/jpeg", url="https://example.com/cat.jpg"),)),
        Message("assistant", "A cat."),
        Message("system", "Two turns left."),
        Message("user", "Thanks"),
    )
    body = build_anthropic_request(Actor(Trajectory(msgs), Endpoint("anthropic", MODEL)))
    assert body["system"] == [{"type": "text", "text": "Be precise.", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Two turns left."},
                {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]


def test_prompt_caching_can_be_turned_off_and_extra_params_pass_through() -> None:
    ep = Endpoint("anthropic", MODEL, extra_params={"prompt_caching": False, "top_k": 5, "metadata": {"user_id": "u"}})
    body = build_anthropic_request(Actor(Trajectory((Message("system", "s"), Message("user", "u"))), ep, (ADD,)))
    assert "cache_control" not in str(body)
    assert body["top_k"] == 5 and body["metadata"] == {"user_id": "u"} and "prompt_caching" not in body


def test_thinking_configuration_errors_name_the_fix() -> None:
    actor = Actor(
        Trajectory((Message("user", "u"),)),
        Endpoint("anthropic", MODEL, max_tokens=2000, thinking={"budget_tokens": 4000}),
    )
    with pytest.raises(ConfigurationError, match="raise max_tokens"):
        build_anthropic_request(actor)
    actor = replace(actor, endpoint=Endpoint("anthropic", MODEL, thinking={"effort": "high"}))
    with pytest.raises(ConfigurationError, match="budget_tokens"):
        build_anthropic_request(actor)
    actor = replace(actor, endpoint=Endpoint("anthropic", MODEL, thinking={"type": "adaptive"}))
    assert build_anthropic_request(actor)["thinking"] == {"type": "adaptive"}


async def test_429_with_retry_after_then_success() -> None:
    async with open_fake_server([http_error(429, retry_after=0.05), "ok"]) as srv:
        actor, rec = await call(_actor(srv.url))
        assert len(srv.scripted_requests) == 2
    assert actor.trajectory.messages[-1].text == "ok"
    assert actor.trajectory.completions[-1].attempts == 2
    err = rec.of(StreamError)
    assert len(err) == 1 and err[0].will_retry and "429" in err[0].error


@pytest.mark.parametrize(
    "fault",
    [
        http_error(529, message="Overloaded"),
        http_error(503),
        FakeTurn(AnthropicReply("The quick brown fox.", error_after=6)),  # overloaded_error event mid-stream
        FakeTurn("The quick brown fox.", drop_after=6),
        FakeTurn("The quick brown fox.", truncate_after=6),
        FakeTurn("The quick brown fox.", end_after=6),
    ],
    ids=["529", "503", "error-event", "drop", "truncate", "end-early"],
)
async def test_overload_and_broken_streams_are_retried_without_duplicated_text(fault: FakeTurn) -> None:
    text = "The quick brown fox."
    async with open_fake_server([fault, text], chunk_size=4) as srv:
        actor, rec = await call(_actor(srv.url))
        assert len(srv.scripted_requests) == 2
    msg = actor.trajectory.messages[-1]
    assert msg.content == (TextContent(text),)
    kinds = rec.kinds()
    err_at = kinds.index("StreamError")
    assert rec.events[err_at].will_retry  # type: ignore[union-attr]
    after = "".join(e.delta for e in rec.events[err_at:] if isinstance(e, TextDelta))
    assert after == text and kinds[err_at + 1] == "StreamStart"
    assert ("TextDelta" in kinds[:err_at]) == (fault.status == 200)  # broken streams had emitted output
    assert actor.trajectory.completions[-1].attempts == 2


async def test_persistent_rate_limit_gives_up_after_max_retries() -> None:
    async with open_fake_server([http_error(429)] * 3) as srv:
        with pytest.raises(RateLimitError) as info:
            await call(_actor(srv.url, max_retries=2))
        assert len(srv.scripted_requests) == 3
    assert info.value.retryable and info.value.status_code == 429


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        (http_error(401, message="invalid x-api-key"), AuthenticationError),
        (http_error(400, message="prompt is too long: 210000 tokens > 200000 maximum"), ContextTooLongError),
        (http_error(400, message="messages: roles must alternate"), ProviderError),
    ],
    ids=["auth", "context", "bad-request"],
)
async def test_client_errors_raise_named_exceptions_without_retrying(turn: FakeTurn, error: type) -> None:
    async with open_fake_server([turn, "never"]) as srv:
        with pytest.raises(error) as info:
            await call(_actor(srv.url))
        assert len(srv.scripted_requests) == 1
    assert type(info.value) is error and isinstance(info.value, ProviderError) and not info.value.retryable


async def test_missing_key_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    actor = Actor(Trajectory((Message("user", "hi"),)), Endpoint("anthropic", MODEL, api_base="http://127.0.0.1:9"))
    with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY"):
        await call(actor)


async def test_cancellation_mid_stream_closes_the_connection() -> None:
    async with open_fake_server([FakeTurn("word " * 400, event_delay=0.02)]) as srv:
        rec = Recorder()
        with trio.CancelScope() as scope:

            async def on_chunk(event: Any) -> None:
                await rec(event)
                if isinstance(event, TextDelta) and len(rec.of(TextDelta)) == 3:
                    scope.cancel()

            await call(_actor(srv.url), on_chunk)  # type: ignore[arg-type]
        assert scope.cancelled_caught
        # The rest of the stream would take ~10 s (500 events, 20 ms apart): idle within 1 s means the
        # connection was closed at once (the server notices on its next write, <= 20 ms later).
        with trio.fail_after(1):
            await srv.wait_idle()
        assert srv.completed_streams == 0
    assert len(rec.of(TextDelta)) == 3 and not rec.of(ThinkingDelta)


async def test_client_is_reused_inside_a_client_scope() -> None:
    from rollouts.providers._clients import client_scope

    async with open_fake_server(["a", "b", "c"]) as srv:
        async with client_scope():
            for _ in range(3):
                await call(_actor(srv.url))
        assert srv.connections_opened == 1


def test_thinking_is_left_off_while_finishing_a_tool_loop_another_provider_started() -> None:
    ep = Endpoint("anthropic", MODEL, thinking={"budget_tokens": 2048})
    foreign = (
        Message("user", "go"),
        Message("assistant", (ToolCallContent("call_1", "add", {"value": 1}),), provider="openai"),
        Message("tool", "1", tool_call_id="call_1"),
    )
    assert "thinking" not in build_anthropic_request(Actor(Trajectory(foreign), ep))
    native = (
        Message("user", "go"),
        Message(
            "assistant",
            (ThinkingContent("t", signature="s", provider="anthropic"), ToolCallContent("call_1", "add", {"value": 1})),
            provider="anthropic",
        ),
        Message("tool", "1", tool_call_id="call_1"),
    )
    assert build_anthropic_request(Actor(Trajectory(native), ep))["thinking"]["budget_tokens"] == 2048
    new_question = (*foreign, Message("assistant", "1"), Message("user", "again"))
    assert "thinking" in build_anthropic_request(Actor(Trajectory(new_question), ep))


async def test_server_tool_blocks_are_skipped_and_indices_kept() -> None:
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    from rollouts.providers.anthropic import AnthropicStreamTranslator

    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    raw = [
        {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "model": "x", "content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"query": "x"}'}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Found it."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]  # fmt: skip
    rec = Recorder()
    translator = AnthropicStreamTranslator(rec)
    for event in raw:
        await translator.feed(adapter.validate_python(event))
    await translator.finish("unpriced-model")
    assert rec.events == [
        TextStart(1),
        TextDelta(1, "Found it."),
        TextEnd(1, "Found it."),
        StreamDone("stop", Usage(input_tokens=3, output_tokens=5)),
    ]


async def test_an_openai_style_base_url_with_v1_works_too() -> None:
    async with open_fake_server(["hi"]) as srv:
        actor, _ = await call(_actor(srv.base_url))  # http://127.0.0.1:<port>/v1
        assert srv.last_request.path == "/v1/messages"
    assert actor.trajectory.messages[-1].text == "hi"


async def test_token_and_cost_budgets_stop_on_the_usage_the_api_reported() -> None:
    from rollouts.handlers import handle_stop_cost_budget, handle_stop_token_budget

    per_call = Usage(input_tokens=100, output_tokens=20, cache_read_tokens=500)  # 620 tokens, $0.00025
    turn = ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 1}),), usage=per_call)
    for handler, calls in [(handle_stop_token_budget(1000), 2), (handle_stop_cost_budget(0.0006), 3)]:
        async with open_fake_server([turn] * 5) as srv:
            endpoint = Endpoint("anthropic", MODEL, api_base=srv.url, api_key="k")
            state = AgentState(
                Actor(Trajectory((Message("user", "go"),)), endpoint), environment=CalculatorEnvironment()
            )
            states = await run_agent(state, RunConfig(handle_stop=handler))
            assert len(srv.scripted_requests) == calls
        final = states[-1]
        assert final.stop == StopReason.BUDGET_EXCEEDED
        total = final.actor.trajectory.total_usage()
        assert (total.input_tokens, total.cache_read_tokens, total.total_tokens) == (
            100 * calls,
            500 * calls,
            620 * calls,
        )
        assert total.cost_usd == pytest.approx(calls * cost_usd(per_call, MODEL))


async def test_images_reach_the_server_through_the_sdk() -> None:
    msgs = (
        Message("system", "Describe images."),
        Message("user", (TextContent("What is this?"), ImageContent("image/png", data="iVBORw0KGgo="))),
    )
    async with open_fake_server(["A pixel."]) as srv:
        actor, _ = await call(_actor(srv.url, *msgs))
        content = srv.last_request.json["messages"][0]["content"]
    assert content[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
        "cache_control": {"type": "ephemeral"},
    }
    assert actor.trajectory.messages[-1].text == "A pixel."


async def test_resume_after_a_mid_stream_abort_with_thinking_sends_no_trailing_prefill(tmp_path: Any) -> None:
    """Issue 13 item 9: the partial reply of a cancelled run (thinking + cut-off text) is not sent
    back as a trailing assistant prefill, which Anthropic rejects with extended thinking on."""
    from rollouts.store import FileSessionStore
    from rollouts.store.resume import resume_session

    endpoint = Endpoint("anthropic", MODEL, api_key="k", thinking={"budget_tokens": 2048})
    first = ScriptedReply("The answer is forty-two, for reasons. " * 20, thinking="Let me think it over.")
    async with open_fake_server([FakeTurn(first, event_delay=0.01), "Forty-two."]) as srv:
        endpoint = replace(endpoint, api_base=srv.url)
        store = FileSessionStore(tmp_path)
        cs = trio.CancelScope()

        async def on_chunk(event: Any) -> None:
            if isinstance(event, TextDelta):
                cs.cancel()

        start = AgentState(actor=Actor(Trajectory((Message("user", "What is the answer?"),)), endpoint))
        aborted = (await run_agent(start, RunConfig(on_chunk=on_chunk, cancel_scope=cs, session_store=store)))[-1]
        partial = aborted.messages[-1]
        assert aborted.stop == StopReason.ABORTED and partial.details == {"aborted": True}
        assert partial.text and any(isinstance(b, ThinkingContent) for b in partial.blocks)

        assert aborted.session_id is not None
        state = await resume_session(store, aborted.session_id, api_key="k")
        final = (await run_agent(state, RunConfig(session_store=store, max_turns=1)))[-1]
        body = srv.last_request.json
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert [m["role"] for m in body["messages"]] == ["user"]  # no trailing assistant message
    assert partial.text not in str(body)
    assert final.messages[-1].text == "Forty-two." and final.messages[-2] == partial  # the record keeps it
