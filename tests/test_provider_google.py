"""The Google provider through the real `google-genai` SDK (on its own httpx2 client, under trio)
against the fake server's Gemini wire format: events, final Message, Usage and requests."""

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
    ToolCallContent,
    Trajectory,
    Usage,
)
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import AuthenticationError, ContextTooLongError, ProviderError
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from rollouts.providers._retry import retry_policy
from rollouts.providers.google import build_google_request
from rollouts.run_config import RunConfig
from rollouts.testing import FakeTurn, ScriptedReply, ScriptedToolCall, http_error, open_fake_server
from rollouts.testing.fake_server.gemini_format import signature_for
from tests._provider_helpers import Recorder, call

MODEL = "gemini-2.5-flash"  # $0.30 / $2.50 per million, cached input $0.03


@pytest.fixture(autouse=True)
def _fast_backoff() -> Any:
    with retry_policy(base_delay=0.01, max_delay=0.05):
        yield


def _actor(url: str, *messages: Message, **ep: Any) -> Actor:
    endpoint = Endpoint("google", MODEL, api_base=url, api_key="g-test", **ep)
    msgs = messages or (Message("system", "You are terse."), Message("user", "Say hello."))
    return Actor(Trajectory(msgs), endpoint)


async def test_text_reply_exact_events_usage_cost_and_request() -> None:
    usage = Usage(input_tokens=100, output_tokens=10, cache_read_tokens=1000)
    async with open_fake_server([ScriptedReply("Hello there!", usage=usage)], chunk_size=5) as srv:
        actor, rec = await call(_actor(srv.url, temperature=0.4, max_tokens=66))
    expected = replace(usage, cost_usd=(100 * 0.30 + 10 * 2.50 + 1000 * 0.03) / 1e6)
    assert rec.events == [
        LLMCallStart("google", MODEL),
        StreamStart(attempt=1),
        TextStart(0),
        TextDelta(0, "Hello"),
        TextDelta(0, " ther"),
        TextDelta(0, "e!"),
        TextEnd(0, "Hello there!"),
        StreamDone("stop", expected),
    ]
    msg = actor.trajectory.messages[-1]
    assert (msg.content, msg.usage, msg.provider, msg.model) == (
        (TextContent("Hello there!"),),
        expected,
        "google",
        MODEL,
    )
    req = srv.last_request
    assert req.path == f"/v1/models/{MODEL}:streamGenerateContent" and req.query == {"alt": "sse"}
    assert req.headers["x-goog-api-key"] == "g-test"
    body = req.json
    assert body["systemInstruction"]["parts"] == [{"text": "You are terse."}]
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Say hello."}]}]
    assert body["generationConfig"] == {"maxOutputTokens": 66, "temperature": 0.4}
    assert "tools" not in body


async def test_calculator_agent_thoughts_signatures_and_function_responses() -> None:
    script = [
        ScriptedReply(
            thinking="Add five first.",
            tool_calls=(ScriptedToolCall("add", {"value": 5}),),
            usage=Usage(input_tokens=40, output_tokens=25, reasoning_tokens=15),
        ),
        ScriptedReply(
            tool_calls=(ScriptedToolCall("divide", {"value": 0}), ScriptedToolCall("multiply", {"value": 3}))
        ),
        ScriptedReply("Done: 15", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "15"}),)),
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint("google", MODEL, api_base=srv.url, api_key="k", thinking={"budget_tokens": 1024})
        msgs = (Message("system", "You are a calculator."), Message("user", "Compute (0+5)/0*3."))
        state = AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())
        rec = Recorder()
        states = await run_agent(state, RunConfig(on_chunk=rec))
        reqs = [r.json for r in srv.scripted_requests]
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value == 15
    # first call: thought parts stream as thinking, the signature rides on the function call
    first = rec.events[: rec.events.index(rec.of(StreamDone)[0]) + 1]
    kinds = [type(e) for e in first]
    assert kinds == [
        LLMCallStart,
        StreamStart,
        ThinkingStart,
        ThinkingDelta,
        ThinkingDelta,
        ThinkingDelta,
        ThinkingDelta,
        ThinkingEnd,
        ThinkingStart,
        ThinkingEnd,
        ToolCallStart,
        ToolCallDelta,
        ToolCallEnd,
        StreamDone,
    ]
    assert first[7] == ThinkingEnd(0, "Add five first.")
    assert first[9] == ThinkingEnd(1, "", signature=signature_for(0))
    assert first[-1] == StreamDone("tool_use", Usage(40, 25, reasoning_tokens=15, cost_usd=(40 * 0.3 + 25 * 2.5) / 1e6))
    stored = final.actor.trajectory.messages[2]
    assert stored.content[0] == ThinkingContent("Add five first.", provider="google")
    call_block = stored.content[2]
    assert isinstance(call_block, ToolCallContent) and call_block.arguments == {"value": 5}
    for body in reqs:
        assert body["systemInstruction"]["parts"] == [{"text": "You are a calculator."}]
        # (google-genai 3.x sends nested config fields in snake_case, which the API accepts)
        assert body["generationConfig"]["thinkingConfig"] == {"include_thoughts": True, "thinking_budget": 1024}
        names = [d["name"] for d in body["tools"][0]["functionDeclarations"]]
        assert names == ["add", "subtract", "multiply", "divide", "complete_task"]
    # second request: the thought text is not sent back, its signature is, on the call part
    assert reqs[1]["contents"] == [
        {"role": "user", "parts": [{"text": "Compute (0+5)/0*3."}]},
        {
            "role": "model",
            "parts": [{"functionCall": {"name": "add", "args": {"value": 5}}, "thoughtSignature": signature_for(0)}],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "add", "response": {"output": "Added 5 to 0. Current value: 5"}}}],
        },
    ]
    # third request: two parallel calls, their two responses merged into one user content
    assert reqs[2]["contents"][3]["parts"] == [
        {"functionCall": {"name": "divide", "args": {"value": 0}}},
        {"functionCall": {"name": "multiply", "args": {"value": 3}}},
    ]
    responses = reqs[2]["contents"][4]["parts"]
    assert [p["functionResponse"]["name"] for p in responses] == ["divide", "multiply"]
    assert "divide by zero" in responses[0]["functionResponse"]["response"]["error"]
    assert responses[1]["functionResponse"]["response"] == {"output": "Multiplied 5 by 3. Current value: 15"}


def test_images_and_mid_conversation_system_messages() -> None:
    msgs = (
        Message("system", "Be brief."),
        Message("user", (TextContent("Look:"), ImageContent("image/png", data="AAAA"))),
        Message("user", (ImageContent("image/jpeg", url="gs://bucket/cat.jpg"),)),
        Message("assistant", "A square."),
        Message("system", "One turn left."),
    )
    req = build_google_request(Actor(Trajectory(msgs), Endpoint("google", MODEL, extra_params={"seed": 7})))
    assert req["config"]["system_instruction"] == "Be brief." and req["config"]["seed"] == 7
    assert req["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "Look:"},
                {"inline_data": {"mime_type": "image/png", "data": b"\x00\x00\x00"}},
                {"file_data": {"file_uri": "gs://bucket/cat.jpg", "mime_type": "image/jpeg"}},
            ],
        },
        {"role": "model", "parts": [{"text": "A square."}]},
        {"role": "user", "parts": [{"text": "One turn left."}]},
    ]


async def test_inline_image_reaches_the_server_base64_encoded() -> None:
    msgs = (Message("user", (TextContent("Look:"), ImageContent("image/png", data="AAAA"))),)
    async with open_fake_server(["A square."]) as srv:
        await call(_actor(srv.url, *msgs))
        parts = srv.last_request.json["contents"][0]["parts"]
    assert parts[1] == {"inlineData": {"mime_type": "image/png", "data": "AAAA"}}


@pytest.mark.parametrize(
    "fault",
    [
        http_error(429, retry_after=0.05),
        http_error(503),
        http_error(500),
        http_error(529),
        FakeTurn(close_without_response=True),
        FakeTurn("The quick brown fox.", drop_after=2),
        FakeTurn("The quick brown fox.", truncate_after=2),
        FakeTurn("The quick brown fox.", end_after=2),
    ],
    ids=["429", "503", "500", "529", "no-response", "drop", "truncate", "end-early"],
)
async def test_transient_faults_are_retried_without_duplicated_text(fault: FakeTurn) -> None:
    text = "The quick brown fox."
    async with open_fake_server([fault, text]) as srv:
        actor, rec = await call(_actor(srv.url))
        assert len(srv.scripted_requests) == 2
    assert actor.trajectory.messages[-1].content == (TextContent(text),)
    err_at = rec.kinds().index("StreamError")
    assert rec.events[err_at].will_retry  # type: ignore[union-attr]
    assert ("TextDelta" in rec.kinds()[:err_at]) == (fault.reply is not None)  # broken streams had emitted output
    assert "".join(e.delta for e in rec.events[err_at:] if isinstance(e, TextDelta)) == text
    assert actor.trajectory.completions[-1].attempts == 2


@pytest.mark.parametrize(
    ("turn", "error"),
    [
        (http_error(401, message="API key not valid. Please pass a valid API key."), AuthenticationError),
        (
            http_error(
                400, message="The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
            ),
            ContextTooLongError,
        ),
        (http_error(400, message="Invalid JSON payload received."), ProviderError),
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
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    actor = Actor(Trajectory((Message("user", "hi"),)), Endpoint("google", MODEL, api_base="http://127.0.0.1:9"))
    with pytest.raises(AuthenticationError, match="GEMINI_API_KEY"):
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
    assert len(rec.of(TextDelta)) == 3


async def test_client_is_reused_inside_a_client_scope() -> None:
    from rollouts.providers._clients import client_scope

    async with open_fake_server(["a", "b", "c"]) as srv:
        async with client_scope():
            for _ in range(3):
                await call(_actor(srv.url))
        assert srv.connections_opened == 1


async def test_api_version_in_the_base_url_is_used() -> None:
    async with open_fake_server(["hi", "again"]) as srv:
        actor, _ = await call(_actor(srv.url + "/v1beta"))
        assert srv.last_request.path == f"/v1beta/models/{MODEL}:streamGenerateContent"
        await call(_actor(srv.url + "/"))
        assert srv.last_request.path == f"/v1/models/{MODEL}:streamGenerateContent"
    assert actor.trajectory.messages[-1].text == "hi"


@pytest.mark.parametrize("status", [500, 429])
async def test_failed_attempts_emit_no_stream_start_before_the_status_is_known(status: int) -> None:
    """Issue 13 item 11: like every other provider, an attempt refused with an HTTP error shows
    no StreamStart (the stream never opened), only the StreamError that announces the retry;
    a refused final attempt likewise."""
    async with open_fake_server([http_error(status), "Hi."]) as srv:
        _, rec = await call(_actor(srv.url))
    assert rec.kinds()[:4] == ["LLMCallStart", "StreamError", "StreamStart", "TextStart"]
    assert rec.of(StreamStart) == [StreamStart(attempt=2)]

    async with open_fake_server([http_error(401)]) as srv:
        rec = Recorder()
        with pytest.raises(AuthenticationError):
            await call(_actor(srv.url), rec)
    assert rec.kinds() == ["LLMCallStart", "StreamError"]
