"""Terminal rendering of stream events, and the `--json` event stream.

Human output: the answer text streams to stdout; thinking (dimmed), tool calls and tool results
(one compact line each) and status lines go to stderr, so `rollouts run -p ... > answer.txt`
captures just the answer while a terminal shows everything in order.

JSON output (`--json`): one JSON object per line on stdout, one per stream event
(`{"type": "text_delta", "content_index": 0, "delta": "Hel"}`) plus the run-level records
`UserMessage` (`user_message`, before the turn it starts) and `RunEnd` (`run_end`, after every
turn, also one that failed). `event_to_dict` / `event_from_dict` convert every line both ways.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import IO, Any, TypeAlias

from rollouts.dtypes import ToolCall, ToolResult, Usage
from rollouts.environments.base import Environment
from rollouts.events import (
    LLMCallStart,
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
    ToolExecutionStart,
    ToolResultReceived,
)

__all__ = [
    "JsonRecord",
    "JsonRenderer",
    "RunEnd",
    "TerminalRenderer",
    "UserMessage",
    "event_from_dict",
    "event_to_dict",
    "use_color",
]


@dataclass(frozen=True)
class UserMessage:
    """`--json` record: the user's message that starts a turn."""

    text: str


@dataclass(frozen=True)
class RunEnd:
    """`--json` record: a turn ended. `stop` is the StopReason's value (`provider_error` for a
    call that failed outright, e.g. a rejected key; None for another error); `error` says what
    went wrong; `text` is the last assistant message's text."""

    session_id: str | None
    stop: str | None
    error: str | None
    turns: int
    text: str
    usage: Usage = field(default_factory=Usage)


JsonRecord: TypeAlias = StreamEvent | UserMessage | RunEnd

_EVENT_TYPES: tuple[type, ...] = (
    LLMCallStart,
    StreamStart,
    TextStart,
    TextDelta,
    TextEnd,
    ThinkingStart,
    ThinkingDelta,
    ThinkingSignature,
    ThinkingEnd,
    ToolCallStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    ToolExecutionStart,
    ToolResultReceived,
    StreamDone,
    StreamError,
    UserMessage,
    RunEnd,
)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().replace("l_l_m", "llm")


_BY_TYPE: dict[str, type] = {_snake(cls.__name__): cls for cls in _EVENT_TYPES}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if isinstance(value, ToolResult | ToolCall):
            return value.to_dict()
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def event_to_dict(event: JsonRecord) -> dict[str, Any]:
    """`{"type": "<snake_case event name>", **fields}` (JSON-safe): one `--json` line."""
    d = {"type": _snake(type(event).__name__)}
    d.update(_plain(event))
    return d


def event_from_dict(data: Mapping[str, Any]) -> JsonRecord:
    """The event or run-level record `event_to_dict` made: any line `rollouts run --json`
    prints parses back (an unknown `type` is a ValueError naming the known ones)."""
    cls = _BY_TYPE.get(data.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown event type {data.get('type')!r}; known: {', '.join(sorted(_BY_TYPE))}")
    kwargs = {k: v for k, v in data.items() if k != "type"}
    if cls is ToolCallEnd:
        kwargs["tool_call"] = ToolCall.from_dict(kwargs["tool_call"])
    elif cls is ToolResultReceived:
        kwargs["result"] = ToolResult.from_dict(kwargs["result"])
    elif cls is StreamDone or cls is RunEnd:
        kwargs["usage"] = Usage.from_dict(kwargs["usage"])
    record: JsonRecord = cls(**kwargs)
    return record


def use_color(stream: IO[str]) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


_DIM, _RED, _CYAN, _RESET = "\x1b[2m", "\x1b[31m", "\x1b[36m", "\x1b[0m"


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _format_args(arguments: Mapping[str, Any], limit: int = 120) -> str:
    parts = []
    for k, v in arguments.items():
        shown = v if isinstance(v, int | float | bool) or v is None else json.dumps(v, ensure_ascii=False)
        parts.append(f"{k}={shown}")
    return _one_line(", ".join(parts), limit)


class TerminalRenderer:
    """Renders events for people. `on_chunk` is a RunConfig.on_chunk."""

    def __init__(
        self,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        *,
        color: bool | None = None,
        show_thinking: bool = True,
        environment: Environment | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.color = use_color(self.err) if color is None else color
        self.show_thinking = show_thinking
        self.environment = environment
        self._out_open = False  # stdout has text on an unfinished line
        self._err_open = False
        self._calls: dict[str, ToolCall] = {}
        utf = (getattr(self.err, "encoding", "") or "").lower().replace("-", "") == "utf8"
        self._to, self._from = ("→", "←") if utf else ("->", "<-")

    def _style(self, text: str, code: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def _write_out(self, text: str) -> None:
        if self._err_open:
            self._newline_err()
        self.out.write(text)
        self.out.flush()
        self._out_open = not text.endswith("\n")

    def _write_err(self, text: str) -> None:
        if self._out_open:
            self.out.write("\n")
            self.out.flush()
            self._out_open = False
        self.err.write(text)
        self.err.flush()
        self._err_open = not text.endswith("\n")

    def _newline_err(self) -> None:
        self.err.write("\n")
        self.err.flush()
        self._err_open = False

    def finish_line(self) -> None:
        """End any unfinished line (e.g. after a cancelled turn)."""
        if self._out_open:
            self._write_out("\n")
        if self._err_open:
            self._newline_err()

    def status(self, text: str, *, error: bool = False) -> None:
        """A status line on stderr (dimmed, or red for errors)."""
        if self._err_open:
            self._newline_err()
        self._write_err(self._style(text, _RED if error else _DIM) + "\n")

    def _tool_line(self, call: ToolCall | None, result: ToolResult) -> str:
        fmt = self.environment.get_tool_formatter(call.name) if (self.environment and call) else None
        if fmt is not None and call is not None:
            try:
                return _one_line(fmt(call, result))
            except Exception as e:  # a formatter bug must not break the run
                return f"(formatter failed: {e}) {_one_line(result.content)}"
        return _one_line(result.content)

    async def on_chunk(self, event: StreamEvent) -> None:
        if isinstance(event, TextDelta):
            self._write_out(event.delta)
        elif isinstance(event, TextEnd):
            if self._out_open:
                self._write_out("\n")
        elif isinstance(event, ThinkingStart):
            if self.show_thinking:
                self._write_err(self._style("thinking: " if not event.redacted else "thinking (redacted)", _DIM))
        elif isinstance(event, ThinkingDelta):
            if self.show_thinking:
                self._write_err(self._style(event.delta, _DIM))
        elif isinstance(event, ThinkingEnd):
            if self.show_thinking and self._err_open:
                self._newline_err()
        elif isinstance(event, ToolCallEnd):
            call = event.tool_call
            self._calls[call.id] = call
            self._write_err(self._style(f"  {self._to} {call.name}({_format_args(call.arguments)})", _CYAN) + "\n")
        elif isinstance(event, ToolCallError):
            self._write_err(
                self._style(f"  {self._to} {event.tool_name}: arguments are not valid JSON ({event.error})", _RED)
                + "\n"
            )
        elif isinstance(event, ToolResultReceived):
            line = self._tool_line(self._calls.pop(event.tool_call_id, None), event.result)
            if event.result.is_error:
                self._write_err(self._style(f"  {self._from} error: {line}", _RED) + "\n")
            else:
                self._write_err(self._style(f"  {self._from} {line}", _DIM) + "\n")
        elif isinstance(event, StreamError) and event.will_retry:
            # a final failure is reported once, by the command, when the run ends
            self.finish_line()
            self.status(f"[attempt {event.attempt} failed, retrying: {_one_line(event.error)}]")


class JsonRenderer:
    """One JSON object per line on `out`: every stream event plus run-level records."""

    def __init__(self, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout

    def record(self, record: JsonRecord) -> None:
        """Write one event or run-level record as a line."""
        self.out.write(json.dumps(event_to_dict(record), ensure_ascii=False, separators=(",", ":")) + "\n")
        self.out.flush()

    async def on_chunk(self, event: StreamEvent) -> None:
        self.record(event)
