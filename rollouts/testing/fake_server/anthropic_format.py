"""Anthropic Messages API wire format: `POST .../v1/messages`.

A streamed reply is the real SSE sequence, each event with its `event:` name::

    message_start (usage: input, cache read/write tokens), ping,
    per block: content_block_start, content_block_delta*, content_block_stop
        thinking  -> thinking_delta* then one signature_delta
        redacted  -> a redacted_thinking block carrying `data` (no deltas)
        text      -> text_delta*
        tool_use  -> input_json_delta* (the arguments JSON in pieces)
    message_delta (stop_reason, cumulative output_tokens), message_stop

Block order: redacted thinking, thinking, text, tool calls. Errors use Anthropic's body
`{"type": "error", "error": {"type": "overloaded_error", "message": ...}}` (529 is
`overloaded_error`). `AnthropicReply` adds what only Anthropic has: redacted thinking blocks, a
fixed thinking signature, and an `error` event in the middle of a 200 stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollouts.providers.scripted import ScriptedReply
from rollouts.testing.fake_server.server import RecordedRequest, RenderContext, estimate_tokens, split_text, sse

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class AnthropicReply(ScriptedReply):
    """A ScriptedReply with Anthropic-only parts.

    `redacted_thinking`: data strings of redacted_thinking blocks sent before the thinking;
    `signature`: the thinking block's signature (default `sig_fake_<request index>`);
    `error_after=N`: after N events, an `error` event of `error_type` ends the stream."""

    redacted_thinking: tuple[str, ...] = ()
    signature: str | None = None
    error_after: int | None = None
    error_type: str = "overloaded_error"


def _stop_reason(reply: ScriptedReply) -> str:
    if reply.finish_reason:
        return {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}.get(
            reply.finish_reason, reply.finish_reason
        )
    return "tool_use" if reply.tool_calls else "end_turn"


def _raw_args(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _call_id(reply: ScriptedReply, n: int, ctx: RenderContext) -> str:
    return reply.tool_calls[n].id or f"toolu_fake_{ctx.index}_{n}"


def _usage(reply: ScriptedReply, request: RecordedRequest) -> tuple[dict[str, int], int]:
    """(message_start usage, final output tokens)."""
    if reply.usage is not None:
        u = reply.usage
        start = {
            "input_tokens": u.input_tokens,
            "cache_creation_input_tokens": u.cache_write_tokens,
            "cache_read_input_tokens": u.cache_read_tokens,
            "output_tokens": 1,
        }
        return start, u.output_tokens
    body = request.body if isinstance(request.body, dict) else {}
    prompt = estimate_tokens(json.dumps([body.get("system"), body.get("messages"), body.get("tools")]))
    out = reply.text + (reply.thinking or "") + "".join(_raw_args(tc.arguments) for tc in reply.tool_calls)
    start = {"input_tokens": prompt, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}
    return start, estimate_tokens(out)


def _signature(reply: ScriptedReply, ctx: RenderContext) -> str:
    sig = reply.signature if isinstance(reply, AnthropicReply) else None
    return sig or f"sig_fake_{ctx.index}"


class AnthropicFormat:
    """`POST .../v1/messages`, streamed (SSE) or not."""

    name = "anthropic"

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.endswith("/v1/messages")

    def static_response(self, request: RecordedRequest) -> Any | None:
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return isinstance(request.body, dict) and bool(request.body.get("stream"))

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        size = ctx.chunk_size
        start_usage, output_tokens = _usage(reply, request)
        message: dict[str, Any] = {
            "id": f"msg_fake_{ctx.index}",
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": start_usage,
        }
        events = [sse({"type": "message_start", "message": message}, "message_start"), sse({"type": "ping"}, "ping")]
        index = 0

        def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
            nonlocal index
            events.append(
                sse({"type": "content_block_start", "index": index, "content_block": start}, "content_block_start")
            )
            for d in deltas:
                events.append(sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta"))
            events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
            index += 1

        if isinstance(reply, AnthropicReply):
            for data in reply.redacted_thinking:
                block({"type": "redacted_thinking", "data": data}, [])
        if reply.thinking:
            deltas = [{"type": "thinking_delta", "thinking": p} for p in split_text(reply.thinking, size)]
            deltas.append({"type": "signature_delta", "signature": _signature(reply, ctx)})
            block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
        if reply.text:
            block(
                {"type": "text", "text": ""}, [{"type": "text_delta", "text": p} for p in split_text(reply.text, size)]
            )
        for n, tc in enumerate(reply.tool_calls):
            pieces = split_text(_raw_args(tc.arguments), size)
            block(
                {"type": "tool_use", "id": _call_id(reply, n, ctx), "name": tc.name, "input": {}},
                [{"type": "input_json_delta", "partial_json": p} for p in pieces],
            )
        events.append(
            sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                },
                "message_delta",
            )
        )
        events.append(sse({"type": "message_stop"}, "message_stop"))
        if isinstance(reply, AnthropicReply) and reply.error_after is not None:
            error = {"type": "error", "error": {"type": reply.error_type, "message": "Overloaded"}}
            events = events[: reply.error_after] + [sse(error, "error")]
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        content: list[dict[str, Any]] = []
        if isinstance(reply, AnthropicReply):
            content += [{"type": "redacted_thinking", "data": d} for d in reply.redacted_thinking]
        if reply.thinking:
            content.append({"type": "thinking", "thinking": reply.thinking, "signature": _signature(reply, ctx)})
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for n, tc in enumerate(reply.tool_calls):
            args = tc.arguments if not isinstance(tc.arguments, str) else json.loads(tc.arguments or "{}")
            content.append({"type": "tool_use", "id": _call_id(reply, n, ctx), "name": tc.name, "input": args})
        start_usage, output_tokens = _usage(reply, request)
        return {
            "id": f"msg_fake_{ctx.index}",
            "type": "message",
            "role": "assistant",
            "model": ctx.model,
            "content": content,
            "stop_reason": _stop_reason(reply),
            "stop_sequence": None,
            "usage": {**start_usage, "output_tokens": output_tokens},
        }

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        kind = code or _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
