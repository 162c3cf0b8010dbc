"""Google Gemini through the official `google-genai` SDK, running natively under trio.

Provider name `google`. Key from `Endpoint.api_key`, `GEMINI_API_KEY` or `GOOGLE_API_KEY`;
`api_base` is the server root (default `https://generativelanguage.googleapis.com`), optionally
with an API version (`.../v1beta`), which is then used instead of the SDK's default.

The SDK's default async client needs asyncio, so each client is given its own
`httpx2.AsyncClient` (see /work/shared/notes/sdk-under-trio.md); its own retries are off
(`HttpRetryOptions(attempts=1)`) because `_retry.stream_with_retries` retries, and its timeout is
set through `HttpOptions.timeout` (milliseconds). Streams are stopped by cancellation.

Request (`build_google_request`), after `_transform.transform_history`:
* leading system messages -> `system_instruction`; later ones -> user text;
* user text and images (`inline_data`, or `file_data` for URLs) -> `user` contents;
  assistant text and tool calls -> `model` contents with `function_call` parts; tool results ->
  `function_response` parts (`{"output": text}`, or `{"error": text}` for error results) in a
  `user` content; consecutive contents of the same role are merged;
* tool-call ids are not sent (Gemini matches results to calls by name and order); ids we make up
  for Gemini's calls stay in our history only;
* thought signatures: a part's `thought_signature` is kept as a thinking block's `signature`
  (base64) and sent back on the part that follows it; thought *text* (summaries requested with
  `include_thoughts`) is not sent back, as Gemini does not need it;
* `Endpoint.thinking`: `{"budget_tokens": N}` -> `thinking_budget`, `{"level": "high"}` ->
  `thinking_level`, both with `include_thoughts=True`; `extra_params` are merged into the config.

Stream: each chunk's parts become text / thinking (`thought=True`) blocks and whole tool calls
(ToolCallStart, one ToolCallDelta with the full arguments, ToolCallEnd). Usage from the last
`usage_metadata`: `input_tokens` = prompt - cached, `output_tokens` = candidates + thoughts,
`reasoning_tokens` = thoughts, `cost_usd` from `_pricing`. A stream that ends without a finish
reason is retried as broken.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Hashable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import httpx2
import trio
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

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
from rollouts.providers._clients import shared_ssl_context
from rollouts.providers._pooled import pooled_client
from rollouts.providers._pricing import with_cost
from rollouts.providers._retry import Failure, IncompleteStreamError, classify_common, failure_from_status
from rollouts.providers._tool_events import end_tool_call
from rollouts.providers._transform import Target, thinking_origin, transform_history

PROVIDER = "google"
_MAX_CONNECTIONS = 1000
_FINISH = {"STOP": "stop", "MAX_TOKENS": "max_tokens"}
_CONTEXT_HINT = "exceeds the maximum number of tokens"


def _native_thinking(block: ThinkingContent, message: Message) -> bool:
    return thinking_origin(block, message) == PROVIDER


TARGET = Target(PROVIDER, native_thinking=_native_thinking, max_id_len=64)


# ---------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------


def _image_part(block: ImageContent) -> dict[str, Any]:
    if block.url is not None:
        return {"file_data": {"file_uri": block.url, "mime_type": block.media_type}}
    assert block.data is not None
    return {"inline_data": {"mime_type": block.media_type, "data": base64.b64decode(block.data)}}


def _model_parts(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    signature: bytes | None = None
    for b in message.blocks:
        if isinstance(b, ThinkingContent):  # native: only its signature goes back
            if b.signature:
                signature = base64.b64decode(b.signature)
            continue
        if isinstance(b, TextContent):
            if not b.text:
                continue
            part: dict[str, Any] = {"text": b.text}
        elif isinstance(b, ToolCallContent):
            part = {"function_call": {"name": b.name, "args": dict(b.arguments)}}
        else:
            continue
        if signature is not None:
            part["thought_signature"] = signature
            signature = None
        parts.append(part)
    return parts


def _user_parts(message: Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            if b.text:
                parts.append({"text": b.text})
        elif isinstance(b, ImageContent):
            parts.append(_image_part(b))
    return parts


def google_contents(messages: tuple[Message, ...]) -> tuple[str | None, list[dict[str, Any]]]:
    """(system instruction, contents) for already-transformed `messages`."""
    names: dict[str, str] = {}
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    leading = True
    parts: list[dict[str, Any]]
    for m in messages:
        if m.role == "system":
            if leading:
                system.append(m.text)
                continue
            role, parts = "user", [{"text": m.text}] if m.text else []
        else:
            leading = False
            if m.role == "user":
                role, parts = "user", _user_parts(m)
            elif m.role == "assistant":
                for b in m.blocks:
                    if isinstance(b, ToolCallContent):
                        names[b.id] = b.name
                role, parts = "model", _model_parts(m)
            else:
                assert m.tool_call_id is not None
                name = names.get(m.tool_call_id) or str((m.details or {}).get("tool_name") or "tool")
                key = "error" if m.is_error else "output"
                role, parts = "user", [{"function_response": {"name": name, "response": {key: m.text}}}]
        if not parts:
            continue
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})
    return ("\n\n".join(system) if system else None), contents


def google_tools(tools: tuple[Tool, ...]) -> list[dict[str, Any]]:
    decls = [
        {"name": t.name, "description": t.description, "parameters_json_schema": dict(t.parameters)} for t in tools
    ]
    return [{"function_declarations": decls}]


def build_google_request(actor: Actor) -> dict[str, Any]:
    """`{"model", "contents", "config"}` for `generate_content_stream` (config as a dict)."""
    ep = actor.endpoint
    system, contents = google_contents(transform_history(actor.trajectory.messages, TARGET))
    config: dict[str, Any] = {"max_output_tokens": ep.max_tokens}
    if system:
        config["system_instruction"] = system
    if actor.tools:
        config["tools"] = google_tools(actor.tools)
        config["automatic_function_calling"] = {"disable": True}
    if ep.temperature is not None:
        config["temperature"] = ep.temperature
    thinking = ep.thinking
    if thinking:
        tc: dict[str, Any] = {"include_thoughts": bool(thinking.get("include_thoughts", True))}
        if "budget_tokens" in thinking:
            tc["thinking_budget"] = int(thinking["budget_tokens"])
        if "level" in thinking:
            tc["thinking_level"] = thinking["level"]
        config["thinking_config"] = tc
    config.update(ep.extra_params or {})
    return {"model": ep.model, "contents": contents, "config": config}


# ---------------------------------------------------------------------------------------------
# Stream chunks -> our events
# ---------------------------------------------------------------------------------------------


class GoogleStreamTranslator:
    """Feed `GenerateContentResponse` chunks in order; `finish()` emits StreamDone (`model`
    prices the usage; `finish(model)` may name another)."""

    __slots__ = (
        "_emit",
        "_kind",
        "_model",
        "_next",
        "_open",
        "_parts",
        "_signature",
        "finish_reason",
        "has_calls",
        "usage_raw",
    )

    def __init__(self, emit: OnChunk, model: str = "") -> None:
        self._emit = emit
        self._model = model
        self._next = 0
        self._open = -1
        self._kind: str | None = None
        self._parts: list[str] = []
        self._signature: str | None = None
        self.finish_reason: str | None = None
        self.usage_raw: Any = None
        self.has_calls = False

    async def feed(self, chunk: Any) -> None:
        usage = chunk.usage_metadata
        if usage is not None:
            self.usage_raw = usage
        candidates = chunk.candidates
        if not candidates:
            return
        cand = candidates[0]
        content = cand.content
        parts = content.parts if content is not None else None
        if parts:
            for part in parts:
                await self._part(part)
        reason = cand.finish_reason
        if reason is not None:
            self.finish_reason = reason.value if hasattr(reason, "value") else str(reason)

    async def _close(self) -> None:
        kind = self._kind
        if kind is None:
            return
        text = "".join(self._parts)
        if kind == "text":
            await self._emit(ev.TextEnd(self._open, text))
        else:
            await self._emit(ev.ThinkingEnd(self._open, text, signature=self._signature))
            self._signature = None
        self._kind = None
        self._parts = []

    async def _begin(self, kind: str) -> None:
        await self._close()
        self._kind = kind
        self._open = self._next
        self._next += 1
        await self._emit(ev.TextStart(self._open) if kind == "text" else ev.ThinkingStart(self._open))

    async def _signature_block(self, signature: bytes) -> None:
        """A thought signature that arrived on a non-thought part: a signature-only thinking block
        placed before that part, so it is sent back on it."""
        await self._begin("thinking")
        self._signature = base64.b64encode(signature).decode("ascii")
        await self._close()

    async def _part(self, part: Any) -> None:
        signature = part.thought_signature
        fc = part.function_call
        if fc is not None:
            await self._close()
            if signature:
                await self._signature_block(signature)
            await self._call(fc)
            return
        text = part.text
        if part.thought:
            if self._kind != "thinking":
                await self._begin("thinking")
            if text:
                self._parts.append(text)
                await self._emit(ev.ThinkingDelta(self._open, text))
            if signature:
                self._signature = base64.b64encode(signature).decode("ascii")
            return
        if text is None and not signature:
            return
        if signature:
            await self._close()
            await self._signature_block(signature)
        if text:
            if self._kind != "text":
                await self._begin("text")
            self._parts.append(text)
            await self._emit(ev.TextDelta(self._open, text))

    async def _call(self, fc: Any) -> None:
        self.has_calls = True
        index = self._next
        self._next += 1
        call_id = fc.id or f"call_{uuid.uuid4().hex[:24]}"
        name = fc.name or ""
        args = dict(fc.args or {})
        raw = json.dumps(args)
        await self._emit(ev.ToolCallStart(index, call_id, name))
        await self._emit(ev.ToolCallDelta(index, call_id, raw, args))
        await self._emit(end_tool_call(index, call_id, name, raw))

    async def finish(self, model: str | None = None) -> tuple[str | None, Usage]:
        if self.finish_reason is None:
            raise IncompleteStreamError("the Gemini stream ended without a finish reason")
        await self._close()
        raw = self.finish_reason
        reason = "tool_use" if self.has_calls and raw == "STOP" else _FINISH.get(raw, raw.lower())
        usage = usage_from_google(self.usage_raw, model or self._model)
        await self._emit(ev.StreamDone(reason, usage))
        return reason, usage


def usage_from_google(raw: Any, model: str) -> Usage:
    if raw is None:
        return Usage()
    prompt = raw.prompt_token_count or 0
    cached = raw.cached_content_token_count or 0
    thoughts = raw.thoughts_token_count or 0
    usage = Usage(
        input_tokens=max(0, prompt - cached),
        output_tokens=(raw.candidates_token_count or 0) + thoughts,
        cache_read_tokens=cached,
        reasoning_tokens=thoughts,
    )
    return with_cost(usage, model)


# ---------------------------------------------------------------------------------------------
# Client, errors
# ---------------------------------------------------------------------------------------------


_API_VERSION = re.compile(r"/(v\d+(?:alpha|beta)?\d*)/?$")


def split_api_version(api_base: str) -> tuple[str | None, str | None]:
    """(server root, API version) from `api_base`: `http://host/v1beta` -> (`http://host`,
    `v1beta`); without a version suffix the SDK's default version is used."""
    if not api_base:
        return None, None
    m = _API_VERSION.search(api_base)
    if m is None:
        return api_base.rstrip("/"), None
    return api_base[: m.start()], m.group(1)


class _GoogleClient:
    """A genai client with the httpx2 client it rides on (closed together)."""

    def __init__(self, endpoint: Endpoint, api_key: str) -> None:
        self.http = httpx2.AsyncClient(
            verify=shared_ssl_context(),
            limits=httpx2.Limits(max_connections=_MAX_CONNECTIONS, max_keepalive_connections=100),
            timeout=httpx2.Timeout(endpoint.timeout, connect=min(10.0, endpoint.timeout), pool=endpoint.timeout),
        )
        base, version = split_api_version(endpoint.api_base)
        options = genai_types.HttpOptions(
            base_url=base,
            api_version=version,
            httpx_async_client=self.http,
            timeout=int(endpoint.timeout * 1000),
            retry_options=genai_types.HttpRetryOptions(attempts=1),
        )
        self.client = genai.Client(api_key=api_key, http_options=options)

    async def aclose(self) -> None:
        await self.http.aclose()


def _client_key(endpoint: Endpoint, api_key: str) -> Hashable:
    return ("google-genai", endpoint.api_base, hash(api_key), endpoint.timeout)


async def _first_then_rest(first: Any, rest: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    if first is not _EMPTY:
        yield first
    async for chunk in rest:
        yield chunk


_EMPTY = object()


@asynccontextmanager
async def _open_stream(endpoint: Endpoint, request: dict[str, Any], api_key: str) -> AsyncIterator[Any]:
    """The response chunks. The SDK sends the request only when its generator is first read, so
    the first chunk is read here: an error status is raised before the stream counts as open
    (no `StreamStart` for a failed attempt, as with every other provider)."""
    async with pooled_client(_client_key(endpoint, api_key), lambda: _GoogleClient(endpoint, api_key)) as gc:
        stream = await gc.client.aio.models.generate_content_stream(**request)
        try:
            try:
                first = await stream.__anext__()
            except StopAsyncIteration:
                first = _EMPTY
            async with aclosing(_first_then_rest(first, stream)) as chunks:
                yield chunks
        finally:
            # The SDK's generator holds the response: closing it releases the connection now
            # rather than at garbage collection (after a cancellation too).
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()


def classify_google_error(exc: Exception, provider: str) -> Failure | None:
    """Map google-genai / httpx2 / our own exceptions to a retry decision and a rollouts error."""
    common = classify_common(exc, provider)
    if common is not None:
        return common
    if isinstance(exc, genai_errors.APIError):
        status = int(exc.code or 500)
        message = str(exc.message or exc)
        if status == 400 and _CONTEXT_HINT in message.lower():
            text = f"{provider}: HTTP 400: {message}"
            return Failure(ContextTooLongError(text, provider=provider, status_code=status))
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        body = exc.details if isinstance(exc.details, dict) else None
        return failure_from_status(status, provider=provider, headers=headers, body=body, message=message)
    if isinstance(exc, genai_errors.UnknownApiResponseError):  # a malformed chunk: a broken stream
        return Failure(ProviderError(f"{provider}: {exc}", provider=provider, retryable=True))
    return None


# ---------------------------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------------------------


CALL = ProviderCall(PROVIDER, build_google_request, _open_stream, GoogleStreamTranslator, classify_google_error)


async def stream_google(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Provider `google`: one streamed `generateContent` call; returns the actor with the reply."""
    return await CALL.run(actor, on_chunk)
