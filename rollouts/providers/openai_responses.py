"""OpenAI Responses API, streamed through the official `openai` SDK.

Provider name `openai-responses` (the `openai` provider routes here for Responses-only models or
`extra_params={"api": "responses"}`). Key from `Endpoint.api_key` or `OPENAI_API_KEY`.

Request (`build_responses_request`), stateless (`store: false`, the whole history every call):
* history goes through `_transform.transform_history` first;
* leading system messages become `instructions`; later ones are `developer` messages;
* user text and images -> `input_text` / `input_image`; assistant text -> an assistant `message`
  item; tool calls -> `function_call` items; tool results -> `function_call_output` items;
* reasoning models (o-series, gpt-5...) get `reasoning: {effort, summary: "auto"}` (effort from
  `Endpoint.thinking` `{"effort": ...}` / `{"budget_tokens": N}` or `extra_params
  ["reasoning_effort"]`) and `include: ["reasoning.encrypted_content"]`; their reasoning items
  come back as thinking blocks whose `signature` is the JSON `{"id", "encrypted_content"}` and
  are sent back verbatim as `reasoning` items on later turns;
* our tool-call id is `"<call_id>|<item id>"` so both ids survive a round trip; foreign ids are
  used as `call_id` as they are (mapped only when not `[A-Za-z0-9_-]{1,64}`).

Stream: `response.output_item.added/done`, `response.output_text.delta`,
`response.reasoning_summary_text.delta`, `response.function_call_arguments.delta`,
`response.completed` (usage) become our events, one content block per output item
(`content_index` = `output_index`). `response.failed`, `response.incomplete` and `error` events
are handled: incomplete -> finish reason `max_tokens`; failures -> retried or raised.
Usage: `input_tokens` excludes cached tokens (`cache_read_tokens`), `output_tokens` includes
reasoning (`reasoning_tokens`), `cost_usd` from `_pricing`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from rollouts.dtypes import (
    Actor,
    Completion,
    Endpoint,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolCallContent,
    Usage,
)
from rollouts.errors import AuthenticationError, ContextTooLongError, ProviderError
from rollouts.events import (
    LLMCallStart,
    OnChunk,
    StreamDone,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)
from rollouts.partial_json import parse_partial_json
from rollouts.providers._aggregate import MessageBuilder, append_assistant
from rollouts.providers._chat_format import is_reasoning_model
from rollouts.providers._pricing import with_cost
from rollouts.providers._retry import Failure, IncompleteStreamError, is_context_too_long, stream_with_retries
from rollouts.providers._transform import Target, thinking_origin, transform_history
from rollouts.providers.openai_chat import classify_openai_error, sdk_client

_ORIGINS = frozenset({"openai", "openai-responses"})
_LOCAL_PARAMS = frozenset({"api", "reasoning_effort", "reasoning_summary"})
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _native_thinking(block: ThinkingContent, message: Message) -> bool:
    return thinking_origin(block, message) in _ORIGINS and _reasoning_item(block) is not None


def _valid_id(tool_call_id: str) -> bool:
    parts = tool_call_id.split("|")
    if len(parts) > 2:
        return False
    return all(0 < len(p) <= 64 and set(p) <= _SAFE for p in parts)


TARGET = Target("openai-responses", native_thinking=_native_thinking, max_id_len=64, valid_id=_valid_id)


def _reasoning_item(block: ThinkingContent) -> dict[str, Any] | None:
    """The reasoning item a thinking block's signature records, or None."""
    if not block.signature or not block.signature.startswith("{"):
        return None
    try:
        data = json.loads(block.signature)
    except ValueError:
        return None
    if not isinstance(data, dict) or not str(data.get("id", "")).startswith("rs"):
        return None
    return data


# ---------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------


def _split_id(tool_call_id: str) -> tuple[str, str | None]:
    call_id, _, item_id = tool_call_id.partition("|")
    return call_id, item_id or None


def _user_content(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            parts.append({"type": "input_text", "text": b.text})
        elif isinstance(b, ImageContent):
            url = b.url if b.url is not None else f"data:{b.media_type};base64,{b.data}"
            parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return parts


def _assistant_items(message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    # A reasoning item without encrypted content cannot be replayed statelessly (store=false):
    # it is left out, and so are the item ids of the calls that followed it, which the API
    # would otherwise reject as missing their reasoning item.
    reasoning = [_reasoning_item(b) for b in message.blocks if isinstance(b, ThinkingContent)]
    keep_item_ids = all(r is not None and r.get("encrypted_content") for r in reasoning)
    for b in message.blocks:
        if isinstance(b, ThinkingContent):
            item = _reasoning_item(b)
            assert item is not None, "foreign thinking must be transformed before building the request"
            if not item.get("encrypted_content"):
                continue
            summary = [{"type": "summary_text", "text": b.thinking}] if b.thinking else []
            out: dict[str, Any] = {"type": "reasoning", "id": item["id"], "summary": summary}
            if item.get("encrypted_content"):
                out["encrypted_content"] = item["encrypted_content"]
            items.append(out)
        elif isinstance(b, TextContent):
            if b.text:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": b.text, "annotations": []}],
                    }
                )
        elif isinstance(b, ToolCallContent):
            call_id, item_id = _split_id(b.id)
            raw = b.raw_arguments if b.parse_error is not None and b.raw_arguments else json.dumps(dict(b.arguments))
            call: dict[str, Any] = {"type": "function_call", "call_id": call_id, "name": b.name, "arguments": raw}
            if item_id and keep_item_ids:
                call["id"] = item_id
            items.append(call)
    return items


def responses_input(messages: tuple[Message, ...]) -> tuple[str | None, list[dict[str, Any]]]:
    """(instructions, input items) for already-transformed `messages`."""
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    leading = True
    for m in messages:
        if m.role == "system":
            if leading:
                instructions.append(m.text)
            else:
                items.append({"role": "developer", "content": m.text})
            continue
        leading = False
        if m.role == "user":
            items.append({"role": "user", "content": _user_content(m)})
        elif m.role == "assistant":
            items.extend(_assistant_items(m))
        else:
            assert m.tool_call_id is not None
            call_id, _ = _split_id(m.tool_call_id)
            items.append({"type": "function_call_output", "call_id": call_id, "output": m.text})
    return ("\n\n".join(instructions) if instructions else None), items


def responses_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": dict(t.parameters),
            "strict": False,
        }
        for t in tools
    ]


def _effort(endpoint: Endpoint) -> str:
    params = endpoint.extra_params or {}
    if "reasoning_effort" in params:
        return str(params["reasoning_effort"])
    thinking = endpoint.thinking or {}
    if thinking.get("effort"):
        return str(thinking["effort"])
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int | float):
        return "low" if budget < 2048 else "medium" if budget < 8192 else "high"
    return "medium"


def build_responses_request(actor: Actor) -> dict[str, Any]:
    """The keyword arguments of `responses.create(stream=True)` for `actor`."""
    ep = actor.endpoint
    instructions, items = responses_input(transform_history(actor.trajectory.messages, TARGET))
    body: dict[str, Any] = {
        "model": ep.model,
        "input": items,
        "stream": True,
        "store": False,
        "max_output_tokens": ep.max_tokens,
    }
    if instructions:
        body["instructions"] = instructions
    if actor.tools:
        body["tools"] = responses_tools(actor.tools)
    if is_reasoning_model(ep.model) or ep.thinking:
        summary = (ep.extra_params or {}).get("reasoning_summary", "auto")
        body["reasoning"] = {"effort": _effort(ep), "summary": summary}
        body["include"] = ["reasoning.encrypted_content"]
    elif ep.temperature is not None:
        body["temperature"] = ep.temperature
    for k, v in (ep.extra_params or {}).items():
        if k not in _LOCAL_PARAMS:
            body[k] = v
    return body


# ---------------------------------------------------------------------------------------------
# Stream events -> our events
# ---------------------------------------------------------------------------------------------


class ResponseFailed(Exception):
    """A `response.failed` or `error` event: `code` and `message` from the server."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message


class _Item:
    __slots__ = ("call_id", "id", "kind", "name", "parts")

    def __init__(self, kind: str, item_id: str = "", call_id: str = "", name: str = "") -> None:
        self.kind = kind
        self.id = item_id
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []


def usage_from_responses(raw: Any, model: str) -> Usage:
    if raw is None:
        return Usage()
    idet = getattr(raw, "input_tokens_details", None)
    odet = getattr(raw, "output_tokens_details", None)
    cached = (getattr(idet, "cached_tokens", 0) or 0) if idet is not None else 0
    written = (getattr(idet, "cache_write_tokens", 0) or 0) if idet is not None else 0
    reasoning = (getattr(odet, "reasoning_tokens", 0) or 0) if odet is not None else 0
    usage = Usage(
        input_tokens=max(0, (raw.input_tokens or 0) - cached - written),
        output_tokens=raw.output_tokens or 0,
        cache_read_tokens=cached,
        cache_write_tokens=written,
        reasoning_tokens=reasoning,
    )
    return with_cost(usage, model)


class ResponsesStreamTranslator:
    """Feed Responses stream events in order; `finish()` emits StreamDone."""

    __slots__ = ("_emit", "_items", "_summary_index", "done", "finish_reason", "got_output", "has_calls", "usage_raw")

    def __init__(self, emit: OnChunk) -> None:
        self._emit = emit
        self._items: dict[int, _Item] = {}
        self._summary_index: dict[int, int] = {}
        self.finish_reason: str | None = None
        self.usage_raw: Any = None
        self.got_output = False
        self.has_calls = False
        self.done = False

    async def feed(self, event: Any) -> None:
        kind = event.type
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            index = event.output_index
            self._items[index].parts.append(event.delta)
            await self._emit(TextDelta(index, event.delta))
        elif kind == "response.function_call_arguments.delta":
            index = event.output_index
            item = self._items[index]
            item.parts.append(event.delta)
            try:
                partial = parse_partial_json("".join(item.parts))
            except ValueError:
                partial = None
            await self._emit(
                ToolCallDelta(index, self._call_id(item), event.delta, partial if isinstance(partial, dict) else None)
            )
        elif kind == "response.reasoning_summary_text.delta":
            index = event.output_index
            item = self._items[index]
            piece = event.delta
            last = self._summary_index.get(index)
            if last is not None and last != event.summary_index and item.parts:
                piece = "\n\n" + piece  # summary parts are separate paragraphs
            self._summary_index[index] = event.summary_index
            item.parts.append(piece)
            await self._emit(ThinkingDelta(index, piece))
        elif kind == "response.output_item.added":
            await self._added(event.output_index, event.item)
        elif kind == "response.output_item.done":
            await self._done(event.output_index, event.item)
        elif kind == "response.completed":
            self.done = True
            self.usage_raw = event.response.usage
        elif kind == "response.incomplete":
            self.done = True
            self.usage_raw = event.response.usage
            details = event.response.incomplete_details
            reason = getattr(details, "reason", None) if details is not None else None
            self.finish_reason = "max_tokens" if reason == "max_output_tokens" else (reason or "incomplete")
        elif kind == "response.failed":
            err = event.response.error
            raise ResponseFailed(str(getattr(err, "code", "") or ""), str(getattr(err, "message", "") or "failed"))
        elif kind == "error":
            raise ResponseFailed(str(event.code or ""), str(event.message or "error event"))

    @staticmethod
    def _call_id(item: _Item) -> str:
        return f"{item.call_id}|{item.id}" if item.id else item.call_id

    async def _added(self, index: int, raw: Any) -> None:
        itype = raw.type
        self.got_output = True
        if itype == "message":
            self._items[index] = _Item("text", raw.id)
            await self._emit(TextStart(index))
        elif itype == "reasoning":
            self._items[index] = _Item("thinking", raw.id)
            await self._emit(ThinkingStart(index))
        elif itype == "function_call":
            item = _Item("tool", raw.id or "", raw.call_id, raw.name)
            self._items[index] = item
            self.has_calls = True
            await self._emit(ToolCallStart(index, self._call_id(item), item.name))
        else:
            self._items[index] = _Item("ignored", getattr(raw, "id", "") or "")

    async def _done(self, index: int, raw: Any) -> None:
        item = self._items.get(index)
        if item is None or item.kind in ("done", "ignored"):
            return
        kind, item.kind = item.kind, "done"
        if kind == "text":
            await self._emit(TextEnd(index, "".join(item.parts)))
        elif kind == "thinking":
            signature = json.dumps(
                {"id": raw.id, "encrypted_content": getattr(raw, "encrypted_content", None)}, separators=(",", ":")
            )
            await self._emit(ThinkingEnd(index, "".join(item.parts), signature=signature))
        elif kind == "tool":
            raw_args = "".join(item.parts) or (getattr(raw, "arguments", "") or "")
            call_id = self._call_id(item)
            try:
                args = json.loads(raw_args) if raw_args.strip() else {}
                if not isinstance(args, dict):
                    raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
            except ValueError as e:
                await self._emit(ToolCallError(index, call_id, item.name, f"invalid JSON arguments: {e}", raw_args))
            else:
                await self._emit(ToolCallEnd(index, ToolCall(call_id, item.name, args, raw_args)))

    async def finish(self, model: str) -> tuple[str | None, Usage]:
        if not self.done:
            raise IncompleteStreamError("the Responses stream ended before response.completed")
        for index, item in list(self._items.items()):
            if item.kind not in ("done", "ignored"):
                await self._done(index, _Item(item.kind, item.id))
        reason = self.finish_reason or ("tool_use" if self.has_calls else "stop")
        usage = usage_from_responses(self.usage_raw, model)
        await self._emit(StreamDone(reason, usage))
        return reason, usage


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


def _api_key(endpoint: Endpoint) -> str:
    key = endpoint.api_key or os.environ.get("OPENAI_API_KEY", "")
    if not key:
        raise AuthenticationError(
            "no OpenAI API key: set the OPENAI_API_KEY environment variable or Endpoint.api_key",
            provider=endpoint.provider,
        )
    return key


_CREATE_PARAMS: frozenset[str] | None = None


def _create_params() -> frozenset[str]:
    global _CREATE_PARAMS
    if _CREATE_PARAMS is None:
        import inspect

        from openai.resources.responses import AsyncResponses

        sig = inspect.signature(AsyncResponses.create)
        _CREATE_PARAMS = frozenset(p for p in sig.parameters if p not in ("self", "extra_body"))
    return _CREATE_PARAMS


@asynccontextmanager
async def _open_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[Any]:
    known = _create_params()
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    async with sdk_client(endpoint, api_key) as client:
        stream = await client.responses.create(**kwargs, extra_body=extra or None)
        async with stream:
            yield stream


def classify_responses_error(exc: Exception, provider: str) -> Failure | None:
    if isinstance(exc, ResponseFailed):
        text = f"{provider}: response failed: {exc}"
        if is_context_too_long(exc.message, exc.code):
            return Failure(ContextTooLongError(text, provider=provider))
        retryable = exc.code in ("", "server_error", "rate_limit_exceeded", "overloaded", "internal_error")
        return Failure(ProviderError(text, provider=provider, retryable=retryable))
    return classify_openai_error(exc, provider)


async def stream_openai_responses(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Provider `openai-responses`: one streamed Responses API call."""
    ep = actor.endpoint
    provider = ep.provider
    api_key = _api_key(ep)
    started = time.perf_counter()
    await on_chunk(LLMCallStart(provider=provider, model=ep.model))
    body = build_responses_request(actor)
    builder = MessageBuilder(provider, ep.model)
    first_event_at: float | None = None

    async def emit(event: StreamEvent) -> None:
        builder.feed(event)
        await on_chunk(event)

    async def attempt(emit: OnChunk, n: int) -> str | None:
        nonlocal first_event_at
        async with _open_stream(ep, body, api_key) as stream:
            await emit(StreamStart(attempt=n))
            translator = ResponsesStreamTranslator(emit)
            async for event in stream:
                if first_event_at is None:
                    first_event_at = time.perf_counter()
                await translator.feed(event)
            reason, _ = await translator.finish(ep.model)
            return reason

    def classify(exc: Exception) -> Failure | None:
        return classify_responses_error(exc, provider)

    finish_reason, attempts = await stream_with_retries(
        attempt, endpoint=ep, on_chunk=emit, classify=classify, secret=api_key
    )
    message = builder.finish()
    completion = Completion(
        provider=provider,
        model=ep.model,
        finish_reason=finish_reason,
        message_index=len(actor.trajectory.messages),
        duration_s=time.perf_counter() - started,
        time_to_first_token_s=(first_event_at - started) if first_event_at is not None else None,
        attempts=attempts,
    )
    return append_assistant(actor, message, completion)
