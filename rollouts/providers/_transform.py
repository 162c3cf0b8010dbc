"""Cross-provider history transformation, applied by every provider before building a request.

A conversation may start on one provider and continue on another (or come back from a saved
session written by an older version). `transform_history(messages, target)` returns the
messages in a shape the target accepts:

* **Thinking.** A thinking block the target made itself (`target.native_thinking(block)`, e.g.
  an Anthropic block with its signature) is kept verbatim: providers need their own signatures
  back. A *foreign* thinking block with text becomes a text block
  `<thinking>\\n...\\n</thinking>` in the same position, so the next model still sees the
  reasoning that led to the calls that follow (dropping it would leave tool calls unexplained),
  and the tags keep it distinguishable from the answer. Foreign blocks without text (redacted
  thinking, signature-only blocks) carry nothing another provider can read and are dropped.
* **Tool calls without results.** Every tool call of an assistant message gets a tool result
  before the next non-tool message; a missing one is inserted as an error result
  (`details={"is_error": True, "synthetic": True}`) saying the call was not executed. APIs reject
  a tool call without its result (Anthropic, OpenAI) or a result without its call.
* **Orphan results.** A tool message whose id matches no call of the assistant message before it
  becomes a user text message quoting the result.
* **Replies cut short.** An assistant message marked `details["aborted"]` (what had streamed
  when a run was cancelled) is not sent when it is the last message or is followed by another
  assistant message (the reply that replaced it on resume): as the last message it would be a
  *prefill* — Anthropic rejects one with extended thinking on and would otherwise continue it as
  a second message; OpenAI answers after it; Gemini continues a trailing model turn — so for
  every provider the model answers afresh. Followed by a user message it stays, as context
  (the user saw it before writing). The stored trajectory keeps it either way.
* **Tool-call ids.** Ids the target does not accept (`target.valid_id`) are mapped by a pure
  function of the original id: characters outside `[A-Za-z0-9_-]` become `_` and the id is cut to
  `target.max_id_len` with a hash suffix, so the same original id maps to the same new id in the
  assistant call and in its result, in every request of the conversation, and two different ids
  never collide in practice (10 hex digits of SHA-256).

The stored trajectory is never changed: the transformation applies to the request only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rollouts.dtypes import ContentBlock, Message, TextContent, ThinkingContent, ToolCallContent

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]+")
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_SYNTHETIC_RESULT = "No result: this tool call was not executed."


def _never(block: ThinkingContent, message: Message) -> bool:
    return False


@dataclass(frozen=True)
class Target:
    """What a provider accepts in history.

    `native_thinking(block, message)` says whether a thinking block can be sent back as thinking
    (the target made it); `max_id_len` and `valid_id` constrain tool-call ids."""

    name: str
    native_thinking: Callable[[ThinkingContent, Message], bool] = _never
    max_id_len: int = 64
    valid_id: Callable[[str], bool] | None = None

    def accepts_id(self, tool_call_id: str) -> bool:
        if self.valid_id is not None:
            return self.valid_id(tool_call_id)
        return 0 < len(tool_call_id) <= self.max_id_len and _SAFE_ID.fullmatch(tool_call_id) is not None


def thinking_origin(block: ThinkingContent, message: Message) -> str | None:
    """The provider that made a thinking block (the block's own record, else the message's)."""
    return block.provider or message.provider


def map_tool_call_id(tool_call_id: str, max_len: int = 64) -> str:
    """A deterministic id made of `[A-Za-z0-9_-]`, at most `max_len` characters."""
    assert max_len >= 16, "tool-call id limits below 16 characters are not supported"
    digest = hashlib.sha256(tool_call_id.encode("utf-8")).hexdigest()[:10]
    clean = _UNSAFE_CHARS.sub("_", tool_call_id)
    return f"{clean[: max_len - len(digest) - 1]}_{digest}"


def foreign_thinking_text(block: ThinkingContent) -> TextContent | None:
    """The text block a foreign thinking block becomes (None when it has no readable text)."""
    if block.redacted or not block.thinking.strip():
        return None
    return TextContent(f"<thinking>\n{block.thinking}\n</thinking>")


def _transform_assistant(message: Message, target: Target, ids: dict[str, str]) -> Message:
    if isinstance(message.content, str):
        return message
    out: list[ContentBlock] = []
    changed = False
    for block in message.content:
        if isinstance(block, ThinkingContent) and not target.native_thinking(block, message):
            changed = True
            text = foreign_thinking_text(block)
            if text is not None:
                out.append(text)
        elif isinstance(block, ToolCallContent) and block.id in ids:
            changed = True
            out.append(replace(block, id=ids[block.id]))
        else:
            out.append(block)
    return replace(message, content=tuple(out)) if changed else message


def _synthetic(call: ToolCallContent) -> Message:
    return Message(
        "tool",
        _SYNTHETIC_RESULT,
        tool_call_id=call.id,
        details={"tool_name": call.name, "is_error": True, "synthetic": True},
    )


def _orphan(message: Message) -> Message:
    return Message("user", f"[Result of tool call {message.tool_call_id}]\n{message.text}", timestamp=message.timestamp)


def _without_superseded_partials(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    """`messages` without aborted assistant messages that are last or followed by an assistant
    message (see "Replies cut short" in the module docstring)."""
    kept: list[Message] = []
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.details and m.details.get("aborted"):
            following = messages[i + 1] if i + 1 < len(messages) else None
            if following is None or following.role == "assistant":
                continue
        kept.append(m)
    return tuple(kept) if len(kept) != len(messages) else messages


def transform_history(messages: tuple[Message, ...], target: Target) -> tuple[Message, ...]:
    """`messages` as `target` accepts them (see the module docstring). Returns the same tuple
    when nothing needs to change."""
    # Ids the target rejects, mapped once for the whole conversation.
    ids: dict[str, str] = {}
    for m in messages:
        if m.role == "assistant" and not isinstance(m.content, str):
            for b in m.content:
                if isinstance(b, ToolCallContent) and b.id not in ids and not target.accepts_id(b.id):
                    ids[b.id] = map_tool_call_id(b.id, target.max_id_len)
        elif (
            m.role == "tool" and m.tool_call_id and m.tool_call_id not in ids and not target.accepts_id(m.tool_call_id)
        ):
            ids[m.tool_call_id] = map_tool_call_id(m.tool_call_id, target.max_id_len)

    if any(m.details and m.details.get("aborted") for m in messages):
        messages = _without_superseded_partials(messages)
    out: list[Message] = []
    changed = False
    open_calls: list[ToolCallContent] = []  # calls of the last assistant message still unanswered
    answerable: set[str] = set()  # original ids of the last assistant message's calls

    def close_turn() -> None:
        nonlocal changed
        for call in open_calls:
            out.append(_synthetic(call))
            changed = True
        open_calls.clear()

    for m in messages:
        if m.role == "tool":
            original = m.tool_call_id or ""
            if original not in answerable:
                out.append(_orphan(m))
                changed = True
                continue
            answerable.discard(original)  # a second result for the same call is an orphan
            new_id = ids.get(original, original)
            open_calls[:] = [c for c in open_calls if c.id != new_id]
            if new_id != original:
                out.append(replace(m, tool_call_id=new_id))
                changed = True
            else:
                out.append(m)
            continue
        close_turn()
        answerable.clear()
        if m.role == "assistant":
            new = _transform_assistant(m, target, ids)
            changed = changed or new is not m
            out.append(new)
            if not isinstance(m.content, str):
                answerable.update(b.id for b in m.content if isinstance(b, ToolCallContent))
                open_calls.extend(b for b in new.content if isinstance(b, ToolCallContent))
        else:
            out.append(m)
    close_turn()
    return tuple(out) if changed else messages


def chat_target(provider: str) -> Target:
    """The Chat Completions target for `provider` (`openai`, `openai-compatible`, `vllm`...):
    ids of at most 40 characters (OpenAI's limit); thinking the same provider made stays thinking
    (the chat request builder leaves it out), foreign thinking becomes text."""

    def native(block: ThinkingContent, message: Message) -> bool:
        return thinking_origin(block, message) == provider

    return Target(provider, native_thinking=native, max_id_len=40)


def with_extra_params(
    body: dict[str, Any], extra_params: Mapping[str, Any] | None, local: frozenset[str]
) -> dict[str, Any]:
    """`body` with `Endpoint.extra_params` merged in last, except the keys in `local` (settings
    rollouts reads itself and never sends)."""
    for k, v in (extra_params or {}).items():
        if k not in local:
            body[k] = v
    return body
