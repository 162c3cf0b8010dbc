"""Anthropic Messages API, streamed through the official `anthropic` SDK (`AsyncAnthropic`).

Provider name `anthropic`. Key from `Endpoint.api_key` or `ANTHROPIC_API_KEY`; or an OAuth access
token in `Endpoint.oauth_token` (sent as `Authorization: Bearer` with the `oauth-2025-04-20` beta
header, instead of any key; masked like a key everywhere); `api_base` is the server root (default `https://api.anthropic.com`; a trailing `/v1` is accepted and dropped).

Request (`build_anthropic_request`):
* history goes through `_transform.transform_history` first (foreign thinking -> text, missing
  tool results, ids mapped to `^[A-Za-z0-9_-]{1,64}$`);
* leading system messages (plain strings or blocks) become the `system` parameter; a system
  message later in the conversation (e.g. an injected turn warning) is sent as user text, so the
  cached prefix stays stable;
* tool results become `tool_result` blocks (with `is_error`) in a user message; consecutive
  messages of the same role are merged, as the API requires;
* thinking blocks made by Anthropic go back verbatim with their signatures, redacted thinking as
  `redacted_thinking` with its data;
* `Endpoint.thinking` turns on extended thinking: `{"budget_tokens": N}` becomes
  `{"type": "enabled", "budget_tokens": N}`, a dict with `type` is sent as it is; no temperature
  is sent with thinking; a request that answers tool calls of an assistant message without a
  leading thinking block (another provider's turn) is sent without thinking, as the API
  requires thinking to start the turn it continues;
* prompt caching: `cache_control: {"type": "ephemeral"}` on the last system block, the last tool
  and the last block of the last message (off with `extra_params={"prompt_caching": False}`);
* `extra_params` are merged last (parameters the SDK does not know go through `extra_body`).

Stream: the raw Messages events (`message_start`, `content_block_start/delta/stop`,
`message_delta`, `message_stop`) become our events, with Anthropic's block index as
`content_index`; `input_json_delta` pieces become `ToolCallDelta`s with a partial parse, and
arguments that do not parse become `ToolCallError`. Usage: `input_tokens` (uncached),
`cache_read_tokens`, `cache_write_tokens`, `output_tokens` (cumulative, from `message_delta`),
`reasoning_tokens` when reported, and `cost_usd` from `_pricing`. Finish reasons map to the
shared vocabulary (`end_turn` -> `stop`, `tool_use`, `max_tokens`, others unchanged).

Faults: the SDK's own retries are off; `_retry.stream_with_retries` retries 429/5xx/529 and
broken streams (an `error` event in the stream, e.g. `overloaded_error`, counts as its status).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Any

import anthropic

from rollouts import events as ev
from rollouts.dtypes import (
    Actor,
    Endpoint,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCallContent,
    Usage,
)
from rollouts.errors import ConfigurationError
from rollouts.events import OnChunk
from rollouts.providers._call import ProviderCall
from rollouts.providers._clients import shared_ssl_context
from rollouts.providers._pooled import pooled_client, sdk_arguments
from rollouts.providers._pricing import with_cost
from rollouts.providers._retry import Failure, IncompleteStreamError, classify_sdk_error
from rollouts.providers._tool_events import end_tool_call, tool_call_delta
from rollouts.providers._transform import Target, thinking_origin, transform_history, with_extra_params
from rollouts.providers.keys import api_key_for

PROVIDER = "anthropic"
_CACHE = {"type": "ephemeral"}
_LOCAL_PARAMS = frozenset({"prompt_caching"})
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_use", "max_tokens": "max_tokens"}
# error types of an `error` event inside a stream -> the HTTP status they stand for
_STREAM_ERROR_STATUS = {
    "overloaded_error": 529,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
}


def _native_thinking(block: ThinkingContent, message: Message) -> bool:
    if thinking_origin(block, message) != PROVIDER:
        return False
    return bool(block.data) if block.redacted else bool(block.signature)


TARGET = Target(PROVIDER, native_thinking=_native_thinking, max_id_len=64)


# ---------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------


def _image_block(block: ImageContent) -> dict[str, Any]:
    if block.url is not None:
        return {"type": "image", "source": {"type": "url", "url": block.url}}
    return {"type": "image", "source": {"type": "base64", "media_type": block.media_type, "data": block.data}}


def _user_blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            if b.text:
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageContent):
            out.append(_image_block(b))
        elif isinstance(b, ThinkingContent) and b.thinking:  # not expected in user messages
            out.append({"type": "text", "text": b.thinking})
    return out


def _assistant_blocks(message: Message) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in message.blocks:
        if isinstance(b, ThinkingContent):  # only native blocks survive the transformation
            if b.redacted:
                out.append({"type": "redacted_thinking", "data": b.data})
            else:
                out.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
        elif isinstance(b, TextContent):
            if b.text:
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, ToolCallContent):
            out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": dict(b.arguments)})
        elif isinstance(b, ImageContent):
            continue  # the API takes no images from the assistant
    return out


def _tool_result_block(message: Message) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    images = [b for b in message.blocks if isinstance(b, ImageContent)]
    if images:
        block["content"] = _user_blocks(message)
    else:
        block["content"] = message.text
    if message.is_error:
        block["is_error"] = True
    return block


def anthropic_messages(messages: tuple[Message, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, API messages) for already-transformed `messages`."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    leading = True
    for m in messages:
        if m.role == "system":
            text = m.text
            if leading:
                if text:
                    system.append({"type": "text", "text": text})
                continue
            role, blocks = "user", [{"type": "text", "text": text}] if text else []
        else:
            leading = False
            if m.role == "user":
                role, blocks = "user", _user_blocks(m)
            elif m.role == "assistant":
                role, blocks = "assistant", _assistant_blocks(m)
            else:
                role, blocks = "user", [_tool_result_block(m)]
        if not blocks:
            continue  # the API rejects empty messages
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def anthropic_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": dict(t.parameters)} for t in tools]


def _thinking_param(endpoint: Endpoint) -> dict[str, Any] | None:
    thinking = endpoint.thinking
    if not thinking:
        return None
    if "type" in thinking:
        return dict(thinking)
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or budget < 1024:
        raise ConfigurationError(
            f"Endpoint.thinking for Anthropic needs an integer 'budget_tokens' >= 1024, got {dict(thinking)!r}"
        )
    if budget >= endpoint.max_tokens:
        raise ConfigurationError(
            f"Endpoint.thinking budget_tokens ({budget}) must be below Endpoint.max_tokens "
            f"({endpoint.max_tokens}); raise max_tokens"
        )
    return {"type": "enabled", "budget_tokens": budget}


def _mark_cache(blocks: list[dict[str, Any]]) -> None:
    for block in reversed(blocks):
        if block.get("type") not in ("thinking", "redacted_thinking"):
            block["cache_control"] = _CACHE
            return


def _in_unthinking_tool_loop(messages: list[dict[str, Any]]) -> bool:
    """Whether the request answers tool calls of an assistant message that has no thinking block
    first (made by another provider, or before thinking was turned on). The API rejects thinking
    mid-turn then, so the turn is finished without it."""
    if len(messages) < 2 or messages[-1]["role"] != "user" or messages[-2]["role"] != "assistant":
        return False
    if not any(b.get("type") == "tool_result" for b in messages[-1]["content"]):
        return False
    first = messages[-2]["content"][0].get("type") if messages[-2]["content"] else None
    return first not in ("thinking", "redacted_thinking")


def build_anthropic_request(actor: Actor) -> dict[str, Any]:
    """The keyword arguments of `messages.create(stream=True)` for `actor`."""
    ep = actor.endpoint
    params = dict(ep.extra_params or {})
    caching = bool(params.get("prompt_caching", True))
    system, messages = anthropic_messages(transform_history(actor.trajectory.messages, TARGET))
    body: dict[str, Any] = {"model": ep.model, "max_tokens": ep.max_tokens, "messages": messages, "stream": True}
    if system:
        body["system"] = system
    if actor.tools:
        body["tools"] = anthropic_tools(actor.tools)
    thinking = _thinking_param(ep)
    if thinking is not None and _in_unthinking_tool_loop(messages):
        thinking = None
    if thinking is not None:
        body["thinking"] = thinking
    elif ep.temperature is not None:
        body["temperature"] = ep.temperature
    if caching:
        if system:
            system[-1]["cache_control"] = _CACHE
        if actor.tools:
            body["tools"][-1]["cache_control"] = _CACHE
        if messages:
            _mark_cache(messages[-1]["content"])
    return with_extra_params(body, ep.extra_params, _LOCAL_PARAMS)


# ---------------------------------------------------------------------------------------------
# Stream events -> our events
# ---------------------------------------------------------------------------------------------


class _Block:
    __slots__ = ("id", "kind", "name", "parts", "signature")

    def __init__(self, kind: str, block_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.id = block_id
        self.name = name
        self.parts: list[str] = []
        self.signature: str | None = None


def _usage_ints(raw: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if raw is None:
        return out
    for src, dst in (
        ("input_tokens", "input_tokens"),
        ("output_tokens", "output_tokens"),
        ("cache_read_input_tokens", "cache_read_tokens"),
        ("cache_creation_input_tokens", "cache_write_tokens"),
    ):
        value = getattr(raw, src, None)
        if value is not None:
            out[dst] = int(value)
    details = getattr(raw, "output_tokens_details", None)
    thinking = getattr(details, "thinking_tokens", None) if details is not None else None
    if thinking is not None:
        out["reasoning_tokens"] = int(thinking)
    return out


class AnthropicStreamTranslator:
    """Feed raw Messages stream events in order; `finish()` emits StreamDone.

    Raises `IncompleteStreamError` from `finish()` when the stream ended before `message_stop`.
    `model` prices the usage (`finish(model)` may name another)."""

    __slots__ = ("_blocks", "_emit", "_model", "_usage", "finish_reason", "stopped")

    def __init__(self, emit: OnChunk, model: str = "") -> None:
        self._emit = emit
        self._model = model
        self._blocks: dict[int, _Block] = {}
        self._usage: dict[str, int] = {}
        self.finish_reason: str | None = None
        self.stopped = False

    async def feed(self, event: Any) -> None:
        kind = event.type
        if kind == "content_block_delta":
            delta = event.delta
            dkind = delta.type
            index = event.index
            block = self._blocks.get(index)
            if block is None or block.kind == "ignored":
                return  # deltas of server-tool blocks (or of a block never started)
            if dkind == "text_delta":
                block.parts.append(delta.text)
                await self._emit(ev.TextDelta(index, delta.text))
            elif dkind == "input_json_delta":
                piece = delta.partial_json
                if piece:
                    block.parts.append(piece)
                    await self._emit(tool_call_delta(index, block.id, piece, "".join(block.parts)))
            elif dkind == "thinking_delta":
                block.parts.append(delta.thinking)
                await self._emit(ev.ThinkingDelta(index, delta.thinking))
            elif dkind == "signature_delta":
                block.signature = (block.signature or "") + delta.signature
                await self._emit(ev.ThinkingSignature(index, block.signature))
            # citations_delta and unknown deltas carry nothing we keep
        elif kind == "content_block_start":
            await self._start(event.index, event.content_block)
        elif kind == "content_block_stop":
            await self._stop(event.index)
        elif kind == "message_start":
            self._usage.update(_usage_ints(event.message.usage))
        elif kind == "message_delta":
            reason = event.delta.stop_reason
            if reason:
                self.finish_reason = reason
            self._usage.update(_usage_ints(event.usage))
        elif kind == "message_stop":
            self.stopped = True

    async def _start(self, index: int, cb: Any) -> None:
        ctype = cb.type
        if ctype == "text":
            self._blocks[index] = _Block("text")
            await self._emit(ev.TextStart(index))
            if cb.text:
                self._blocks[index].parts.append(cb.text)
                await self._emit(ev.TextDelta(index, cb.text))
        elif ctype == "thinking":
            block = _Block("thinking")
            self._blocks[index] = block
            await self._emit(ev.ThinkingStart(index))
            if cb.thinking:
                block.parts.append(cb.thinking)
                await self._emit(ev.ThinkingDelta(index, cb.thinking))
            if cb.signature:
                block.signature = cb.signature
        elif ctype == "redacted_thinking":
            block = _Block("redacted")
            block.signature = cb.data  # the opaque data travels in the signature slot until the end
            self._blocks[index] = block
            await self._emit(ev.ThinkingStart(index, redacted=True))
        elif ctype == "tool_use":
            self._blocks[index] = _Block("tool", cb.id, cb.name)
            await self._emit(ev.ToolCallStart(index, cb.id, cb.name))
            initial = getattr(cb, "input", None)
            if initial:  # a non-streamed input (not sent by the API today, but valid)
                raw = json.dumps(initial)
                self._blocks[index].parts.append(raw)
                await self._emit(ev.ToolCallDelta(index, cb.id, raw, dict(initial)))
        else:
            self._blocks[index] = _Block("ignored")  # server tools and their results

    async def _stop(self, index: int) -> None:
        block = self._blocks.get(index)
        if block is None:
            return
        kind = block.kind
        if kind == "text":
            await self._emit(ev.TextEnd(index, "".join(block.parts)))
        elif kind == "thinking":
            await self._emit(ev.ThinkingEnd(index, "".join(block.parts), signature=block.signature))
        elif kind == "redacted":
            await self._emit(ev.ThinkingEnd(index, "", redacted=True, data=block.signature))
        elif kind == "tool":
            await self._emit(end_tool_call(index, block.id, block.name, "".join(block.parts)))
        block.kind = "done"

    async def finish(self, model: str | None = None) -> tuple[str | None, Usage]:
        if not self.stopped:
            raise IncompleteStreamError("the Anthropic stream ended before message_stop")
        for index, block in self._blocks.items():
            if block.kind not in ("done", "ignored"):
                await self._stop(index)
        reason = _FINISH.get(self.finish_reason, self.finish_reason) if self.finish_reason else None
        usage = with_cost(Usage(**self._usage), model or self._model)
        await self._emit(ev.StreamDone(reason, usage))
        return reason, usage


# ---------------------------------------------------------------------------------------------
# Client, errors
# ---------------------------------------------------------------------------------------------


def api_root(api_base: str) -> str | None:
    """The server root the SDK wants (it adds `/v1/messages`): a trailing `/v1` is dropped, so an
    OpenAI-style base URL works too."""
    base = api_base.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base or None


OAUTH_BETA = "oauth-2025-04-20"
"""The `anthropic-beta` header value the Messages API wants with an OAuth bearer token."""


def _credential(endpoint: Endpoint, key_provider: str) -> str:
    """The OAuth token when the endpoint has one (then no key is looked up), else the API key."""
    return endpoint.oauth_token or api_key_for(endpoint, key_provider)


def _make_client(endpoint: Endpoint, api_key: str) -> anthropic.AsyncAnthropic:
    oauth = bool(endpoint.oauth_token) and api_key == endpoint.oauth_token
    return anthropic.AsyncAnthropic(
        api_key=None if oauth else api_key,
        auth_token=api_key if oauth else None,
        default_headers={"anthropic-beta": OAUTH_BETA} if oauth else None,
        base_url=api_root(endpoint.api_base),
        max_retries=0,  # retried by rollouts.providers._retry
        timeout=anthropic.Timeout(endpoint.timeout, connect=min(10.0, endpoint.timeout)),
        http_client=anthropic.DefaultAsyncHttpxClient(verify=shared_ssl_context()),
    )


def _client_key(endpoint: Endpoint, api_key: str) -> Hashable:
    return ("anthropic-sdk", endpoint.api_base, hash(api_key), bool(endpoint.oauth_token), endpoint.timeout)


@asynccontextmanager
async def _open_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[Any]:
    async with pooled_client(_client_key(endpoint, api_key), lambda: _make_client(endpoint, api_key)) as client:
        create = client.messages.create
        stream = await create(**sdk_arguments(anthropic.resources.messages.AsyncMessages.create, body))
        async with stream:
            yield stream


def classify_anthropic_error(exc: Exception, provider: str) -> Failure | None:
    """Map anthropic SDK / httpx2 / our own exceptions to a retry decision and a rollouts error.
    An `error` event inside a 200 stream counts as the status its type stands for."""
    status: int | None = None
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code < 400:
        body = exc.body
        err = body.get("error") if isinstance(body, dict) else None
        etype = err.get("type") if isinstance(err, dict) else None
        status = _STREAM_ERROR_STATUS.get(str(etype), 500)
    return classify_sdk_error(exc, provider, anthropic, status=status)


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


CALL = ProviderCall(
    PROVIDER, build_anthropic_request, _open_stream, AnthropicStreamTranslator, classify_anthropic_error, _credential
)


async def stream_anthropic(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Provider `anthropic`: one streamed Messages API call; returns the actor with the reply."""
    return await CALL.run(actor, on_chunk)
