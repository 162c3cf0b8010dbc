"""Scripted models: deterministic replies streamed exactly like a real provider streams them.

    model = ScriptedModel([tool_call("add", value=5), "The answer is 5."])
    endpoint = model.endpoint            # Endpoint(provider="scripted", model=model.name)

Replies come from a list (one per call, in order) or from a function of the request, sync or
async: `ScriptedModel(lambda req: f"Answer: {req.last_user_text}")`. A reply is a string, a
`ScriptedReply` (text, thinking, tool calls, usage), or an exception instance to raise.

Each call emits LLMCallStart, StreamStart, thinking/text blocks in several deltas, tool calls with
argument deltas and partial parses, then StreamDone with usage — the same sequence the real
providers emit — and runs through the same call skeleton (`_call.run_call`: retry loop,
aggregation, Completion) as the real providers, so tests exercise the real code path. An
exception in the script stands for the provider's final error (after its retries): it is
raised as it is, never retried.

Tool calls without an id get `call_<turn>_<n>`: `<turn>` counts the assistant messages of the
conversation (this reply's included) and `<n>` the call within the reply, so ids are
deterministic and unique within a conversation, also when a saved session is continued by
another process (whose model has made no calls yet).
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import trio

from rollouts import events as ev
from rollouts.dtypes import Actor, Endpoint, Message, Tool, Usage
from rollouts.errors import RolloutsError
from rollouts.events import OnChunk, StreamEvent
from rollouts.providers._call import run_call
from rollouts.providers._tool_events import end_tool_call, tool_call_delta


@dataclass(frozen=True)
class ScriptedToolCall:
    """A tool call in a scripted reply. `arguments` may be a raw string (e.g. malformed JSON)."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None


def tool_call(name: str, /, **arguments: Any) -> ScriptedReply:
    """A reply consisting of one tool call: `tool_call("add", value=5)`."""
    return ScriptedReply(tool_calls=(ScriptedToolCall(name, arguments),))


@dataclass(frozen=True)
class ScriptedReply:
    """One scripted model reply: optional thinking, then text, then tool calls; `usage` (else an
    estimate of ~4 characters per token) and `finish_reason` (else `tool_use`/`stop`)."""

    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    thinking: str | None = None
    usage: Usage | None = None
    finish_reason: str | None = None


@dataclass(frozen=True)
class ScriptedRequest:
    """What a reply function sees."""

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...]
    endpoint: Endpoint
    call_index: int

    @property
    def system(self) -> str:
        """The system prompt (all system messages' text joined), or ''."""
        return "\n".join(m.text for m in self.messages if m.role == "system")

    @property
    def last_user_text(self) -> str:
        """The text of the last user message, or ''."""
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text
        return ""


ReplyLike: TypeAlias = str | ScriptedReply | BaseException
ReplyFn: TypeAlias = Callable[[ScriptedRequest], ReplyLike | Awaitable[ReplyLike]]


class ScriptExhaustedError(RolloutsError):
    """A list-scripted model was called more times than it has replies."""


_MODELS: dict[str, ScriptedModel] = {}
_ids = itertools.count(1)


class ScriptedModel:
    """A model whose replies are scripted. See the module docstring."""

    def __init__(
        self,
        replies: Sequence[ReplyLike] | ReplyFn,
        *,
        name: str | None = None,
        latency_s: float = 0.0,
        chunk_size: int = 8,
        chunk_delay_s: float = 0.0,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"ScriptedModel: chunk_size must be >= 1 character, got {chunk_size}")
        if chunk_delay_s < 0 or latency_s < 0:
            raise ValueError(
                f"ScriptedModel: delays must be >= 0, got latency_s={latency_s}, chunk_delay_s={chunk_delay_s}"
            )
        self.name = name or f"scripted-{next(_ids)}"
        self.latency_s = latency_s
        self.chunk_delay_s = chunk_delay_s
        self.chunk_size = chunk_size
        if callable(replies):
            self._fn: ReplyFn | None = replies
            self._replies: tuple[ReplyLike, ...] = ()
        else:
            self._fn = None
            self._replies = tuple(replies)
        self.calls = 0
        self.last_request: ScriptedRequest | None = None
        # (messages seen, the last of them, how many were assistant messages): a conversation
        # that grows by a turn is counted from where it was, not from the start
        self._seen: tuple[int, Message | None, int] = (0, None, 0)
        _MODELS[self.name] = self

    def _assistant_messages(self, messages: tuple[Message, ...]) -> int:
        seen, last, count = self._seen
        if 0 < seen <= len(messages) and messages[seen - 1] is last:
            count += sum(1 for i in range(seen, len(messages)) if messages[i].role == "assistant")
        else:
            count = sum(1 for m in messages if m.role == "assistant")
        self._seen = (len(messages), messages[-1] if messages else None, count)
        return count

    @property
    def endpoint(self) -> Endpoint:
        """The Endpoint that routes to this model (`provider="scripted"`, `model=self.name`)."""
        return Endpoint(provider="scripted", model=self.name)

    async def _reply(self, request: ScriptedRequest) -> ScriptedReply:
        if self._fn is not None:
            r = self._fn(request)
            if inspect.isawaitable(r):
                r = await r
        else:
            if request.call_index >= len(self._replies):
                raise ScriptExhaustedError(
                    f"scripted model {self.name!r} has {len(self._replies)} replies but was called "
                    f"{request.call_index + 1} times; add replies or use a reply function"
                )
            r = self._replies[request.call_index]
        if isinstance(r, BaseException):
            raise r
        if isinstance(r, str):
            return ScriptedReply(text=r)
        if not isinstance(r, ScriptedReply):
            raise TypeError(
                f"scripted model {self.name!r}: a reply must be a str, a ScriptedReply or an exception, got {r!r}"
            )
        return r


def get_scripted_model(name: str) -> ScriptedModel:
    """The ScriptedModel an endpoint's `model` names (made earlier in this process)."""
    try:
        return _MODELS[name]
    except KeyError:
        raise RolloutsError(
            f"no scripted model named {name!r}; create it with ScriptedModel(..., name={name!r}) "
            "in this process before using its endpoint"
        ) from None


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _estimate_usage(messages: tuple[Message, ...], reply: ScriptedReply) -> Usage:
    """~4 characters per token, as a stand-in when the script gives no usage."""
    n_in = sum(len(m.text) for m in messages)
    n_out = len(reply.text) + len(reply.thinking or "")
    for tc in reply.tool_calls:
        n_out += len(tc.arguments if isinstance(tc.arguments, str) else json.dumps(tc.arguments))
    return Usage(input_tokens=max(1, n_in // 4), output_tokens=max(1, n_out // 4))


def reply_events(reply: ScriptedReply, chunk_size: int, signature: str, turn: int) -> list[StreamEvent]:
    """The events of one reply, from the first block's start to the last block's end."""
    events: list[StreamEvent] = []
    idx = 0
    if reply.thinking:
        events.append(ev.ThinkingStart(idx))
        events += [ev.ThinkingDelta(idx, piece) for piece in _chunks(reply.thinking, chunk_size)]
        events.append(ev.ThinkingEnd(idx, reply.thinking, signature=signature))
        idx += 1
    if reply.text:
        events.append(ev.TextStart(idx))
        events += [ev.TextDelta(idx, piece) for piece in _chunks(reply.text, chunk_size)]
        events.append(ev.TextEnd(idx, reply.text))
        idx += 1
    for n, tc in enumerate(reply.tool_calls):
        call_id = tc.id or f"call_{turn}_{n}"
        raw = tc.arguments if isinstance(tc.arguments, str) else json.dumps(tc.arguments)
        events.append(ev.ToolCallStart(idx, call_id, tc.name))
        buf = ""
        for piece in _chunks(raw, chunk_size):
            buf += piece
            events.append(tool_call_delta(idx, call_id, piece, buf))
        events.append(end_tool_call(idx, call_id, tc.name, raw))
        idx += 1
    return events


class _ScriptedStream:
    """One call's raw stream: a single item, the reply, made when the stream opens (after the
    model's latency). Its own context manager and iterator: no generator per call."""

    __slots__ = ("_model", "_pending", "_request")

    def __init__(self, model: ScriptedModel, request: ScriptedRequest) -> None:
        self._model = model
        self._request = request
        self._pending: ScriptedReply | None = None

    def raw_record(self) -> dict[str, Any]:
        """What this call "sends", for `RunConfig.record_raw` (rollouts.providers.raw)."""
        r = self._request
        return {"model": self._model.name, "messages": r.messages, "tools": r.tools, "call_index": r.call_index}

    async def __aenter__(self) -> _ScriptedStream:
        model = self._model
        if model.latency_s > 0:
            await trio.sleep(model.latency_s)
        self._pending = await model._reply(self._request)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __aiter__(self) -> _ScriptedStream:
        return self

    async def __anext__(self) -> ScriptedReply:
        reply, self._pending = self._pending, None
        if reply is None:
            raise StopAsyncIteration
        return reply


class _ScriptedTranslator:
    """Streams a reply's events (`reply_events`, pausing `chunk_delay_s` after each delta);
    `finish()` emits StreamDone with the reply's usage (else an estimate)."""

    __slots__ = ("_emit", "_messages", "_model", "_reply", "_turn")

    def __init__(self, emit: OnChunk, model: ScriptedModel, messages: tuple[Message, ...], turn: int) -> None:
        self._emit = emit
        self._model = model
        self._messages = messages
        self._turn = turn
        self._reply: ScriptedReply | None = None

    async def feed(self, reply: ScriptedReply) -> None:
        self._reply = reply
        model = self._model
        emit, delay = self._emit, model.chunk_delay_s
        for event in reply_events(reply, model.chunk_size, f"sig-{model.name}", self._turn):
            await emit(event)
            if delay and isinstance(event, ev.TextDelta | ev.ThinkingDelta | ev.ToolCallDelta):
                await trio.sleep(delay)

    async def finish(self) -> tuple[str | None, Usage]:
        reply = self._reply
        assert reply is not None
        finish = reply.finish_reason or ("tool_use" if reply.tool_calls else "stop")
        usage = reply.usage or _estimate_usage(self._messages, reply)
        await self._emit(ev.StreamDone(finish, usage))
        return finish, usage


async def stream_scripted(actor: Actor, on_chunk: OnChunk) -> Actor:
    """The provider function for `provider="scripted"`."""
    model = get_scripted_model(actor.endpoint.model)
    messages = actor.trajectory.messages
    turn = 1 + model._assistant_messages(messages)

    def build() -> _ScriptedStream:
        request = ScriptedRequest(messages, actor.tools, actor.endpoint, model.calls)
        model.calls += 1
        model.last_request = request
        return _ScriptedStream(model, request)

    return await run_call(
        actor,
        on_chunk,
        build=build,
        open_stream=_itself,
        translator=lambda emit: _ScriptedTranslator(emit, model, messages, turn),
        classify=_never_retried,
        provider="scripted",
        model=model.name,
        bounded=False,  # no I/O to time out, as before the shared skeleton
    )


def _itself(stream: _ScriptedStream) -> _ScriptedStream:
    return stream


def _never_retried(exc: Exception) -> None:
    """The script's exception is the provider's final word: raised as it is."""
    return None
