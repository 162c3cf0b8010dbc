"""Streaming events emitted while a model call is in flight and while tools run.

Every provider emits the same vocabulary in the same order:

    LLMCallStart, StreamStart,
      (TextStart TextDelta* TextEnd
       | ThinkingStart ThinkingDelta* ThinkingSignature* ThinkingEnd
       | ToolCallStart ToolCallDelta* (ToolCallEnd | ToolCallError))*,
    StreamDone

and the agent loop adds ToolExecutionStart / ToolResultReceived for each tool call it answers.

`content_index` is the position of the block in the final message's content. A stream that
breaks after output was emitted and is retried emits `StreamError(will_retry=True)`: consumers
(and the aggregator) must discard the partial message, then a fresh `StreamStart` follows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from rollouts._unicode import join_surrogate_pairs
from rollouts.dtypes import ToolCall, ToolResult, Usage

__all__ = [
    "LLMCallStart",
    "OnChunk",
    "StreamDone",
    "StreamError",
    "StreamEvent",
    "StreamStart",
    "TextDelta",
    "TextEnd",
    "TextStart",
    "ThinkingDelta",
    "ThinkingEnd",
    "ThinkingSignature",
    "ThinkingStart",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallError",
    "ToolCallStart",
    "ToolExecutionStart",
    "ToolResultReceived",
    "ignore_chunk",
]


@dataclass(frozen=True)
class LLMCallStart:
    """A model call begins (before any network I/O): which provider and model."""

    provider: str
    model: str


@dataclass(frozen=True)
class StreamStart:
    """An attempt's stream is open. `attempt` counts from 1; after `StreamError(will_retry=True)`
    a new StreamStart begins the retried attempt from scratch."""

    attempt: int = 1


@dataclass(frozen=True)
class TextStart:
    """A text block begins at `content_index`."""

    content_index: int


@dataclass(frozen=True)
class TextDelta:
    """A piece of the text block at `content_index`."""

    content_index: int
    delta: str


@dataclass(frozen=True)
class TextEnd:
    """The text block at `content_index` is complete; `text` is all of it (an astral character
    whose surrogate halves arrived in two deltas is joined back into one)."""

    content_index: int
    text: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", join_surrogate_pairs(self.text))


@dataclass(frozen=True)
class ThinkingStart:
    """A thinking (reasoning) block begins; `redacted` blocks carry opaque data, no text."""

    content_index: int
    redacted: bool = False


@dataclass(frozen=True)
class ThinkingDelta:
    """A piece of the thinking block's text."""

    content_index: int
    delta: str


@dataclass(frozen=True)
class ThinkingSignature:
    """A signature for the thinking block at `content_index` (Anthropic sends it at the end)."""

    content_index: int
    signature: str


@dataclass(frozen=True)
class ThinkingEnd:
    """The thinking block is complete: its text, the provider's `signature` (sent back verbatim
    on later turns) and, for redacted thinking, its opaque `data`."""

    content_index: int
    thinking: str
    signature: str | None = None
    redacted: bool = False
    data: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "thinking", join_surrogate_pairs(self.thinking))


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call begins: its id and the tool's name."""

    content_index: int
    tool_call_id: str
    tool_name: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a tool call's JSON arguments; `partial_args` is the best parse so far."""

    content_index: int
    tool_call_id: str
    delta: str
    partial_args: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ToolCallEnd:
    """The tool call's arguments are complete and parsed into a JSON object."""

    content_index: int
    tool_call: ToolCall


@dataclass(frozen=True)
class ToolCallError:
    """The model's arguments for this call did not parse; the call is kept with `parse_error`
    set and answered with an error tool result."""

    content_index: int
    tool_call_id: str
    tool_name: str
    error: str
    raw_arguments: str


@dataclass(frozen=True)
class ToolExecutionStart:
    """The agent loop starts running a tool call (after any confirmation)."""

    tool_call_id: str
    tool_name: str


@dataclass(frozen=True)
class ToolResultReceived:
    """A tool call's result (also error results: unknown tool, bad arguments, denied, raised)."""

    tool_call_id: str
    tool_name: str
    result: ToolResult


@dataclass(frozen=True)
class StreamDone:
    """The model finished: the shared finish reason (`stop`, `tool_use`, `max_tokens`, ...) and
    the call's Usage as the provider reported it (with `cost_usd` from the price table)."""

    finish_reason: str | None
    usage: Usage


@dataclass(frozen=True)
class StreamError:
    """The stream failed. With `will_retry` the partial output so far is void and a new attempt
    starts; without it the call fails and an exception follows."""

    error: str
    will_retry: bool = False
    attempt: int = 1


StreamEvent: TypeAlias = (
    LLMCallStart
    | StreamStart
    | TextStart
    | TextDelta
    | TextEnd
    | ThinkingStart
    | ThinkingDelta
    | ThinkingSignature
    | ThinkingEnd
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | ToolCallError
    | ToolExecutionStart
    | ToolResultReceived
    | StreamDone
    | StreamError
)

OnChunk: TypeAlias = Callable[[StreamEvent], Awaitable[None]]


async def ignore_chunk(event: StreamEvent) -> None:
    """The default `on_chunk`: does nothing."""
    return None
