"""The OpenAI Responses provider through the real `openai` SDK against the fake server's
Responses wire format: events, final Message, Usage and what the server received."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

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
    ToolCall,
    Trajectory,
    Usage,
)
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import AuthenticationError, ContextTooLongError, ProviderError
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
    ThinkingStart,
    ToolCallEnd,
    ToolCallError,
)
from rollouts.providers._retry import retry_policy
from rollouts.providers.openai_responses import ResponseFailed, classify_responses_error
from rollouts.run_config import RunConfig
from rollouts.testing import FakeTurn, ScriptedReply, ScriptedToolCall, http_error, open_fake_server
from tests._provider_helpers import Recorder, call


@pytest.fixture(autouse=True)
def _fast_backoff() -> Any:
    with retry_policy(base_delay=0.01, max_delay=0.05):
        yield


def _actor(
    url: str, model: str = "gpt-4.1", *messages: Message, provider: str = "openai-responses", **ep: Any
) -> Actor:
    endpoint = Endpoint(provider, model, api_base=url, api_key="sk-test", **ep)
    msgs = messages or (Message("system", "You are terse."), Message("user", "Say hello."))
    return Actor(Trajectory(msgs), endpoint)


async def test_text_reply_exact_events_usage_cost_and_request() -> None:
    usage = Usage(input_tokens=100, output_tokens=10, cache_read_tokens=400)
    async with open_fake_server([ScriptedReply("Hello there!", usage=usage)], chunk_size=5) as srv:
        actor, rec = await call(_actor(srv.base_url, temperature=0.3, max_tokens=55))
    expected = replace(usage, cost_usd=(100 * 2.0 + 10 * 8.0 + 400 * 0.5) / 1e6)
    assert rec.events == [
        LLMCallStart("openai-responses", "gpt-4.1"),
        StreamStart(attempt=1),
        TextStart(0),
        TextDelta(0, "Hello"),
        TextDelta(0, " ther"),
        TextDelta(0, "e!"),
        TextEnd(0, "Hello there!"),
        StreamDone("stop", expected),
    ]
    msg = actor.trajectory.messages[-1]
    assert (msg.content, msg.usage, msg.provider) == ((TextContent("Hello there!"),), expected, "openai-responses")
    req = srv.last_request
    assert req.path == "/v1/responses" and req.headers["authorization"] == "Bearer sk-test"
    body = req.json
    assert body["instructions"] == "You are terse."
    assert body["input"] == [{"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}]
    assert (body["stream"], body["store"], body["max_output_tokens"], body["temperature"]) == (True, False, 55, 0.3)
    assert "reasoning" not in body and "tools" not in body


async def test_calculator_agent_with_reasoning_summaries_sent_back_as_reasoning_items() -> None:
    script = [
        ScriptedReply(
            thinking="Start by adding 5.",
            tool_calls=(ScriptedToolCall("add", {"value": 5}, id="call_a"),),
            usage=Usage(input_tokens=50, output_tokens=30, reasoning_tokens=20),
        ),
        ScriptedReply(
            "Now finish.",
            tool_calls=(
                ScriptedToolCall("multiply", {"value": 3}, id="call_b"),
                ScriptedToolCall("complete_task", {"final_result": "15"}, id="call_c"),
            ),
        ),
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint(
            "openai-responses", "o4-mini", api_base=srv.base_url, api_key="k", thinking={"effort": "high"}
        )
        msgs = (Message("system", "You are a calculator."), Message("user", "Compute 5*3."))
        state = AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        reqs = [r.json for r in srv.scripted_requests]
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 15
    # the reasoning summary streamed as thinking events
    assert ThinkingStart(0) in rec.events and ThinkingDelta(0, "Star") in rec.events
    signature = '{"id":"rs_fake_0","encrypted_content":"enc_fake_0"}'
    assert ThinkingEnd(0, "Start by adding 5.", signature=signature) in rec.events
    assert ToolCallEnd(1, ToolCall("call_a|fc_fake_0_0", "add", {"value": 5}, '{"value": 5}')) in rec.events
    first = final.actor.trajectory.messages[2]
    assert first.usage is not None and (first.usage.reasoning_tokens, first.usage.output_tokens) == (20, 30)
    assert first.content[0] == ThinkingContent("Start by adding 5.", signature=signature, provider="openai-responses")
    for body in reqs:
        assert body["reasoning"] == {"effort": "high", "summary": "auto"} and "temperature" not in body
        assert body["include"] == ["reasoning.encrypted_content"] and body["store"] is False
        assert [t["name"] for t in body["tools"]][:2] == ["add", "subtract"]
    assert reqs[1]["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Compute 5*3."}]},
        {
            "type": "reasoning",
            "id": "rs_fake_0",
            "summary": [{"type": "summary_text", "text": "Start by adding 5."}],
            "encrypted_content": "enc_fake_0",
        },
        {"type": "function_call", "call_id": "call_a", "name": "add", "arguments": '{"value": 5}', "id": "fc_fake_0_0"},
        {"type": "function_call_output", "call_id": "call_a", "output": "Added 5 to 0. Current value: 5"},
    ]


async def test_openai_provider_routes_to_responses_and_its_reasoning_is_native() -> None:
    script: list[ScriptedReply | str] = [
        ScriptedReply(thinking="hmm", tool_calls=(ScriptedToolCall("add", {"value": 1}, id="c1"),)),
        "done",
    ]
    async with open_fake_server(script) as srv:
        actor = _actor(srv.base_url, "gpt-5-mini", provider="openai", extra_params={"api": "responses"})
        actor, _ = await call(actor)
        call_id = actor.trajectory.messages[-1].get_tool_calls()[0].id
        actor = replace(actor, trajectory=actor.trajectory.append(Message("tool", "1", tool_call_id=call_id)))
        actor, _ = await call(actor)
        assert [r.path for r in srv.scripted_requests] == ["/v1/responses", "/v1/responses"]
        second = srv.last_request.json
    assert actor.trajectory.messages[2].provider == "openai"
    assert second["input"][1]["type"] == "reasoning" and second["input"][1]["id"] == "rs_fake_0"
    assert "api" not in second


def test_developer_messages_images_and_malformed_call_request_shape() -> None:
    from rollouts.providers.openai_responses import build_responses_request

    msgs = (
        Message("system", "Be brief."),
        Message("user", (TextContent("Look:"), ImageContent("image/png", data="AAAA"))),
        Message("assistant", "A square."),
        Message("system", "One turn left."),
        Message("user", "Thanks"),
    )
    body = build_responses_request(Actor(Trajectory(msgs), Endpoint("openai-responses", "gpt-4.1")))
    assert body["instructions"] == "Be brief."
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look:"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "A square.", "annotations": []}],
        },
        {"role": "developer", "content": "One turn left."},
        {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
    ]


async def test_malformed_arguments_and_incomplete_response() -> None:
    script = [
        ScriptedReply(tool_calls=(ScriptedToolCall("add", '{"value": ', id="c1"),)),
        ScriptedReply("cut off", finish_reason="max_tokens"),
    ]
    async with open_fake_server(script) as srv:
        actor, rec = await call(_actor(srv.base_url))
        errors = rec.of(ToolCallError)
        assert (
            len(errors) == 1 and errors[0].raw_arguments == '{"value": ' and errors[0].tool_call_id == "c1|fc_fake_0_0"
        )
        actor, rec = await call(_actor(srv.base_url))
    assert rec.of(StreamDone)[0].finish_reason == "max_tokens"
    assert actor.trajectory.messages[-1].text == "cut off"


@pytest.mark.parametrize(
    "fault",
    [
        http_error(429, retry_after=0.05),
        http_error(500),
        http_error(503),
        http_error(529),
        FakeTurn(close_without_response=True),
        FakeTurn("The quick brown fox.", drop_after=5),
        FakeTurn("The quick brown fox.", truncate_after=5),
        FakeTurn("The quick brown fox.", end_after=5),
    ],
    ids=["429", "500", "503", "529", "no-response", "drop", "truncate", "end-early"],
)
async def test_transient_faults_are_retried_without_duplicated_text(fault: FakeTurn) -> None:
    text = "The quick brown fox."
    async with open_fake_server([fault, text]) as srv:
        actor, rec = await call(_actor(srv.base_url))
        assert len(srv.scripted_requests) == 2
    assert actor.trajectory.messages[-1].content == (TextContent(text),)
    err_at = rec.kinds().index("StreamError")
    assert rec.events[err_at].will_retry  # type: ignore[union-attr]
    assert "".join(e.delta for e in rec.events[err_at:] if isinstance(e, TextDelta)) == text
    assert actor.trajectory.completions[-1].attempts == 2


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        (http_error(401, message="Incorrect API key provided"), AuthenticationError),
        (
            http_error(400, message="Your input exceeds the context window", code="context_length_exceeded"),
            ContextTooLongError,
        ),
        (http_error(400, message="Invalid value for 'input'"), ProviderError),
    ],
    ids=["auth", "context", "bad-request"],
)
async def test_client_errors_raise_named_exceptions_without_retrying(turn: FakeTurn, error: type) -> None:
    async with open_fake_server([turn, "never"]) as srv:
        rec = Recorder()
        with pytest.raises(error) as info:
            await call(_actor(srv.base_url), rec)
        assert len(srv.scripted_requests) == 1
    assert type(info.value) is error
    assert rec.of(StreamError) == [StreamError(str(info.value), will_retry=False, attempt=1)]


def test_failed_response_events_are_classified() -> None:
    context = classify_responses_error(ResponseFailed("context_length_exceeded", "too long"), "p")
    assert context is not None and isinstance(context.error, ContextTooLongError)
    server = classify_responses_error(ResponseFailed("server_error", "boom"), "p")
    assert server is not None and server.error.retryable
    invalid = classify_responses_error(ResponseFailed("invalid_prompt", "no"), "p")
    assert invalid is not None and not invalid.error.retryable


async def test_missing_key_is_an_authentication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    actor = Actor(Trajectory((Message("user", "hi"),)), Endpoint("openai-responses", "gpt-4.1"))
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY"):
        await call(actor)


def test_reasoning_without_encrypted_content_is_not_replayed_and_call_ids_follow() -> None:
    from rollouts.dtypes import ToolCallContent
    from rollouts.providers.openai_responses import build_responses_request

    def history(signature: str) -> tuple[Message, ...]:
        return (
            Message("user", "go"),
            Message(
                "assistant",
                (
                    ThinkingContent("plan", signature=signature, provider="openai-responses"),
                    ToolCallContent("call_1|fc_1", "add", {"value": 1}),
                ),
                provider="openai-responses",
            ),
            Message("tool", "1", tool_call_id="call_1|fc_1"),
        )

    ep = Endpoint("openai-responses", "o4-mini")
    stored = build_responses_request(Actor(Trajectory(history('{"id":"rs_1","encrypted_content":null}')), ep))
    assert [i.get("type") for i in stored["input"]] == [None, "function_call", "function_call_output"]
    assert "id" not in stored["input"][1] and stored["input"][1]["call_id"] == "call_1"
    full = build_responses_request(Actor(Trajectory(history('{"id":"rs_1","encrypted_content":"E"}')), ep))
    assert full["input"][1] == {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "plan"}],
        "encrypted_content": "E",
    }
    assert full["input"][2]["id"] == "fc_1"


async def test_cancellation_mid_stream_closes_the_connection() -> None:
    import trio

    async with open_fake_server([FakeTurn("word " * 400, event_delay=0.02)]) as srv:
        rec = Recorder()
        with trio.CancelScope() as scope:

            async def on_chunk(event: Any) -> None:
                await rec(event)
                if isinstance(event, TextDelta) and len(rec.of(TextDelta)) == 3:
                    scope.cancel()

            await call(_actor(srv.base_url), on_chunk)  # type: ignore[arg-type]
        assert scope.cancelled_caught
        # The rest of the stream would take ~10 s (500 events, 20 ms apart): idle within 1 s means the
        # connection was closed at once (the server notices on its next write, <= 20 ms later).
        with trio.fail_after(1):
            await srv.wait_idle()
        assert srv.completed_streams == 0
    assert len(rec.of(TextDelta)) == 3
