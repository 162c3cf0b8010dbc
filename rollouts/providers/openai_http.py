"""A lean transport for OpenAI-compatible servers: `httpcore2` (the connection layer under
`httpx2`) plus a minimal SSE parser.

The default for self-hosted servers (`openai-compatible`, `vllm`, `sglang`, `llamacpp`,
`local`: `Endpoint.transport="auto"`), and chosen for any chat endpoint with `transport="http"`.
It produces exactly the same events, Message and Usage as the SDK path — the chunk-to-event
code (`_chat_format.ChatStreamTranslator`) and the retry loop (`_retry.stream_with_retries`) are
shared — but costs a fraction of the SDK's client CPU per streamed request, which matters when
`evaluate()` fans out hundreds of requests to a self-hosted vLLM/SGLang/llama.cpp server.

Where the CPU went, and what this module does about it (measured with benchmarks/evaluate.py):
* `httpx2.AsyncClient` adds request/response models, auth, redirect and cookie handling and
  exception mapping around `httpcore2`, none of which a POST to a fixed URL needs: requests go
  to `httpcore2.AsyncConnectionPool` directly; its exceptions are classified like httpx2's
  (`_retry.classify_common`), with the same names.
* httpcore2 writes a request's head and body in two `send` calls, each waking the server;
  `_CorkedStream` holds writes until the connection is read from, so a request leaves in one.
* The pools have explicit limits (1,000 connections in all, all kept alive: fan-out reuses
  connections instead of reconnecting) and timeouts (connect 10 s, read/write/pool
  `Endpoint.timeout`), kept per run in the client pool. Requests go to the least busy of
  `SHARDS` pools: a pool scans every connection on each request start and end (and probes
  each idle one's socket with a poll), so one pool of N connections costs O(N) per request.
  The pools keep as many connections as were busy at once in the last keep-alive period, so
  that cost follows the worst moments of a run (a server slowing down holds more requests
  open): at 1,000 in flight, 8 pools probed 25-105 connections per request, and the client's
  CPU per sample moved with them (1.35-1.95 ms). 32 pools of at most 31 connections probe
  10-20 per request (1.2-1.4 ms), and sequential calls still reuse one connection.
"""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Hashable, Iterable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpcore2
import trio

from rollouts.dtypes import Endpoint
from rollouts.errors import ProviderError
from rollouts.providers._clients import current_pool, shared_ssl_context
from rollouts.providers._retry import HTTPStatusFailure

OPENAI_API_BASE = "https://api.openai.com/v1"
MAX_CONNECTIONS = 1000
SHARDS = 32
_MAX_ERROR_BODY = 64 * 1024
_MAX_EVENT_BYTES = 16 * 1024 * 1024  # a single SSE event larger than this is refused


# llama.cpp's server closes a connection after a streamed reply without saying so; a client that
# reuses it soon after loses the race ("Server disconnected without sending a response").
_NO_KEEPALIVE_PROVIDERS = frozenset({"local", "llamacpp"})


def keeps_connections_alive(endpoint: Endpoint) -> bool:
    """Whether clients for `endpoint` reuse connections: `extra_params["keepalive"]` if set, else
    yes except for llama.cpp servers (provider `local` or `llamacpp`), where reuse races the
    server closing the connection. A fresh loopback connection costs well under a millisecond."""
    chosen = (endpoint.extra_params or {}).get("keepalive")
    if chosen is None:
        return endpoint.provider not in _NO_KEEPALIVE_PROVIDERS
    return bool(chosen)


class _CorkedStream(httpcore2.AsyncNetworkStream):
    """A connection that holds written bytes until it is next read from (or a write would
    hold more than `_CORK_LIMIT`): a request's head and body leave in one `send`."""

    def __init__(self, inner: httpcore2.AsyncNetworkStream) -> None:
        self._inner = inner
        self._pending: list[bytes] = []
        self._size = 0

    async def _flush(self, timeout: float | None) -> None:  # noqa: ASYNC109 (httpcore2's interface)
        data = b"".join(self._pending)
        self._pending.clear()
        self._size = 0
        await self._inner.write(data, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109 (httpcore2's interface)
        if buffer:
            self._pending.append(buffer)
            self._size += len(buffer)
            if self._size > _CORK_LIMIT:
                await self._flush(timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109 (httpcore2's interface)
        if self._pending:
            await self._flush(timeout)
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._pending.clear()
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
    ) -> httpcore2.AsyncNetworkStream:
        if self._pending:
            await self._flush(timeout)
        return _CorkedStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _CorkedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's trio backend, with corked connections."""

    def __init__(self) -> None:
        self._inner = httpcore2.TrioBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _CorkedStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore2's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        return _CorkedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


_CORK_LIMIT = 64 * 1024


def _make_client(endpoint: Endpoint, max_connections: int = MAX_CONNECTIONS) -> httpcore2.AsyncConnectionPool:
    keepalive = max_connections if keeps_connections_alive(endpoint) else 0
    return httpcore2.AsyncConnectionPool(
        ssl_context=shared_ssl_context(),
        max_connections=max_connections,
        max_keepalive_connections=keepalive,
        keepalive_expiry=30.0,
        network_backend=_CorkedBackend(),
    )


def _timeouts(endpoint: Endpoint) -> dict[str, float]:
    t = endpoint.timeout
    return {"connect": min(10.0, t), "read": t, "write": t, "pool": t}


class _Shards:
    """`SHARDS` connection pools for one kind of endpoint; a request goes to the least busy one
    (the first on a tie), so sequential calls reuse one kept-alive connection and a fan-out is
    spread evenly."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._pools: list[httpcore2.AsyncConnectionPool | None] = [None] * SHARDS
        self._busy = [0] * SHARDS

    @asynccontextmanager
    async def pool(self) -> AsyncIterator[httpcore2.AsyncConnectionPool]:
        busy = self._busy
        shard = busy.index(min(busy))
        pool = self._pools[shard]
        if pool is None:
            pool = self._pools[shard] = _make_client(self._endpoint, MAX_CONNECTIONS // SHARDS)
        busy[shard] += 1
        try:
            yield pool
        finally:
            busy[shard] -= 1

    async def aclose(self) -> None:
        pools, self._pools = self._pools, [None] * SHARDS
        for pool in pools:
            if pool is not None:
                await pool.aclose()


def _client_key(endpoint: Endpoint) -> Hashable:
    return ("openai-http", keeps_connections_alive(endpoint))


@asynccontextmanager
async def http_client(endpoint: Endpoint) -> AsyncIterator[httpcore2.AsyncConnectionPool]:
    """The pooled connection pool for `endpoint` inside a `client_scope()`, else one closed on exit."""
    pool = current_pool()
    if pool is not None:
        shards: _Shards = await pool.get(_client_key(endpoint), lambda: _Shards(endpoint))
        async with shards.pool() as client:
            yield client
        return
    client = _make_client(endpoint)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def iter_sse_json(body: AsyncIterable[bytes] | Any) -> AsyncGenerator[Any, None]:
    """The JSON payloads of a `text/event-stream` body's `data:` events, until `[DONE]`. `body`
    is the body's byte chunks (or a response with `aiter_bytes()`).

    Multi-line data is joined with newlines; `event:`/`id:`/`retry:` fields and comments are
    ignored. After `[DONE]` the rest of the body is drained (so the connection can be reused)."""
    pending = b""
    data: list[bytes] = []
    done = False
    chunks = body.aiter_bytes() if hasattr(body, "aiter_bytes") else body
    async for part in chunks:
        if done:
            continue
        pending += part
        if b"\n" not in part:
            if len(pending) > _MAX_EVENT_BYTES:
                raise ProviderError("stream event too large", retryable=False)
            continue
        lines = pending.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if not data:
                    continue
                payload = data[0] if len(data) == 1 else b"\n".join(data)
                data = []
                if payload == b"[DONE]":
                    done = True
                    break
                try:
                    value = json.loads(payload)
                except ValueError:
                    raise ProviderError(f"malformed stream event: {payload[:200]!r}", retryable=True) from None
                yield value
            elif line.startswith(b"data:"):
                v = line[5:]
                data.append(v[1:] if v.startswith(b" ") else v)


def _error_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


@functools.lru_cache(maxsize=64)
def _target(api_base: str) -> tuple[httpcore2.URL, bytes]:
    """The chat-completions URL under `api_base` and its Host header value."""
    url = httpcore2.URL(api_base.rstrip("/") + "/chat/completions")
    default_port = {b"http": 80, b"https": 443}.get(url.scheme)
    host = url.host if url.port in (None, default_port) else b"%b:%d" % (url.host, url.port)
    return url, host


def _headers(response: httpcore2.Response) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}


@asynccontextmanager
async def open_chat_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[AsyncIterator[Any]]:
    """POST a streamed chat completion to `endpoint.api_base`; yields the chunks as dicts.

    Raises `HTTPStatusFailure` for an error status (classified by the retry loop). Leaving the
    block (normally, by error or by cancellation) closes the response at once."""
    url, host = _target(endpoint.api_base or OPENAI_API_BASE)
    payload = json.dumps(body).encode()
    headers = [
        (b"host", host),
        (b"content-type", b"application/json"),
        (b"accept", b"text/event-stream"),
        (b"content-length", b"%d" % len(payload)),
    ]
    if api_key:
        headers.append((b"authorization", f"Bearer {api_key}".encode("latin-1")))
    request = httpcore2.Request(
        b"POST", url, headers=headers, content=payload, extensions={"timeout": _timeouts(endpoint)}
    )
    async with http_client(endpoint) as client:
        response = await client.handle_async_request(request)
        try:
            stream: AsyncIterable[bytes] = response.stream  # type: ignore[assignment]
            if response.status >= 400:
                raw = b""
                async for part in stream:
                    raw += part
                    if len(raw) > _MAX_ERROR_BODY:
                        break
                raise HTTPStatusFailure(response.status, _headers(response), _error_body(raw))
            async with aclosing(iter_sse_json(stream)) as events:
                yield events
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
