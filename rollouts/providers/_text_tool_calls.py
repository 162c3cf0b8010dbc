"""Recognise tool calls that a model wrote as text (small local models often do).

Accepted shapes, anywhere in the text: a bare JSON object `{"name": ..., "arguments": {...}}`
(`"parameters"` is accepted for `"arguments"`, and arguments may be a JSON-encoded string), the
same object inside a ```json fence or inside `<tool_call>...</tool_call>` tags. An object becomes
a call ONLY when it parses and its name is one of the declared tools; everything else is left as
text untouched. Wrappers (fences, tags) around an extracted call are removed with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

# A wrapper directly around a JSON object: ```json ... ``` or <tool_call> ... </tool_call>.
_OPEN_WRAPPER = re.compile(r"(?:```(?:json|tool_call|tool)?|<tool_call>)\s*$")
_CLOSE_WRAPPER = re.compile(r"\s*(?:```|</tool_call>)")
_DECODER = json.JSONDecoder()
_MAX_SCAN = 64  # bound on the number of candidate objects examined in one text
_MAX_MISSING_BRACES = 3


@dataclass(frozen=True)
class TextToolCall:
    name: str
    arguments: dict[str, Any]
    raw_arguments: str


def _as_call(obj: Any, names: Collection[str]) -> TextToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in names:
        return None
    keys = set(obj) - {"name", "type", "id"}
    if not keys <= {"arguments", "parameters"} or len(keys) > 1:
        return None
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return TextToolCall(obj["name"], args, json.dumps(args, ensure_ascii=False))


def _decode_at(text: str, i: int) -> tuple[Any, int]:
    """The JSON value starting at `text[i]` and where it ends; an object left unclosed at the
    very end of the text is completed with closing braces. Raises ValueError."""
    try:
        return _DECODER.raw_decode(text, i)
    except ValueError:
        tail = text[i:].rstrip()
        for k in range(1, _MAX_MISSING_BRACES + 1):
            try:
                return json.loads(tail + "}" * k), len(text)
            except ValueError:
                continue
        raise


def extract_text_tool_calls(
    text: str, names: Collection[str], *, limit: int | None = None
) -> tuple[list[TextToolCall], str]:
    """The tool calls found in `text` (at most `limit`) and the text that remains once they
    (and their wrappers) are cut out (not stripped). `([], text)` when there is none."""
    assert limit is None or limit >= 1, "limit must be None or >= 1"
    if not names or "{" not in text:
        return [], text
    calls: list[TextToolCall] = []
    kept: list[str] = []
    pos = 0
    scanned = 0
    i = text.find("{")
    while i >= 0 and scanned < _MAX_SCAN:
        scanned += 1
        try:
            obj, end = _decode_at(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        call = _as_call(obj, names)
        if call is None:
            i = text.find("{", end)
            continue
        start = i
        opener = _OPEN_WRAPPER.search(text, pos, i)
        closer = _CLOSE_WRAPPER.match(text, end)
        if opener is not None and closer is not None:
            start, end = opener.start(), closer.end()
        kept.append(text[pos:start])
        calls.append(call)
        pos = end
        if limit is not None and len(calls) >= limit:
            return calls, "".join(kept)
        i = text.find("{", pos)
    if not calls:
        return [], text
    kept.append(text[pos:])
    return calls, "".join(kept)
