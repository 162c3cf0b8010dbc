"""Google Gemini API wire format: `POST .../models/<model>:streamGenerateContent?alt=sse` (and
`:generateContent`), under any API version prefix (`/v1`, `/v1beta`).

A streamed reply is a sequence of `data: {GenerateContentResponse}` events (camelCase JSON, no
event names, no terminator): thought parts (`{"text", "thought": true}`) for the reply's
thinking, text parts, then one chunk with all function calls (Gemini sends calls whole; the
first carries a `thoughtSignature` when the reply has thinking, as Gemini 2.5+ does). The last
chunk carries `finishReason` (`STOP`, or `MAX_TOKENS` for a reply finishing with "max_tokens")
and `usageMetadata`. Function calls have no `id` unless the scripted call sets one (the
Developer API sends none). Errors use Google's body `{"error": {"code", "message", "status"}}`.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from rollouts.providers.scripted import ScriptedReply
from rollouts.testing.fake_server.server import RecordedRequest, RenderContext, estimate_tokens, split_text, sse

_MODEL_IN_PATH = re.compile(r"/models/([^/:]+):(?:stream)?[gG]enerateContent$")
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def signature_for(index: int) -> str:
    """The base64 thought signature the fake server attaches for scripted request `index`."""
    return base64.b64encode(f"sig_fake_{index}".encode()).decode("ascii")


def _raw_args(arguments: Any) -> Any:
    return json.loads(arguments or "{}") if isinstance(arguments, str) else dict(arguments)


def _usage(reply: ScriptedReply, request: RecordedRequest) -> dict[str, int]:
    if reply.usage is not None:
        u = reply.usage
        prompt = u.input_tokens + u.cache_read_tokens
        thoughts = u.reasoning_tokens
        candidates = max(0, u.output_tokens - thoughts)
        cached = u.cache_read_tokens
    else:
        body = request.body if isinstance(request.body, dict) else {}
        prompt = estimate_tokens(json.dumps([body.get("systemInstruction"), body.get("contents"), body.get("tools")]))
        thoughts = estimate_tokens(reply.thinking) if reply.thinking else 0
        out = reply.text + "".join(json.dumps(_raw_args(tc.arguments)) for tc in reply.tool_calls)
        candidates = estimate_tokens(out)
        cached = 0
    usage = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
    }
    if cached:
        usage["cachedContentTokenCount"] = cached
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def _parts(reply: ScriptedReply, ctx: RenderContext) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """(streamed part groups, one group per chunk; all parts of the complete response)."""
    size = ctx.chunk_size
    groups: list[list[dict[str, Any]]] = []
    if reply.thinking:
        groups += [[{"text": p, "thought": True}] for p in split_text(reply.thinking, size)]
    if reply.text:
        groups += [[{"text": p}] for p in split_text(reply.text, size)]
    calls: list[dict[str, Any]] = []
    for tc in reply.tool_calls:
        fc: dict[str, Any] = {"name": tc.name, "args": _raw_args(tc.arguments)}
        if tc.id:
            fc["id"] = tc.id
        calls.append({"functionCall": fc})
    if calls:
        groups.append(calls)
    if reply.thinking:
        # the signature goes on the first function call, else on the first answer part
        target = calls[0] if calls else next((g[0] for g in groups if not g[0].get("thought")), None)
        if target is not None:
            target["thoughtSignature"] = signature_for(ctx.index)
    whole: list[dict[str, Any]] = []
    if reply.thinking:
        whole.append({"text": reply.thinking, "thought": True})
    if reply.text:
        first_text = next((g[0] for g in groups if not g[0].get("thought") and "text" in g[0]), {})
        whole.append(
            {"text": reply.text, **({"thoughtSignature": s} if (s := first_text.get("thoughtSignature")) else {})}
        )
    whole += calls
    return groups, whole


def _finish_reason(reply: ScriptedReply) -> str:
    return "MAX_TOKENS" if reply.finish_reason in ("max_tokens", "length") else "STOP"


class GeminiFormat:
    """`POST .../models/<model>:streamGenerateContent` (SSE) and `:generateContent`."""

    name = "gemini"

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and _MODEL_IN_PATH.search(path) is not None

    def static_response(self, request: RecordedRequest) -> Any | None:
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return ":streamGenerateContent" in request.path

    @staticmethod
    def _model(request: RecordedRequest) -> str:
        m = _MODEL_IN_PATH.search(request.path)
        return m.group(1) if m else "fake-model"

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        groups, _ = _parts(reply, ctx)
        if not groups:
            groups = [[{"text": ""}]]
        model = self._model(request)
        events = []
        for n, parts in enumerate(groups):
            cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
            chunk: dict[str, Any] = {
                "candidates": [cand],
                "modelVersion": model,
                "responseId": f"resp_fake_{ctx.index}",
            }
            if n == len(groups) - 1:
                cand["finishReason"] = _finish_reason(reply)
                if ctx.send_usage:
                    chunk["usageMetadata"] = _usage(reply, request)
            events.append(sse(chunk))
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        _, whole = _parts(reply, ctx)
        out: dict[str, Any] = {
            "candidates": [
                {"content": {"parts": whole, "role": "model"}, "finishReason": _finish_reason(reply), "index": 0}
            ],
            "modelVersion": self._model(request),
            "responseId": f"resp_fake_{ctx.index}",
        }
        if ctx.send_usage:
            out["usageMetadata"] = _usage(reply, request)
        return out

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        return {"error": {"code": status, "message": message, "status": code or _STATUS.get(status, "UNKNOWN")}}
