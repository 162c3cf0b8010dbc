"""OpenAI Responses API wire format: `POST .../v1/responses`.

A streamed reply is the real named-event sequence (each event carries `type` and
`sequence_number`)::

    response.created, response.in_progress,
    reasoning item (reply.thinking): output_item.added, reasoning_summary_part.added,
        reasoning_summary_text.delta*, reasoning_summary_text.done, reasoning_summary_part.done,
        output_item.done (with `encrypted_content` when the request included it)
    message item (reply.text): output_item.added, content_part.added, output_text.delta*,
        output_text.done, content_part.done, output_item.done
    function_call items: output_item.added, function_call_arguments.delta*,
        function_call_arguments.done, output_item.done
    response.completed (usage) — or response.incomplete when the reply's finish_reason is
    "max_tokens"

Errors use OpenAI's body `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from typing import Any

from rollouts.providers.scripted import ScriptedReply
from rollouts.testing.fake_server.server import RecordedRequest, RenderContext, estimate_tokens, split_text, sse

_CREATED = 1_700_000_000


def _raw_args(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _usage(reply: ScriptedReply, request: RecordedRequest) -> dict[str, Any]:
    if reply.usage is not None:
        u = reply.usage
        inp = u.input_tokens + u.cache_read_tokens + u.cache_write_tokens
        out, cached, written, reasoning = u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, u.reasoning_tokens
    else:
        body = request.body if isinstance(request.body, dict) else {}
        inp = estimate_tokens(json.dumps([body.get("instructions"), body.get("input"), body.get("tools")]))
        text = reply.text + (reply.thinking or "") + "".join(_raw_args(tc.arguments) for tc in reply.tool_calls)
        out, cached, written, reasoning = estimate_tokens(text), 0, 0, 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": inp + out,
    }


def _output_items(reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[dict[str, Any]]:
    body = request.body if isinstance(request.body, dict) else {}
    encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
    items: list[dict[str, Any]] = []
    if reply.thinking:
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": f"rs_fake_{ctx.index}",
            "summary": [{"type": "summary_text", "text": reply.thinking}],
        }
        if encrypted:
            item["encrypted_content"] = f"enc_fake_{ctx.index}"
        items.append(item)
    if reply.text:
        items.append(
            {
                "type": "message",
                "id": f"msg_fake_{ctx.index}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for n, tc in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_fake_{ctx.index}_{n}",
                "call_id": tc.id or f"call_fake_{ctx.index}_{n}",
                "name": tc.name,
                "arguments": _raw_args(tc.arguments),
                "status": "completed",
            }
        )
    return items


def _response(
    reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext, status: str, output: list[dict[str, Any]]
) -> dict[str, Any]:
    body = request.body if isinstance(request.body, dict) else {}
    done = status != "in_progress"
    incomplete = status == "incomplete"
    return {
        "id": f"resp_fake_{ctx.index}",
        "object": "response",
        "created_at": _CREATED,
        "status": status,
        "model": ctx.model,
        "output": output if done else [],
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "usage": _usage(reply, request) if done and ctx.send_usage else None,
    }


class ResponsesFormat:
    """`POST .../responses`, streamed (SSE) or not."""

    name = "openai-responses"

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path.endswith("/responses")

    def static_response(self, request: RecordedRequest) -> Any | None:
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return isinstance(request.body, dict) and bool(request.body.get("stream"))

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        size = ctx.chunk_size
        events: list[bytes] = []

        def ev(kind: str, **data: Any) -> None:
            events.append(sse({"type": kind, "sequence_number": len(events), **data}, kind))

        ev("response.created", response=_response(reply, request, ctx, "in_progress", []))
        ev("response.in_progress", response=_response(reply, request, ctx, "in_progress", []))
        items = _output_items(reply, request, ctx)
        for index, item in enumerate(items):
            kind, item_id = item["type"], item["id"]
            if kind == "reasoning":
                ev("response.output_item.added", output_index=index, item={**item, "summary": []})
                text = item["summary"][0]["text"]
                part: dict[str, Any] = {"type": "summary_text", "text": ""}
                ev(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    part=part,
                )
                for p in split_text(text, size):
                    ev(
                        "response.reasoning_summary_text.delta",
                        item_id=item_id,
                        output_index=index,
                        summary_index=0,
                        delta=p,
                    )
                ev(
                    "response.reasoning_summary_text.done",
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    text=text,
                )
                ev(
                    "response.reasoning_summary_part.done",
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                )
            elif kind == "message":
                text = item["content"][0]["text"]
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = {"type": "output_text", "text": "", "annotations": []}
                ev("response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part)
                for p in split_text(text, size):
                    ev(
                        "response.output_text.delta",
                        item_id=item_id,
                        output_index=index,
                        content_index=0,
                        delta=p,
                        logprobs=[],
                    )
                ev(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
                ev(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part={**part, "text": text},
                )
            else:
                args = item["arguments"]
                ev(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "arguments": "", "status": "in_progress"},
                )
                for p in split_text(args, size):
                    ev("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=p)
                ev("response.function_call_arguments.done", item_id=item_id, output_index=index, arguments=args)
            ev("response.output_item.done", output_index=index, item=item)
        if reply.finish_reason in ("max_tokens", "length"):
            ev("response.incomplete", response=_response(reply, request, ctx, "incomplete", items))
        else:
            ev("response.completed", response=_response(reply, request, ctx, "completed", items))
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        status = "incomplete" if reply.finish_reason in ("max_tokens", "length") else "completed"
        return _response(reply, request, ctx, status, _output_items(reply, request, ctx))

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            429: "rate_limit_exceeded",
        }.get(status, "server_error")
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}
