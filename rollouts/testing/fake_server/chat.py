"""OpenAI Chat Completions wire format (also what vLLM, SGLang and llama.cpp's server speak).

Streams `data: {chat.completion.chunk}` events: a role chunk, `reasoning_content` deltas for a
reply's thinking (the vLLM/DeepSeek convention), `content` deltas, `tool_calls` deltas (the first
delta of each call carries `index`, `id`, `type` and `function.name`, later ones only argument
pieces; calls follow one another, or alternate with `interleave_tool_calls`), a finish chunk, a
usage chunk with `choices: []` when the request set `stream_options.include_usage` (and the
server's `send_usage` is on), then `data: [DONE]`. `GET .../models` lists one model, `fake-model`.
"""

from __future__ import annotations

import json
from typing import Any

from rollouts.providers.scripted import ScriptedReply
from rollouts.testing.fake_server.server import RecordedRequest, RenderContext, estimate_tokens, split_text, sse

_CREATED = 1_700_000_000


def _finish_reason(reply: ScriptedReply) -> str:
    if reply.finish_reason:
        return {"tool_use": "tool_calls", "max_tokens": "length", "end_turn": "stop"}.get(
            reply.finish_reason, reply.finish_reason
        )
    return "tool_calls" if reply.tool_calls else "stop"


def _raw_args(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _call_id(reply: ScriptedReply, n: int, ctx: RenderContext) -> str:
    tc = reply.tool_calls[n]
    return tc.id or f"call_{ctx.index}_{n}"


def _usage(reply: ScriptedReply, request: RecordedRequest) -> dict[str, Any]:
    if reply.usage is not None:
        u = reply.usage
        prompt = u.input_tokens + u.cache_read_tokens
        completion = u.output_tokens
        cached, reasoning = u.cache_read_tokens, u.reasoning_tokens
    else:
        body = request.body if isinstance(request.body, dict) else {}
        prompt = estimate_tokens(json.dumps(body.get("messages", [])))
        out = reply.text + (reply.thinking or "") + "".join(_raw_args(tc.arguments) for tc in reply.tool_calls)
        completion = estimate_tokens(out)
        cached, reasoning = 0, 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


_TEXT_CHOICE_END = b'},"logprobs":null,"finish_reason":null}'


class ChatCompletionsFormat:
    """`POST .../chat/completions` (streamed or not) and `GET .../models`."""

    name = "openai-chat"

    def matches(self, method: str, path: str) -> bool:
        return (method == "POST" and path.endswith("/chat/completions")) or (
            method == "GET" and path.endswith("/models")
        )

    def static_response(self, request: RecordedRequest) -> Any | None:
        if request.method != "GET":
            return None
        return {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "rollouts"}]}

    def is_stream(self, request: RecordedRequest) -> bool:
        return isinstance(request.body, dict) and bool(request.body.get("stream"))

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        body = request.body if isinstance(request.body, dict) else {}
        include_usage = bool((body.get("stream_options") or {}).get("include_usage")) and ctx.send_usage
        cid = f"chatcmpl-fake-{ctx.index}"
        base = {"id": cid, "object": "chat.completion.chunk", "created": _CREATED, "model": ctx.model}
        # Every chunk is `{**base, "choices": [choice], **extra}`, encoded as sse() would: the
        # parts around the choice are encoded once (the same bytes, a third of the JSON work).
        head = b"data: " + json.dumps(base, separators=(",", ":"))[:-1].encode() + b',"choices":['
        tail = b"]" + (b',"usage":null' if include_usage else b"") + b"}\n\n"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return head + json.dumps(choice, separators=(",", ":")).encode() + tail

        def text_chunk(piece: str) -> bytes:  # chunk({"content": piece}), most of a reply's events
            return head + b'{"index":0,"delta":{"content":' + json.dumps(piece).encode() + _TEXT_CHOICE_END + tail

        events = [chunk({"role": "assistant", "content": ""})]
        size = ctx.chunk_size
        if reply.thinking:
            events += [chunk({"reasoning_content": p}) for p in split_text(reply.thinking, size)]
        if reply.text:
            events += [text_chunk(p) for p in split_text(reply.text, size)]
        per_call: list[list[bytes]] = []
        for n, tc in enumerate(reply.tool_calls):
            pieces = split_text(_raw_args(tc.arguments), size)
            first = {
                "index": n,
                "id": _call_id(reply, n, ctx),
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            evs = [chunk({"tool_calls": [first]})]
            evs += [chunk({"tool_calls": [{"index": n, "function": {"arguments": p}}]}) for p in pieces]
            per_call.append(evs)
        if ctx.interleave_tool_calls:
            longest = max((len(c) for c in per_call), default=0)
            for i in range(longest):
                events += [c[i] for c in per_call if i < len(c)]
        else:
            for c in per_call:
                events += c
        events.append(chunk({}, _finish_reason(reply)))
        if include_usage:
            events.append(sse({**base, "choices": [], "usage": _usage(reply, request)}))
        events.append(sse("[DONE]"))
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.thinking:
            message["reasoning_content"] = reply.thinking
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": _call_id(reply, n, ctx),
                    "type": "function",
                    "function": {"name": tc.name, "arguments": _raw_args(tc.arguments)},
                }
                for n, tc in enumerate(reply.tool_calls)
            ]
        out: dict[str, Any] = {
            "id": f"chatcmpl-fake-{ctx.index}",
            "object": "chat.completion",
            "created": _CREATED,
            "model": ctx.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
        }
        if ctx.send_usage:
            out["usage"] = _usage(reply, request)
        return out

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
