"""Retries shared by every provider: backoff with jitter, `retry-after`, a total deadline, and the
mapping of HTTP failures to `rollouts.errors`.

A provider runs each attempt through `stream_with_retries`::

    async def attempt(emit: OnChunk, n: int) -> Result:
        async with open_the_stream(...) as stream:      # raises on HTTP errors
            await emit(StreamStart(attempt=n))
            ...                                          # emit events as chunks arrive
            return result

    result, attempts = await stream_with_retries(
        attempt, endpoint=actor.endpoint, on_chunk=on_chunk, classify=my_classify
    )

`classify(exc)` turns an exception into a `Failure` (a `ProviderError` to raise plus an optional
`retry_after`), or returns None for exceptions that are not provider failures (programming errors),
which propagate untouched. Build Failures with `failure_from_status` (HTTP status + headers + body)
and `connection_failure`; `classify_common(exc, provider)` already handles what every provider
shares (a `ProviderError` raised inside an attempt, `HTTPStatusFailure` raised by our own HTTP
code, httpx2/httpcore2 transport errors and timeouts), so a provider's classifier only adds its SDK's
exception types and falls back to it.

Policy:
* retried: 408, 409, 425, 429, every 5xx (including 529 "overloaded"), connection errors,
  timeouts and streams that break or end early; never 400/401/403/404/422, context-too-long,
  or anything `classify` does not recognise;
* at most `Endpoint.max_retries` retries; the delay before retry k is
  `min(max_delay, base_delay * 2**(k-1))` scaled by a random factor in [0.5, 1] (jitter), or
  exactly the server's `retry-after` / `retry-after-ms` when it sends one (capped at
  `max_retry_after`);
* the whole call, back-off included, is bounded by `Endpoint.timeout * (max_retries + 1)`;
  a retry whose delay would cross that deadline is not attempted;
* an attempt that fails after emitting events is followed by `StreamError(will_retry=True)`
  (consumers and `MessageBuilder` discard the partial message) before the next attempt's
  `StreamStart`; the final failure emits `StreamError(will_retry=False)` and raises;
* cancellation is never caught: it propagates at once, closing the stream the attempt holds.

Tests and callers can change the timings with `retry_policy(base_delay=0.01)` (a context
manager scoped to the current task and its children).
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import httpcore2
import httpx2
import trio

from rollouts.dtypes import Endpoint
from rollouts.errors import (
    AuthenticationError,
    ContextTooLongError,
    ProviderConnectionError,
    ProviderError,
    RateLimitError,
)
from rollouts.events import OnChunk, StreamError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Back-off timings (the retry count and timeouts come from the Endpoint)."""

    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0
    jitter: float = 0.5  # the delay is scaled by a random factor in [1 - jitter, 1]

    def delay(self, retry_number: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `retry_number` (1-based)."""
        if retry_after is not None:
            return max(0.0, min(retry_after, self.max_retry_after))
        base = min(self.max_delay, self.base_delay * (2.0 ** (retry_number - 1)))
        return base * random.uniform(1.0 - self.jitter, 1.0)


_DEFAULT_POLICY = RetryPolicy()
_policy: ContextVar[RetryPolicy | None] = ContextVar("rollouts_retry_policy", default=None)


def current_policy() -> RetryPolicy:
    """The RetryPolicy in force for this task (see `retry_policy`)."""
    return _policy.get() or _DEFAULT_POLICY


@contextmanager
def retry_policy(**changes: float) -> Iterator[RetryPolicy]:
    """Use a RetryPolicy with `changes` (e.g. `base_delay=0.01`) inside the block."""
    policy = replace(current_policy(), **changes)
    token = _policy.set(policy)
    try:
        yield policy
    finally:
        _policy.reset(token)


@dataclass(frozen=True)
class Failure:
    """A classified failure: the exception to raise if no retry is left, and the server's
    requested delay. `error.retryable` decides whether it is retried."""

    error: ProviderError
    retry_after: float | None = None


# ---------------------------------------------------------------------------------------------
# Classification helpers
# ---------------------------------------------------------------------------------------------

_RETRYABLE_4XX = frozenset({408, 409, 425, 429})
_CONTEXT_HINTS = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "input is too long",
    "exceeds the context",
    "exceed_context_size",  # llama.cpp server
    "available context size",
    "string_above_max_length",
)


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds or an HTTP date); None if absent."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_text(body: Any) -> tuple[str, str]:
    """(message, code) from a provider error body such as `{"error": {"message", "code"}}`."""
    if isinstance(body, Mapping):
        err = body.get("error", body)
        if isinstance(err, Mapping):
            message = str(err.get("message") or "")
            code = str(err.get("code") or err.get("type") or err.get("status") or "")
            return message, code
        if isinstance(err, str):
            return err, ""
    if isinstance(body, str | bytes):
        return (body.decode("utf-8", "replace") if isinstance(body, bytes) else body)[:500], ""
    return "", ""


def is_context_too_long(message: str, code: str = "") -> bool:
    """Whether an error message/code says the conversation does not fit the context window."""
    text = f"{code} {message}".lower()
    return any(h in text for h in _CONTEXT_HINTS)


def failure_from_status(
    status: int,
    *,
    provider: str,
    headers: Mapping[str, str] | None = None,
    body: Any = None,
    message: str | None = None,
) -> Failure:
    """Map an HTTP error response to the right `rollouts.errors` exception."""
    msg, code = _error_text(body)
    msg = message or msg or f"HTTP {status}"
    text = f"{provider}: HTTP {status}{f' ({code})' if code else ''}: {msg}"
    retry_after = parse_retry_after(headers)
    if status in (401, 403):
        hint = " Check the API key (Endpoint.api_key or the provider's key variable)."
        return Failure(AuthenticationError(text + hint, provider=provider, status_code=status))
    if status in (400, 413, 422) and is_context_too_long(msg, code):
        return Failure(ContextTooLongError(text, provider=provider, status_code=status))
    if status == 429:
        return Failure(RateLimitError(text, provider=provider, status_code=status, retryable=True), retry_after)
    if status in _RETRYABLE_4XX or status >= 500:
        return Failure(ProviderError(text, provider=provider, status_code=status, retryable=True), retry_after)
    return Failure(ProviderError(text, provider=provider, status_code=status, retryable=False))


def connection_failure(provider: str, exc: BaseException | str) -> Failure:
    """A retryable ProviderConnectionError for a dropped/failed/timed-out connection."""
    detail = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Failure(
        ProviderConnectionError(f"{provider}: connection failed: {detail}", provider=provider, retryable=True)
    )


# What the lean transport (httpcore2 directly) raises where httpx2 raises a TransportError of
# the same name (ConnectError, ReadError, RemoteProtocolError, ReadTimeout, PoolTimeout...).
_HTTPCORE_ERRORS = (
    httpcore2.NetworkError,
    httpcore2.TimeoutException,
    httpcore2.ProtocolError,
    httpcore2.UnsupportedProtocol,
)


_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    httpx2.TransportError,
    trio.BrokenResourceError,
    *_HTTPCORE_ERRORS,
)


class HTTPStatusFailure(Exception):
    """Raised by our own HTTP code for an error response; `classify_common` maps it."""

    def __init__(self, status: int, headers: Mapping[str, str], body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers
        self.body = body


class IncompleteStreamError(Exception):
    """A stream ended (cleanly, as far as HTTP goes) before the model finished: retried."""


_CONNECTION_ERRORS += (IncompleteStreamError,)


def classify_common(exc: Exception, provider: str) -> Failure | None:
    """The classification every provider shares (None for exceptions it does not know)."""
    if isinstance(exc, ProviderError):
        if not exc.provider:
            exc.provider = provider
        return Failure(exc)
    if isinstance(exc, HTTPStatusFailure):
        return failure_from_status(exc.status, provider=provider, headers=exc.headers, body=exc.body)
    if isinstance(exc, _CONNECTION_ERRORS):
        return connection_failure(provider, exc)
    return None


def classify_sdk_error(exc: Exception, provider: str, sdk: Any, *, status: int | None = None) -> Failure | None:
    """The error table shared by the `openai` and `anthropic` SDKs (`sdk` is the module; both
    name their errors alike), after `classify_common`: a status error by its status (`status`
    overrides it), a connection error or timeout as a dropped connection, any other API error
    (an error event inside the stream) as retryable."""
    common = classify_common(exc, provider)
    if common is not None:
        return common
    if isinstance(exc, sdk.APIStatusError):
        code = exc.status_code if status is None else status
        return failure_from_status(code, provider=provider, headers=exc.response.headers, body=exc.body)
    if isinstance(exc, sdk.APIConnectionError):  # includes APITimeoutError
        cause = exc.__cause__ or exc
        return connection_failure(provider, cause if isinstance(cause, BaseException) else exc)
    if isinstance(exc, sdk.APIError):
        return Failure(ProviderError(f"{provider}: {exc.message}", provider=provider, retryable=True))
    return None


# ---------------------------------------------------------------------------------------------
# The retry loop
# ---------------------------------------------------------------------------------------------


def total_deadline(endpoint: Endpoint) -> float:
    """Seconds the whole call (all attempts and back-off) may take."""
    return endpoint.timeout * (endpoint.max_retries + 1)


async def stream_with_retries(
    attempt: Callable[[OnChunk, int], Awaitable[T]],
    *,
    endpoint: Endpoint,
    on_chunk: OnChunk,
    classify: Callable[[Exception], Failure | None],
    secret: str = "",
    bounded: bool = True,
) -> tuple[T, int]:
    """Run `attempt(on_chunk, attempt_number)` until it succeeds; return (its result, attempts).

    See the module docstring for the policy. Raises the classified `ProviderError` (chained to
    the original exception) when retries run out or the failure is not retryable. `secret` (the
    API key in use) is cut out of every error text a server echoed it into, and an original
    exception that mentions it is not chained, so it reaches no log, sample or report.
    `bounded=False` drops the total deadline (for calls that do no I/O: the scripted model)."""
    policy = current_policy()
    max_attempts = endpoint.max_retries + 1
    deadline = trio.current_time() + total_deadline(endpoint) if bounded else None
    last: Failure | None = None
    last_exc: BaseException | None = None
    n = 0
    for n in range(1, max_attempts + 1):
        try:
            if deadline is None:
                return await attempt(on_chunk, n), n
            with trio.CancelScope(deadline=deadline):  # (a bare scope: cheaper than fail_after)
                return await attempt(on_chunk, n), n
            raise trio.TooSlowError  # reached only when the deadline cancelled the attempt
        except trio.TooSlowError as exc:
            last_exc = exc
            last = Failure(
                ProviderError(
                    f"{endpoint.provider}: gave up after {total_deadline(endpoint):g}s "
                    f"(Endpoint.timeout * (max_retries + 1))",
                    provider=endpoint.provider,
                    retryable=True,
                )
            )
            break
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            _scrub(failure.error, secret)
            last, last_exc = failure, exc
            if not failure.error.retryable or n == max_attempts:
                break
            delay = policy.delay(n, failure.retry_after)
            if deadline is not None and trio.current_time() + delay >= deadline:
                break
            await on_chunk(StreamError(str(failure.error), will_retry=True, attempt=n))
            await trio.sleep(delay)
    assert last is not None
    await on_chunk(StreamError(str(last.error), will_retry=False, attempt=n))
    raise last.error from (None if _mentions(last_exc, secret) else last_exc)


_MIN_SECRET = 8  # shorter "keys" (placeholders such as "EMPTY") are not worth scrubbing


def _scrub(error: ProviderError, secret: str) -> None:
    if len(secret) >= _MIN_SECRET and secret in str(error):
        error.args = (str(error).replace(secret, "***"),)


def _mentions(exc: BaseException | None, secret: str) -> bool:
    """Whether `secret` appears in the text of `exc` or anything it is chained to."""
    if len(secret) < _MIN_SECRET:
        return False
    seen = 0
    while exc is not None and seen < 16:
        if secret in str(exc) or secret in repr(exc.args):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
