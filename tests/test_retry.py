"""Retries and faults: what is retried, how often, after how long, and what the consumer sees."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.errors import (
    AuthenticationError,
    ContextTooLongError,
    ProviderConnectionError,
    ProviderError,
    RateLimitError,
)
from rollouts.events import LLMCallStart, StreamError, StreamEvent, StreamStart, TextDelta
from rollouts.providers import get_provider_function
from rollouts.providers._retry import (
    Failure,
    RetryPolicy,
    failure_from_status,
    parse_retry_after,
    retry_policy,
    stream_with_retries,
)
from rollouts.testing import FakeTurn, http_error, open_fake_server

TRANSPORTS = pytest.mark.parametrize("transport", ["sdk", "http"])


@pytest.fixture(autouse=True)
def _fast_backoff() -> Any:
    with retry_policy(base_delay=0.01, max_delay=0.05):
        yield


class Recorder:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _actor(base_url: str, transport: str = "sdk", **ep: Any) -> Actor:
    endpoint = Endpoint("openai", "gpt-4o-mini", api_base=base_url, api_key="k", transport=transport, **ep)  # type: ignore[arg-type]
    return Actor(Trajectory((Message("user", "hi"),)), endpoint)


async def _call(actor: Actor, rec: Recorder | None = None) -> tuple[Actor, Recorder]:
    rec = rec or Recorder()
    fn = get_provider_function(actor.endpoint.provider, actor.endpoint.model)
    return await fn(actor, rec), rec


@TRANSPORTS
async def test_429_retry_after_is_honoured_and_counted(transport: str) -> None:
    async with open_fake_server([http_error(429, retry_after=0.3), "fine"]) as srv:
        start = trio.current_time()
        actor, rec = await _call(_actor(srv.base_url, transport))
        elapsed = trio.current_time() - start
        assert len(srv.scripted_requests) == 2
    assert elapsed >= 0.29  # the back-off alone would have been ~0.01 s
    assert actor.trajectory.messages[-1].text == "fine"
    assert actor.trajectory.completions[-1].attempts == 2
    errors = rec.of(StreamError)
    assert len(errors) == 1 and errors[0].will_retry and errors[0].attempt == 1 and "429" in errors[0].error
    assert [type(e) for e in rec.events[:3]] == [LLMCallStart, StreamError, StreamStart]
    assert rec.of(StreamStart) == [StreamStart(attempt=2)]


@TRANSPORTS
async def test_500_503_529_and_connection_failures_are_retried(transport: str) -> None:
    script = [http_error(500), http_error(503), http_error(529), FakeTurn(close_without_response=True), "ok"]
    async with open_fake_server(script) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport, max_retries=4))
        assert len(srv.scripted_requests) == 5
    assert actor.trajectory.messages[-1].text == "ok"
    assert actor.trajectory.completions[-1].attempts == 5
    assert [e.will_retry for e in rec.of(StreamError)] == [True] * 4


@TRANSPORTS
async def test_retries_are_bounded_by_max_retries(transport: str) -> None:
    async with open_fake_server([http_error(503)] * 5) as srv:
        rec = Recorder()
        with pytest.raises(ProviderError) as info:
            await _call(_actor(srv.base_url, transport, max_retries=2), rec)
        assert len(srv.scripted_requests) == 3
    assert info.value.retryable and info.value.status_code == 503
    assert [e.will_retry for e in rec.of(StreamError)] == [True, True, False]
    async with open_fake_server([http_error(429)] * 2) as srv:
        with pytest.raises(RateLimitError):
            await _call(_actor(srv.base_url, transport, max_retries=1))


@TRANSPORTS
@pytest.mark.parametrize(
    ("turn", "error", "retryable"),
    [
        (http_error(400, message="bad request"), ProviderError, False),
        (http_error(401, message="invalid key"), AuthenticationError, False),
        (http_error(403), AuthenticationError, False),
        (http_error(404), ProviderError, False),
        (
            http_error(400, code="context_length_exceeded", message="maximum context length is 8192"),
            ContextTooLongError,
            False,
        ),
    ],
)
async def test_client_errors_are_not_retried(transport: str, turn: FakeTurn, error: type, retryable: bool) -> None:
    async with open_fake_server([turn, "never sent"]) as srv:
        with pytest.raises(error) as info:
            await _call(_actor(srv.base_url, transport))
        assert len(srv.scripted_requests) == 1
    assert type(info.value) is error
    assert info.value.retryable is retryable and info.value.status_code == turn.status
    assert info.value.provider == "openai"


@TRANSPORTS
@pytest.mark.parametrize("fault", [{"drop_after": 5}, {"truncate_after": 5}, {"end_after": 5}])
async def test_mid_stream_break_is_retried_without_duplicated_text(transport: str, fault: dict[str, int]) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    async with open_fake_server([FakeTurn(text, **fault), text], chunk_size=4) as srv:  # type: ignore[arg-type]
        actor, rec = await _call(_actor(srv.base_url, transport))
        assert len(srv.scripted_requests) == 2
    msg = actor.trajectory.messages[-1]
    assert msg.text == text and len(msg.content) == 1
    kinds = [type(e).__name__ for e in rec.events]
    err_at = kinds.index("StreamError")
    assert rec.events[err_at].will_retry  # type: ignore[union-attr]
    assert "TextDelta" in kinds[:err_at]  # output had been emitted before the break
    before = "".join(e.delta for e in rec.events[:err_at] if isinstance(e, TextDelta))
    after = "".join(e.delta for e in rec.events[err_at:] if isinstance(e, TextDelta))
    assert before and text.startswith(before) and after == text
    assert actor.trajectory.completions[-1].attempts == 2


@TRANSPORTS
async def test_retry_after_beyond_the_deadline_is_not_waited_for(transport: str) -> None:
    async with open_fake_server([http_error(429, retry_after=30), "never"]) as srv:
        with pytest.raises(RateLimitError):
            await _call(_actor(srv.base_url, transport, timeout=1.0, max_retries=3))
        assert len(srv.scripted_requests) == 1


@TRANSPORTS
async def test_total_deadline_bounds_a_hanging_server(transport: str) -> None:
    async with open_fake_server([FakeTurn("late", first_byte_delay=5)]) as srv:
        with pytest.raises(ProviderError) as info:
            await _call(_actor(srv.base_url, transport, timeout=0.3, max_retries=0))
    assert info.value.retryable


@TRANSPORTS
async def test_cancel_during_backoff_sends_no_further_request(transport: str) -> None:
    async with open_fake_server([http_error(429, retry_after=5), "never"]) as srv:
        rec = Recorder()
        with trio.CancelScope() as scope:

            async def on_chunk(event: StreamEvent) -> None:
                await rec(event)
                if isinstance(event, StreamError) and event.will_retry:
                    scope.cancel()  # lands in the 5 s back-off that follows (not after a guessed 0.5 s)

            await get_provider_function("openai", "gpt-4o-mini")(_actor(srv.base_url, transport), on_chunk)
        assert scope.cancelled_caught
        assert len(srv.scripted_requests) == 1
        assert [e.will_retry for e in rec.of(StreamError)] == [True]


# --------------------------------------------------------------------------------------------
# Units
# --------------------------------------------------------------------------------------------


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.5"}) == 0.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # in the past
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None and parse_retry_after(None) is None


def test_failure_mapping() -> None:
    assert isinstance(failure_from_status(401, provider="p").error, AuthenticationError)
    f = failure_from_status(429, provider="p", headers={"retry-after": "3"})
    assert isinstance(f.error, RateLimitError) and f.retry_after == 3.0 and f.error.retryable
    assert failure_from_status(529, provider="p").error.retryable
    assert failure_from_status(408, provider="p").error.retryable
    assert not failure_from_status(422, provider="p").error.retryable
    ctx = failure_from_status(400, provider="p", body={"error": {"message": "prompt is too long: 300000 tokens"}})
    assert isinstance(ctx.error, ContextTooLongError)
    assert "prompt is too long" in str(ctx.error) and "HTTP 400" in str(ctx.error)


def test_backoff_grows_with_jitter_and_respects_caps() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=5.0, max_retry_after=10.0)
    for n, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        for _ in range(20):
            assert base * 0.5 <= policy.delay(n, None) <= base
    assert policy.delay(3, 0.7) == 0.7
    assert policy.delay(1, 100.0) == 10.0


async def test_programming_errors_propagate_untouched_after_one_attempt() -> None:
    calls = 0

    async def attempt(emit: Any, n: int) -> None:
        nonlocal calls
        calls += 1
        raise TypeError("bug")

    with pytest.raises(TypeError, match="bug"):
        await stream_with_retries(attempt, endpoint=Endpoint("p", "m"), on_chunk=Recorder(), classify=lambda e: None)
    assert calls == 1


async def test_generic_loop_retries_classified_failures() -> None:
    seen: list[int] = []

    async def attempt(emit: Any, n: int) -> str:
        seen.append(n)
        if n < 3:
            raise ConnectionResetError("reset")
        return "done"

    def classify(exc: Exception) -> Failure | None:
        if isinstance(exc, ConnectionResetError):
            return Failure(ProviderConnectionError("reset", retryable=True))
        return None

    rec = Recorder()
    result = await stream_with_retries(
        attempt, endpoint=Endpoint("p", "m", max_retries=5), on_chunk=rec, classify=classify
    )
    assert result == ("done", 3) and seen == [1, 2, 3]
    assert [e.attempt for e in rec.of(StreamError)] == [1, 2]


KEY = "sk-ECHOED-key-0123456789"


def _keyed_endpoint(provider: str, srv: Any) -> Endpoint:
    url = srv.url if provider in ("anthropic", "google") else srv.base_url
    model = {"anthropic": "claude-haiku-4-5", "google": "gemini-2.5-flash", "openai-responses": "gpt-4.1"}
    return Endpoint(provider, model.get(provider, "gpt-4o-mini"), api_base=url, api_key=KEY, max_retries=1)


@pytest.mark.parametrize("provider", ["openai", "anthropic", "google", "openai-responses"])
async def test_a_key_the_server_echoes_never_reaches_errors_events_or_files(provider: str, tmp_path: Any) -> None:
    """Some servers put the key they rejected into the error message; it must go no further."""
    from rollouts.eval.config import EvalConfig
    from rollouts.eval.run import evaluate

    script = [http_error(500, message=f"upstream broke for key {KEY}"), http_error(401, message=f"bad key {KEY}")]
    async with open_fake_server(script) as srv:
        rec = Recorder()
        with pytest.raises(AuthenticationError) as info:
            await _call(Actor(Trajectory((Message("user", "hi"),)), _keyed_endpoint(provider, srv)), rec)
    assert KEY not in str(info.value) and "***" in str(info.value)
    assert info.value.__cause__ is None  # the SDK's own exception quotes the key: not chained
    errors = rec.of(StreamError)
    assert len(errors) == 2 and all(KEY not in e.error for e in errors) and "***" in errors[0].error

    # evaluate(): a provider error is recorded in the sample, an auth error stops the eval
    script = [http_error(500, message=f"upstream broke for key {KEY}")] * 2 + [http_error(401, message=f"bad {KEY}")]
    async with open_fake_server(script) as srv:
        endpoint = _keyed_endpoint(provider, srv)

        def config(out: str) -> EvalConfig:
            return EvalConfig(
                endpoint=endpoint, output_dir=tmp_path / out, show_progress=False, provider_error_retries=0
            )

        report = await evaluate([{"prompt": "hi"}], config("provider-error"))
        assert report.samples[0].status == "provider_error" and "***" in (report.samples[0].error or "")
        with pytest.raises(AuthenticationError):
            await evaluate([{"prompt": "hi"}], config("auth"))
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) >= 3 and all(KEY.encode() not in p.read_bytes() for p in written)
