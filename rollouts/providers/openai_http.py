"""A lean transport for OpenAI-compatible servers: `httpx2` plus a minimal SSE parser.

Selected with `Endpoint(transport="http")` for provider `openai-compatible` (or `openai`).
It produces exactly the same events, Message and Usage as the SDK path — the chunk-to-event
code (`_chat_format.ChatStreamTranslator`) and the retry loop (`_retry.stream_with_retries`) are
shared — but costs a fraction of the SDK's client CPU per streamed request, which matters when
`evaluate()` fans out hundreds of requests to a self-hosted vLLM/SGLang/llama.cpp server.

The clients are `httpx2.AsyncClient`s with explicit limits (1,000 connections in all, all kept
alive: fan-out reuses connections instead of reconnecting) and explicit timeouts (connect 10 s,
read and pool `Endpoint.timeout`), kept per run in the client pool. Requests are spread
round-robin over `SHARDS` clients: httpcore's pool scans every connection on each request
start and end, so one pool of N busy connections costs O(N) per request; 8 pools of N/8 make
200-way fan-out measurably cheaper.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncGenerator, AsyncIterator, Hashable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx2
import trio

from rollouts.dtypes import Endpoint
from rollouts.errors import ProviderError
from rollouts.providers._clients import current_pool, shared_ssl_context
from rollouts.providers._retry import HTTPStatusFailure

OPENAI_API_BASE = "https://api.openai.com/v1"
MAX_CONNECTIONS = 1000
SHARDS = 8
_round_robin = itertools.count()
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


def _make_client(endpoint: Endpoint, max_connections: int = MAX_CONNECTIONS) -> httpx2.AsyncClient:
    keepalive = max_connections if keeps_connections_alive(endpoint) else 0
    return httpx2.AsyncClient(
        verify=shared_ssl_context(),
        limits=httpx2.Limits(
            max_connections=max_connections, max_keepalive_connections=keepalive, keepalive_expiry=30.0
        ),
        timeout=httpx2.Timeout(endpoint.timeout, connect=min(10.0, endpoint.timeout), pool=endpoint.timeout),
    )


def _client_key(endpoint: Endpoint, shard: int) -> Hashable:
    return ("openai-http", endpoint.timeout, keeps_connections_alive(endpoint), shard)


@asynccontextmanager
async def http_client(endpoint: Endpoint) -> AsyncIterator[httpx2.AsyncClient]:
    """The pooled client for `endpoint` inside a `client_scope()`, else one closed on exit."""
    pool = current_pool()
    if pool is not None:
        shard = next(_round_robin) % SHARDS
        per_shard = MAX_CONNECTIONS // SHARDS
        yield await pool.get(_client_key(endpoint, shard), lambda: _make_client(endpoint, per_shard))
        return
    client = _make_client(endpoint)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def iter_sse_json(response: httpx2.Response) -> AsyncGenerator[Any, None]:
    """The JSON payloads of a `text/event-stream` body's `data:` events, until `[DONE]`.

    Multi-line data is joined with newlines; `event:`/`id:`/`retry:` fields and comments are
    ignored. After `[DONE]` the rest of the body is drained (so the connection can be reused)."""
    pending = b""
    data: list[bytes] = []
    done = False
    async for part in response.aiter_bytes():
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


@asynccontextmanager
async def open_chat_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[AsyncIterator[Any]]:
    """POST a streamed chat completion to `endpoint.api_base`; yields the chunks as dicts.

    Raises `HTTPStatusFailure` for an error status (classified by the retry loop). Leaving the
    block (normally, by error or by cancellation) closes the response at once."""
    url = (endpoint.api_base or OPENAI_API_BASE).rstrip("/") + "/chat/completions"
    headers = {"content-type": "application/json", "accept": "text/event-stream"}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    async with http_client(endpoint) as client:
        request = client.build_request("POST", url, content=json.dumps(body).encode(), headers=headers)
        response = await client.send(request, stream=True)
        try:
            if response.status_code >= 400:
                raw = b""
                async for part in response.aiter_bytes():
                    raw += part
                    if len(raw) > _MAX_ERROR_BODY:
                        break
                raise HTTPStatusFailure(response.status_code, dict(response.headers), _error_body(raw))
            async with aclosing(iter_sse_json(response)) as events:
                yield events
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()
