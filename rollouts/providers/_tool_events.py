"""Events of a streamed tool call, shared by every translator and the scripted provider.

A tool call's arguments arrive as pieces of JSON text. Each piece becomes a `ToolCallDelta`
carrying the best parse of everything so far (`partial_arguments`); when the call is complete,
`end_tool_call` turns the whole text into `ToolCallEnd` (a JSON object) or `ToolCallError`
(anything else: the call is kept with its raw text and answered with an error result).
"""

from __future__ import annotations

import json
from typing import Any

from rollouts.dtypes import ToolCall
from rollouts.events import ToolCallDelta, ToolCallEnd, ToolCallError
from rollouts.partial_json import parse_partial_json


def partial_arguments(raw: str) -> dict[str, Any] | None:
    """The best parse of incomplete JSON arguments, or None when they are not (yet) an object."""
    try:
        partial = parse_partial_json(raw)
    except ValueError:
        return None
    return partial if isinstance(partial, dict) else None


def tool_call_delta(index: int, call_id: str, piece: str, raw_so_far: str) -> ToolCallDelta:
    """The delta event for `piece`, the last part of `raw_so_far` (all arguments received)."""
    return ToolCallDelta(index, call_id, piece, partial_arguments(raw_so_far))


def parse_arguments(raw: str) -> dict[str, Any]:
    """Complete JSON arguments as a dict (empty text is `{}`); ValueError for anything else."""
    args = json.loads(raw) if raw.strip() else {}
    if not isinstance(args, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
    return args


def end_tool_call(index: int, call_id: str, name: str, raw: str) -> ToolCallEnd | ToolCallError:
    """The event that ends a tool call whose complete arguments text is `raw`."""
    try:
        args = parse_arguments(raw)
    except ValueError as e:
        return ToolCallError(index, call_id, name, f"invalid JSON arguments: {e}", raw)
    return ToolCallEnd(index, ToolCall(call_id, name, args, raw))
