"""Turn a stream of events into the final assistant `Message`. Shared by every provider."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rollouts._unicode import join_surrogate_pairs
from rollouts.dtypes import (
    Actor,
    Completion,
    ContentBlock,
    Message,
    TextContent,
    ThinkingContent,
    ToolCallContent,
    Usage,
    now_iso,
)
from rollouts.events import (
    StreamDone,
    StreamError,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ThinkingDelta,
    ThinkingEnd,
    ThinkingSignature,
    ThinkingStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
)


def _call_part(tool_call_id: str) -> str:
    return tool_call_id.partition("|")[0]


def unique_tool_call_ids(blocks: list[ContentBlock]) -> tuple[ContentBlock, ...]:
    """`blocks` with every tool call's id unique within the message: a provider's id is kept
    where it is unique; a repeated (or empty) one becomes `<id>_<n>`, the first free n, so each
    call gets its own result (two calls with one id would leave one of them unanswered). An id
    `<call id>|<item id>` (the Responses provider keeps both) is judged, and renamed, by its
    call id: that is the one sent back with the result."""
    ids = [_call_part(b.id) for b in blocks if isinstance(b, ToolCallContent)]
    if len(set(ids)) == len(ids) and all(ids):
        return tuple(blocks)
    taken = set(ids)
    seen: set[str] = set()
    out: list[ContentBlock] = []
    for b in blocks:
        if isinstance(b, ToolCallContent):
            call_id, bar, item = b.id.partition("|")
            if not call_id or call_id in seen:
                base, n = call_id or "call", 2
                while f"{base}_{n}" in taken:
                    n += 1
                call_id = f"{base}_{n}"
                taken.add(call_id)
                b = replace(b, id=call_id + bar + item)
            seen.add(call_id)
        out.append(b)
    return tuple(out)


class MessageBuilder:
    """Accumulates events into blocks keyed by `content_index`.

    `feed(event)` for every event, then `finish()` for the Message. A `StreamError` with
    `will_retry` (or a second `StreamStart`) discards everything received so far, so a retried
    stream never duplicates content. `partial_message()` gives what has arrived so far (used to
    record a turn that was cancelled mid-stream). Tool-call ids are made unique within the
    message (`unique_tool_call_ids`): the Message is what runs the tools and goes back to the
    model; streamed events carry the provider's own ids."""

    __slots__ = ("_blocks", "_texts", "done", "finish_reason", "model", "provider", "usage")

    def __init__(self, provider: str, model: str) -> None:
        self.provider = provider
        self.model = model
        self._blocks: dict[int, Any] = {}
        self._texts: dict[int, list[str]] = {}
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.done = False

    def reset(self) -> None:
        self._blocks.clear()
        self._texts.clear()
        self.usage = Usage()
        self.finish_reason = None
        self.done = False

    def feed(self, event: StreamEvent) -> None:
        t = type(event)
        if t is TextDelta:
            self._texts[event.content_index].append(event.delta)  # type: ignore[union-attr]
        elif t is ToolCallDelta or t is ThinkingDelta:
            self._texts.setdefault(event.content_index, []).append(event.delta)  # type: ignore[union-attr]
        elif t is TextStart:
            self._blocks[event.content_index] = "text"  # type: ignore[union-attr]
            self._texts[event.content_index] = []  # type: ignore[union-attr]
        elif t is TextEnd:
            self._blocks[event.content_index] = TextContent(event.text)  # type: ignore[union-attr]
        elif t is ThinkingStart:
            self._blocks[event.content_index] = "thinking"  # type: ignore[union-attr]
            self._texts[event.content_index] = []  # type: ignore[union-attr]
        elif t is ThinkingSignature:
            pass  # carried by ThinkingEnd
        elif t is ThinkingEnd:
            assert isinstance(event, ThinkingEnd)
            self._blocks[event.content_index] = ThinkingContent(
                thinking=event.thinking,
                signature=event.signature,
                redacted=event.redacted,
                data=event.data,
                provider=self.provider,
            )
        elif t is ToolCallStart:
            assert isinstance(event, ToolCallStart)
            self._blocks[event.content_index] = (event.tool_call_id, event.tool_name)
            self._texts[event.content_index] = []
        elif t is ToolCallEnd:
            assert isinstance(event, ToolCallEnd)
            tc = event.tool_call
            self._blocks[event.content_index] = ToolCallContent(
                tc.id, tc.name, tc.arguments, tc.raw_arguments, tc.parse_error
            )
        elif t is ToolCallError:
            assert isinstance(event, ToolCallError)
            self._blocks[event.content_index] = ToolCallContent(
                event.tool_call_id, event.tool_name, {}, event.raw_arguments, event.error
            )
        elif t is StreamDone:
            assert isinstance(event, StreamDone)
            self.usage = event.usage
            self.finish_reason = event.finish_reason
            self.done = True
        elif t is StreamError:
            if event.will_retry:  # type: ignore[union-attr]
                self.reset()
        elif t is StreamStart:
            if self._blocks:
                self.reset()

    def _content(self, partial: bool) -> tuple[ContentBlock, ...]:
        blocks: list[ContentBlock] = []
        for idx in sorted(self._blocks):
            b = self._blocks[idx]
            if isinstance(b, str | tuple):
                if not partial:
                    raise AssertionError(f"content block {idx} ({b!r}) was started but never ended")
                text = join_surrogate_pairs("".join(self._texts.get(idx, ())))
                if b == "text":
                    if text:
                        blocks.append(TextContent(text))
                elif b == "thinking":
                    if text:
                        blocks.append(ThinkingContent(text, provider=self.provider))
                # an unfinished tool call is dropped: it cannot be executed
            else:
                blocks.append(b)
        return unique_tool_call_ids(blocks)

    def finish(self) -> Message:
        """The complete assistant message. Every started block must have ended."""
        assert self.done, "finish() called before StreamDone"
        return Message(
            role="assistant",
            content=self._content(partial=False),
            timestamp=now_iso(),
            provider=self.provider,
            model=self.model,
            usage=self.usage,
            details={"finish_reason": self.finish_reason} if self.finish_reason else None,
        )

    def partial_message(self) -> Message | None:
        """What arrived before an interruption, marked `details.aborted`; None if nothing did."""
        content = self._content(partial=True)
        if not content:
            return None
        return Message(
            role="assistant",
            content=content,
            timestamp=now_iso(),
            provider=self.provider,
            model=self.model,
            usage=self.usage,
            details={"aborted": True},
        )


def append_assistant(actor: Actor, message: Message, completion: Completion) -> Actor:
    """The actor with a provider's finished `message` and its `completion` record appended."""
    traj = actor.trajectory
    new_traj = replace(traj, messages=traj.messages + (message,), completions=traj.completions + (completion,))
    return replace(actor, trajectory=new_traj)
