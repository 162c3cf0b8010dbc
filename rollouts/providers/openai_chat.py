"""OpenAI Chat Completions through the official `openai` SDK, and OpenAI-compatible servers.

Provider names:
* `openai`: api.openai.com (or `Endpoint.api_base`), key from `Endpoint.api_key` or
  `OPENAI_API_KEY`. Reasoning models (o-series, gpt-5) get `max_completion_tokens` and
  `reasoning_effort` (from `Endpoint.thinking` — `{"effort": "high"}` or `{"budget_tokens": N}` —
  or `extra_params["reasoning_effort"]`) and no temperature. Models that only exist on the
  Responses API (`*-pro`, codex, computer-use) and `extra_params={"api": "responses"}` are routed
  to the `openai-responses` provider.
* `openai-compatible` (aliases `vllm`, `sglang`, `llamacpp`): any server speaking the Chat
  Completions API at `Endpoint.api_base` (e.g. `http://localhost:8000/v1`); key from
  `Endpoint.api_key` only (never `OPENAI_API_KEY`, so it cannot leak to a third-party server).
  Quirks handled: servers that report no usage give `Usage()` zeros and the message's
  `details["usage_reported"] = False` (no estimate: a guess would pollute cost accounting);
  tool calls written as text (bare JSON `{"name", "arguments"}`, in ```json fences or
  `<tool_call>` tags) become real tool calls when they name a declared tool and parse (only the
  first one when the request sets `parallel_tool_calls: false`); assistant
  messages with only tool calls are sent with `content: ""` rather than null; `max_tokens`
  instead of `max_completion_tokens`.

Connections are kept alive and reused except for llama.cpp servers (see
`openai_http.keeps_connections_alive`; `extra_params={"keepalive": False}` for any other).

Transport (`uses_lean_transport`): self-hosted servers (`openai-compatible` and its aliases,
`local`) go through the lean `openai_http` transport by default (`Endpoint.transport="auto"`),
`openai` through the SDK; `transport="sdk"` or `"http"` chooses either. Same request, same
events, same Message and Usage, same retries and errors; the lean one costs less client CPU.

The SDK's own retries are off (`max_retries=0`); `_retry.stream_with_retries` retries instead,
so a stream broken after output is retried with `StreamError(will_retry=True)` first.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx2
import trio

from rollouts.dtypes import Actor, Endpoint, Message
from rollouts.errors import ConfigurationError
from rollouts.events import OnChunk
from rollouts.providers import ProviderFn, get_provider_function
from rollouts.providers._call import run_call
from rollouts.providers._chat_format import ChatStreamTranslator, build_chat_request
from rollouts.providers._clients import current_pool, shared_ssl_context
from rollouts.providers._retry import Failure, classify_common, classify_sdk_error
from rollouts.providers.keys import api_key_for
from rollouts.providers.openai_http import keeps_connections_alive

if TYPE_CHECKING:
    import openai

# (the `openai` SDK is imported when an SDK client is first made, not with this module: it takes
# ~0.5 s of CPU to import, and the lean `transport="http"` path never needs it)

_RESPONSES_ONLY = re.compile(r"^(?:o\d+-pro|gpt-5(?:\.\d+)?-pro|gpt-5(?:\.\d+)?-codex|codex-|computer-use)")
_CREATE_PARAMS = frozenset(
    {
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
        "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "n",
        "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort",
        "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
        "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
        "verbosity", "web_search_options",
    }
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Keys and clients
# ---------------------------------------------------------------------------------------------


def _api_key(endpoint: Endpoint, compat: bool) -> str:
    if compat:  # only ever the endpoint's own key: an OpenAI key must not reach another server
        return endpoint.api_key
    return api_key_for(endpoint, "openai")


def _sdk_client_key(endpoint: Endpoint, api_key: str) -> Hashable:
    # The key is hashed so the pool never holds it as a plain dictionary key.
    return ("openai-sdk", endpoint.api_base, hash(api_key), endpoint.timeout, keeps_connections_alive(endpoint))


def _make_sdk_client(endpoint: Endpoint, api_key: str) -> openai.AsyncOpenAI:
    import openai

    return openai.AsyncOpenAI(
        api_key=api_key or "EMPTY",  # self-hosted servers often need no key; the SDK needs one
        base_url=endpoint.api_base or None,
        max_retries=0,  # retried by rollouts.providers._retry
        timeout=openai.Timeout(endpoint.timeout, connect=min(10.0, endpoint.timeout)),
        http_client=_sdk_http_client(endpoint),
    )


def _sdk_http_client(endpoint: Endpoint) -> httpx2.AsyncClient:
    """The SDK's default client (its limits and timeouts) with our shared TLS context, and no
    kept-alive connections where `keeps_connections_alive` says so."""
    import openai

    if keeps_connections_alive(endpoint):
        return openai.DefaultAsyncHttpxClient(verify=shared_ssl_context())
    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=0)
    return openai.DefaultAsyncHttpxClient(verify=shared_ssl_context(), limits=limits)


@asynccontextmanager
async def sdk_client(endpoint: Endpoint, api_key: str) -> AsyncIterator[openai.AsyncOpenAI]:
    """The pooled SDK client inside a `client_scope()`, else one closed when the call ends."""
    pool = current_pool()
    if pool is not None:
        yield await pool.get(_sdk_client_key(endpoint, api_key), lambda: _make_sdk_client(endpoint, api_key))
        return
    client = _make_sdk_client(endpoint, api_key)
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await client.close()


@asynccontextmanager
async def _open_sdk_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[Any]:
    known = {k: v for k, v in body.items() if k in _CREATE_PARAMS}
    extra = {k: v for k, v in body.items() if k not in _CREATE_PARAMS}
    async with sdk_client(endpoint, api_key) as client:
        stream = await client.chat.completions.create(**known, extra_body=extra or None)
        async with stream:
            yield stream


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


def classify_openai_error(exc: Exception, provider: str) -> Failure | None:
    """Map openai SDK / httpx2 / our own exceptions to a retry decision and a rollouts error."""
    sdk = sys.modules.get("openai")
    if sdk is None:  # the SDK was never imported (the lean transport): no SDK error can exist
        return classify_common(exc, provider)
    return classify_sdk_error(exc, provider, sdk)


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


def _mark_unreported_usage(message: Message, translator: ChatStreamTranslator) -> Message:
    if translator.usage_raw is not None:
        return message
    return replace(message, details={**(message.details or {}), "usage_reported": False})


async def _stream_chat(actor: Actor, on_chunk: OnChunk, *, compat: bool) -> Actor:
    ep = actor.endpoint
    if compat and not ep.api_base:
        raise ConfigurationError(
            f"provider {ep.provider!r} needs Endpoint.api_base, the server's OpenAI-compatible URL "
            "(e.g. 'http://localhost:8000/v1')"
        )
    api_key = _api_key(ep, compat)
    text_tools = frozenset(t.name for t in actor.tools) if compat and actor.tools else None
    if uses_lean_transport(ep, compat=compat):
        from rollouts.providers.openai_http import open_chat_stream as open_stream
    else:
        open_stream = _open_sdk_stream
    text_tool_limit: int | None = None

    def build() -> dict[str, Any]:
        nonlocal text_tool_limit
        body = build_chat_request(actor, compat=compat)
        text_tool_limit = 1 if body.get("parallel_tool_calls") is False else None
        return body

    return await run_call(
        actor,
        on_chunk,
        build=build,
        open_stream=lambda body: open_stream(ep, body, api_key),
        translator=lambda emit: ChatStreamTranslator(
            emit, text_tool_names=text_tools, text_tool_limit=text_tool_limit, model=ep.model, price_expected=not compat
        ),
        classify=lambda exc: classify_openai_error(exc, ep.provider),
        secret=api_key,
        finish_message=_mark_unreported_usage,
    )


async def stream_openai_chat(actor: Actor, on_chunk: OnChunk) -> Actor:
    """OpenAI Chat Completions (provider `openai`, chat API)."""
    return await _stream_chat(actor, on_chunk, compat=False)


async def stream_openai_compatible(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Any OpenAI-compatible server at `Endpoint.api_base` (provider `openai-compatible`)."""
    return await _stream_chat(actor, on_chunk, compat=True)


def uses_lean_transport(endpoint: Endpoint, *, compat: bool) -> bool:
    """Whether a chat call goes through the lean `openai_http` transport: `transport="http"`,
    or the default `"auto"` for a self-hosted server (`compat`). The two transports give the
    same events, Message, Usage, retries and errors (the parity tests run both); the lean one
    costs a fraction of the SDK's client CPU (see benchmarks/evaluate.py)."""
    if endpoint.transport == "auto":
        return compat
    return endpoint.transport == "http"


def uses_responses_api(endpoint: Endpoint) -> bool:
    """Whether an `openai` endpoint must go to the Responses API instead of Chat Completions."""
    api = (endpoint.extra_params or {}).get("api")
    if api is not None:
        if api not in ("chat", "responses"):
            raise ConfigurationError(f"extra_params['api'] must be 'chat' or 'responses', got {api!r}")
        return bool(api == "responses")
    return bool(_RESPONSES_ONLY.match(endpoint.model.lower()))


async def stream_openai(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Provider `openai`: Chat Completions, or the Responses API when the model or
    `extra_params["api"] == "responses"` asks for it."""
    if uses_responses_api(actor.endpoint):
        fn: ProviderFn = get_provider_function("openai-responses", actor.endpoint.model)
        return await fn(actor, on_chunk)
    return await _stream_chat(actor, on_chunk, compat=False)
