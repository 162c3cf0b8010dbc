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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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
from rollouts.errors import ContextTooLongError, ProviderError
from rollouts.events import OnChunk
from rollouts.providers._call import ProviderCall
from rollouts.providers._chat_format import is_reasoning_model, reasoning_effort
from rollouts.providers._pooled import sdk_arguments
from rollouts.providers._pricing import with_cost
from rollouts.providers._retry import Failure, IncompleteStreamError, is_context_too_long
from rollouts.providers._tool_events import end_tool_call, tool_call_delta
from rollouts.providers._transform import Target, thinking_origin, transform_history, with_extra_params
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
        body["reasoning"] = {"effort": reasoning_effort(ep) or "medium", "summary": summary}
        body["include"] = ["reasoning.encrypted_content"]
    elif ep.temperature is not None:
        body["temperature"] = ep.temperature
    return with_extra_params(body, ep.extra_params, _LOCAL_PARAMS)


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
    """Feed Responses stream events in order; `finish()` emits StreamDone (`model` prices the
    usage; `finish(model)` may name another)."""

    __slots__ = ("_emit", "_items", "_model", "_summary_index", "done", "finish_reason", "has_calls", "usage_raw")

    def __init__(self, emit: OnChunk, model: str = "") -> None:
        self._emit = emit
        self._model = model
        self._items: dict[int, _Item] = {}
        self._summary_index: dict[int, int] = {}
        self.finish_reason: str | None = None
        self.usage_raw: Any = None
        self.has_calls = False
        self.done = False

    async def feed(self, event: Any) -> None:
        kind = event.type
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            index = event.output_index
            self._items[index].parts.append(event.delta)
            await self._emit(ev.TextDelta(index, event.delta))
        elif kind == "response.function_call_arguments.delta":
            index = event.output_index
            item = self._items[index]
            item.parts.append(event.delta)
            await self._emit(tool_call_delta(index, self._call_id(item), event.delta, "".join(item.parts)))
        elif kind == "response.reasoning_summary_text.delta":
            index = event.output_index
            item = self._items[index]
            piece = event.delta
            last = self._summary_index.get(index)
            if last is not None and last != event.summary_index and item.parts:
                piece = "\n\n" + piece  # summary parts are separate paragraphs
            self._summary_index[index] = event.summary_index
            item.parts.append(piece)
            await self._emit(ev.ThinkingDelta(index, piece))
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
        if itype == "message":
            self._items[index] = _Item("text", raw.id)
            await self._emit(ev.TextStart(index))
        elif itype == "reasoning":
            self._items[index] = _Item("thinking", raw.id)
            await self._emit(ev.ThinkingStart(index))
        elif itype == "function_call":
            item = _Item("tool", raw.id or "", raw.call_id, raw.name)
            self._items[index] = item
            self.has_calls = True
            await self._emit(ev.ToolCallStart(index, self._call_id(item), item.name))
        else:
            self._items[index] = _Item("ignored", getattr(raw, "id", "") or "")

    async def _done(self, index: int, raw: Any) -> None:
        item = self._items.get(index)
        if item is None or item.kind in ("done", "ignored"):
            return
        kind, item.kind = item.kind, "done"
        if kind == "text":
            await self._emit(ev.TextEnd(index, "".join(item.parts)))
        elif kind == "thinking":
            signature = json.dumps(
                {"id": raw.id, "encrypted_content": getattr(raw, "encrypted_content", None)}, separators=(",", ":")
            )
            await self._emit(ev.ThinkingEnd(index, "".join(item.parts), signature=signature))
        elif kind == "tool":
            raw_args = "".join(item.parts) or (getattr(raw, "arguments", "") or "")
            await self._emit(end_tool_call(index, self._call_id(item), item.name, raw_args))

    async def finish(self, model: str | None = None) -> tuple[str | None, Usage]:
        if not self.done:
            raise IncompleteStreamError("the Responses stream ended before response.completed")
        for index, item in list(self._items.items()):
            if item.kind not in ("done", "ignored"):
                await self._done(index, _Item(item.kind, item.id))
        reason = self.finish_reason or ("tool_use" if self.has_calls else "stop")
        usage = usage_from_responses(self.usage_raw, model or self._model)
        await self._emit(ev.StreamDone(reason, usage))
        return reason, usage


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


@asynccontextmanager
async def _open_stream(endpoint: Endpoint, body: dict[str, Any], api_key: str) -> AsyncIterator[Any]:
    from openai.resources.responses import AsyncResponses

    async with sdk_client(endpoint, api_key) as client:
        stream = await client.responses.create(**sdk_arguments(AsyncResponses.create, body))
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


CALL = ProviderCall(
    "openai-responses", build_responses_request, _open_stream, ResponsesStreamTranslator, classify_responses_error
)


async def stream_openai_responses(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Provider `openai-responses`: one streamed Responses API call."""
    return await CALL.run(actor, on_chunk)
