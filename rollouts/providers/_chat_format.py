"""The OpenAI Chat Completions format, shared by the SDK path (`openai_chat`) and the lean HTTP
path (`openai_http`): request bodies from our Messages, and stream chunks -> our events.

`ChatStreamTranslator.feed` accepts either the SDK's chunk objects or the plain dicts of
`json.loads`, reading fields through `_get`, so both transports run exactly this code.
"""

from __future__ import annotations

import json
import re
import uuid
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
from rollouts.errors import ProviderError
from rollouts.events import OnChunk
from rollouts.providers._pricing import with_cost
from rollouts.providers._retry import IncompleteStreamError
from rollouts.providers._text_tool_calls import extract_text_tool_calls
from rollouts.providers._tool_events import end_tool_call, parse_arguments, tool_call_delta
from rollouts.providers._transform import chat_target, transform_history, with_extra_params

# o-series and gpt-5 reasoning models: max_completion_tokens, reasoning_effort, no temperature.
_REASONING_MODEL = re.compile(r"^(?:[\w.-]+/)?(?:o\d|gpt-5)(?:$|[-.\w])")
# extra_params keys that steer rollouts and are never sent to the API
_LOCAL_PARAMS = frozenset({"api", "keepalive"})  # read by rollouts, never sent
# characters that may open a tool call written as text (held back until the turn ends)
_TEXT_CALL_OPENERS = re.compile(r"[{`<]")

# finish reasons in the shared vocabulary (the scripted provider's)
_FINISH = {"tool_calls": "tool_use", "function_call": "tool_use", "length": "max_tokens", "stop": "stop"}


def is_reasoning_model(model: str) -> bool:
    """o1/o3/o4-mini/gpt-5... take `max_completion_tokens` and `reasoning_effort`, not temperature."""
    return bool(_REASONING_MODEL.match(model.lower()))


def reasoning_effort(endpoint: Endpoint) -> str | None:
    """The reasoning effort `extra_params["reasoning_effort"]` or `Endpoint.thinking` asks for
    (`{"effort"}`, `{"reasoning_effort"}`, or `{"budget_tokens": N}` mapped to low/medium/high);
    None without either."""
    params = endpoint.extra_params or {}
    if "reasoning_effort" in params:
        return str(params["reasoning_effort"])
    thinking = endpoint.thinking
    if not thinking:
        return None
    if thinking.get("effort"):
        return str(thinking["effort"])
    if thinking.get("reasoning_effort"):
        return str(thinking["reasoning_effort"])
    budget = thinking.get("budget_tokens")
    if isinstance(budget, int | float):
        return "low" if budget < 2048 else "medium" if budget < 8192 else "high"
    return "medium"


# ---------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------


def _image_part(block: ImageContent) -> dict[str, Any]:
    url = block.url if block.url is not None else f"data:{block.media_type};base64,{block.data}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(message: Message) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    if not any(isinstance(b, ImageContent) for b in message.content):
        return message.text
    parts: list[dict[str, Any]] = []
    for b in message.content:
        if isinstance(b, TextContent):
            parts.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageContent):
            parts.append(_image_part(b))
    return parts


def _assistant_message(message: Message, *, compat: bool) -> dict[str, Any]:
    text_parts: list[str] = []
    calls: list[dict[str, Any]] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            text_parts.append(b.text)
        elif isinstance(b, ToolCallContent):
            raw = b.raw_arguments if b.parse_error is not None and b.raw_arguments else json.dumps(dict(b.arguments))
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": raw}})
        elif isinstance(b, ThinkingContent):
            continue  # Chat Completions cannot take reasoning back
    text = "".join(text_parts)
    # null content only beside tool calls (OpenAI rejects an assistant message with neither)
    out: dict[str, Any] = {"role": "assistant", "content": text if text or compat or not calls else None}
    if calls:
        out["tool_calls"] = calls
    return out


def chat_messages(messages: tuple[Message, ...], *, compat: bool) -> list[dict[str, Any]]:
    """Our messages as Chat Completions messages. `compat` sends `""` instead of null content
    (several self-hosted servers reject null)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            out.append({"role": "system", "content": m.text})
        elif m.role == "user":
            out.append({"role": "user", "content": _user_content(m)})
        elif m.role == "assistant":
            out.append(_assistant_message(m, compat=compat))
        else:
            assert m.tool_call_id is not None
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.text})
    return out


def chat_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
    ]


def build_chat_request(actor: Actor, *, compat: bool) -> dict[str, Any]:
    """The JSON body of a streamed chat completion for `actor` (extra_params merged last)."""
    ep = actor.endpoint
    reasoning = not compat and is_reasoning_model(ep.model)
    body: dict[str, Any] = {
        "model": ep.model,
        "messages": chat_messages(
            transform_history(actor.trajectory.messages, chat_target(ep.provider)), compat=compat
        ),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if actor.tools:
        body["tools"] = chat_tools(actor.tools)
    if compat:
        body["max_tokens"] = ep.max_tokens
    else:
        body["max_completion_tokens"] = ep.max_tokens
    if reasoning:
        effort = reasoning_effort(ep)
        if effort is not None:
            body["reasoning_effort"] = effort
    elif ep.temperature is not None:
        body["temperature"] = ep.temperature
    return with_extra_params(body, ep.extra_params, _LOCAL_PARAMS)


# ---------------------------------------------------------------------------------------------
# Stream chunks -> events
# ---------------------------------------------------------------------------------------------


_NO_EXTRA = object()


def _get(obj: Any, name: str) -> Any:
    """A field of an SDK object or of a dict (None when absent).

    For SDK (pydantic) objects the instance dict and the extras are read directly: a plain
    `getattr` on a missing field raises and catches AttributeError inside pydantic, which costs
    ~3 us, several times per chunk."""
    if type(obj) is dict:
        return obj.get(name)
    if obj is None:
        return None
    d = getattr(obj, "__dict__", None)
    if d is not None:
        if name in d:
            return d[name]
        extra: Any = getattr(obj, "__pydantic_extra__", _NO_EXTRA)
        if extra is not _NO_EXTRA:
            return extra.get(name) if extra else None
    return getattr(obj, name, None)


def usage_from_chat(raw: Any) -> Usage:
    """Usage from a Chat Completions `usage` object or dict. `input_tokens` excludes cached
    prompt tokens (reported as `cache_read_tokens`); `output_tokens` includes reasoning."""
    prompt = _get(raw, "prompt_tokens") or 0
    completion = _get(raw, "completion_tokens") or 0
    pdetails = _get(raw, "prompt_tokens_details")
    cdetails = _get(raw, "completion_tokens_details")
    cached = (_get(pdetails, "cached_tokens") or 0) if pdetails is not None else 0
    reasoning = (_get(cdetails, "reasoning_tokens") or 0) if cdetails is not None else 0
    return Usage(
        input_tokens=max(0, prompt - cached),
        output_tokens=completion,
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )


class _Call:
    __slots__ = ("content_index", "ended", "id", "name", "parts")

    def __init__(self, content_index: int, call_id: str, name: str) -> None:
        self.content_index = content_index
        self.id = call_id
        self.name = name
        self.parts: list[str] = []
        self.ended = False

    def complete(self) -> bool:
        """Whether the arguments so far are a whole JSON object (no valid piece can follow)."""
        if not self.parts:
            return False
        try:
            parse_arguments("".join(self.parts))
        except ValueError:
            return False
        return True


class ChatStreamTranslator:
    """Feed Chat Completions chunks in order; `finish()` closes open blocks and emits StreamDone.

    Blocks get content indices in the order they open, and every block (text, thinking, tool
    call) ends before the next one starts, so the events follow the grammar of `events.py`. A
    tool call ends with `ToolCallEnd` or, when its arguments are not a JSON object,
    `ToolCallError`. Parallel calls (told apart by `index`) stream one at a time: a call that
    starts while the open one's arguments are still incomplete (a server that interleaves the
    deltas of parallel calls) is held back, with its deltas, until the open call's arguments
    are complete (or a text block or the end of the turn closes it); then it starts and its
    held deltas follow, as they came. So the events are the same as if the server had sent the
    calls one after the other: no call ends early, no delta follows its call's end (a piece that
    arrives for a call whose arguments were already a whole JSON object is ignored).

    With `text_tool_names`, text from the first `{`, backtick or `<` on is held back until the
    end and turned into tool calls if it holds calls to those tools (see `_text_tool_calls`);
    otherwise it is emitted as text unchanged. `text_tool_limit=1` keeps only the first such
    call (the request asked for `parallel_tool_calls: false`). With `model`, the usage's `cost_usd` comes from
    the price table (`_pricing`; `price_expected=False` for self-hosted models: no warning when
    the table has no price).
    """

    __slots__ = (
        "_block_index",
        "_block_kind",
        "_block_parts",
        "_by_id",
        "_calls",
        "_emit",
        "_held",
        "_model",
        "_next_index",
        "_open_call",
        "_price_expected",
        "_queued",
        "_text_tool_limit",
        "_text_tool_names",
        "finish_reason",
        "usage_raw",
    )

    def __init__(
        self,
        emit: OnChunk,
        *,
        text_tool_names: frozenset[str] | None = None,
        text_tool_limit: int | None = None,
        model: str = "",
        price_expected: bool = True,
    ) -> None:
        self._emit = emit
        self._model = model
        self._price_expected = price_expected
        self._next_index = 0
        self._block_kind: str | None = None  # "text" | "thinking" while one is open
        self._block_index = -1
        self._block_parts: list[str] = []
        self._calls: dict[int, _Call] = {}
        self._open_call: _Call | None = None
        self._queued: list[_Call] = []  # started while the open call was incomplete; not emitted yet
        self._by_id: dict[str, int] = {}
        self._held: list[str] | None = None
        self._text_tool_names = text_tool_names or None
        self._text_tool_limit = text_tool_limit
        self.finish_reason: str | None = None
        self.usage_raw: Any = None

    async def feed(self, chunk: Any) -> None:
        """Translate one chunk (an SDK `ChatCompletionChunk` or its JSON dict)."""
        err = _get(chunk, "error")
        if err:
            message = _get(err, "message") or str(err)
            raise ProviderError(f"error event in the stream: {message}", retryable=True)
        usage = _get(chunk, "usage")
        if usage:
            self.usage_raw = usage
        choices = _get(chunk, "choices")
        if not choices:
            return
        choice = choices[0]
        delta = _get(choice, "delta")
        if delta is not None:
            reasoning = _get(delta, "reasoning_content") or _get(delta, "reasoning")
            if reasoning:
                await self._block_delta("thinking", reasoning)
            content = _get(delta, "content")
            if content:
                await self._text(content)
            calls = _get(delta, "tool_calls")
            if calls:
                for tc in calls:
                    await self._tool_delta(tc)
        reason = _get(choice, "finish_reason")
        if reason:
            self.finish_reason = reason

    # -- blocks --------------------------------------------------------------------------------

    async def _close_block(self) -> None:
        kind = self._block_kind
        if kind is None:
            return
        text = "".join(self._block_parts)
        if kind == "text":
            await self._emit(ev.TextEnd(self._block_index, text))
        else:
            await self._emit(ev.ThinkingEnd(self._block_index, text))
        self._block_kind = None
        self._block_parts = []

    async def _block_delta(self, kind: str, piece: str) -> None:
        if self._block_kind != kind:
            await self._close_block()
            await self._close_open_call()
            self._block_kind = kind
            self._block_index = self._next_index
            self._next_index += 1
            await self._emit(ev.TextStart(self._block_index) if kind == "text" else ev.ThinkingStart(self._block_index))
        self._block_parts.append(piece)
        if kind == "text":
            await self._emit(ev.TextDelta(self._block_index, piece))
        else:
            await self._emit(ev.ThinkingDelta(self._block_index, piece))

    async def _text(self, piece: str) -> None:
        if self._held is not None:
            self._held.append(piece)
            return
        if self._text_tool_names is not None:
            m = _TEXT_CALL_OPENERS.search(piece)
            if m is not None:
                if m.start() > 0:
                    await self._block_delta("text", piece[: m.start()])
                self._held = [piece[m.start() :]]
                return
        await self._block_delta("text", piece)

    async def _start_call(self, call_id: str, name: str) -> _Call:
        """A new call: opened now, or queued while the open call's arguments are incomplete."""
        await self._close_block()
        call = _Call(self._next_index, call_id, name)
        self._next_index += 1
        open_call = self._open_call
        if open_call is not None and (self._queued or not open_call.complete()):
            self._queued.append(call)
            return call
        await self._close_open_call()
        await self._open(call)
        return call

    async def _open(self, call: _Call) -> None:
        self._open_call = call
        await self._emit(ev.ToolCallStart(call.content_index, call.id, call.name))
        raw = ""
        for piece in call.parts:  # the deltas that arrived while it was queued, as they came
            raw += piece
            await self._emit(tool_call_delta(call.content_index, call.id, piece, raw))

    async def _end(self, call: _Call) -> None:
        call.ended = True
        await self._emit(end_tool_call(call.content_index, call.id, call.name, "".join(call.parts)))

    async def _close_open_call(self) -> None:
        """End the open call and every queued one, in order."""
        call = self._open_call
        if call is None:
            return
        self._open_call = None
        await self._end(call)
        queued, self._queued = self._queued, []
        for q in queued:
            await self._open(q)
            self._open_call = None
            await self._end(q)

    async def _advance_queue(self) -> None:
        """While the open call's arguments are complete, end it and open the next queued one."""
        while self._queued and self._open_call is not None and self._open_call.complete():
            await self._end(self._open_call)
            self._open_call = self._queued.pop(0)
            await self._open(self._open_call)

    async def _tool_delta(self, tc: Any) -> None:
        index = _get(tc, "index")
        call_id = _get(tc, "id")
        fn = _get(tc, "function")
        if index is None:  # some servers omit it: a new id means a new call
            if call_id and call_id not in self._by_id:
                index = len(self._calls)
            else:
                index = self._by_id.get(call_id, len(self._calls) - 1) if call_id else len(self._calls) - 1
        call = self._calls.get(index)
        if call is None:
            name = (_get(fn, "name") if fn is not None else None) or ""
            call = await self._start_call(call_id or f"call_{uuid.uuid4().hex[:24]}", name)
            self._calls[index] = call
            self._by_id[call.id] = index
        args = _get(fn, "arguments") if fn is not None else None
        if args and not call.ended:
            if not isinstance(args, str):
                args = json.dumps(args)
            call.parts.append(args)
            if call is self._open_call:
                await self._emit(tool_call_delta(call.content_index, call.id, args, "".join(call.parts)))
                if self._queued:
                    await self._advance_queue()

    async def _release_held(self) -> bool:
        """Emit held-back text as text or as tool calls; True if tool calls were found."""
        held, self._held = self._held, None
        if not held:
            return False
        text = "".join(held)
        assert self._text_tool_names is not None
        found, rest = extract_text_tool_calls(text, self._text_tool_names, limit=self._text_tool_limit)
        if not found:
            await self._block_delta("text", text)
            return False
        rest = rest.rstrip() if self._block_kind == "text" else rest.strip()
        if rest:
            await self._block_delta("text", rest)
        for tc in found:
            await self._close_open_call()
            call = await self._start_call(f"call_{uuid.uuid4().hex[:24]}", tc.name)
            call.parts.append(tc.raw_arguments)
            await self._emit(ev.ToolCallDelta(call.content_index, call.id, tc.raw_arguments, tc.arguments))
        return True

    async def finish(self, *, require_finish_reason: bool = True) -> tuple[str | None, Usage]:
        """Close everything and emit StreamDone. Raises IncompleteStreamError when the stream
        ended without a finish reason (a truncated stream) and `require_finish_reason`."""
        if self.finish_reason is None and require_finish_reason:
            raise IncompleteStreamError("the stream ended before the model finished (no finish_reason)")
        text_calls = await self._release_held()
        await self._close_block()
        await self._close_open_call()
        raw = self.finish_reason
        # a reply cut at max_tokens stays cut even if its text held a complete tool call
        reason = (
            "max_tokens" if raw == "length" else "tool_use" if text_calls else _FINISH.get(raw, raw) if raw else None
        )
        usage = usage_from_chat(self.usage_raw) if self.usage_raw is not None else Usage()
        if self._model:
            usage = with_cost(usage, self._model, warn=self._price_expected)
        await self._emit(ev.StreamDone(reason, usage))
        return reason, usage
