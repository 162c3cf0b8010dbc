"""Recognise tool calls that a model wrote as text (small local models often do).

Accepted shapes, anywhere in the text: a bare JSON object `{"name": ..., "arguments": {...}}`
and the variants small open models write (`_as_call`: "function"/"tool"/"tool_name" for the
name, "parameters"/"args"/"input" for the arguments, OpenAI's nested `{"function": {...}}`;
arguments may be a JSON-encoded string), alone, in a list, inside a ```json fence, in inline
code (backticks) or inside `<tool_call>...</tool_call>` tags. An object becomes a call ONLY when it parses and its name is
one of the declared tools; everything else is left as text untouched. Wrappers (fences, tags,
the list's brackets) around an extracted call are removed with it, and so is what remains when
it is nothing but punctuation (a stray `{`, `]` or fence): no fragment of a call stays as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

# A wrapper directly around a JSON object: ```json ... ```, inline code `...` (the 1.5B model
# writes a numbered plan with each call in backticks) or <tool_call> ... </tool_call>.
_OPEN_WRAPPER = re.compile(r"(?:```(?:json|tool_call|tool)?|`|<tool_call>)\s*$")
_CLOSE_WRAPPER = re.compile(r"\s*(?:```|`|</tool_call>)")
_DECODER = json.JSONDecoder()
_MAX_SCAN = 64  # bound on the number of candidate objects examined in one text
_MAX_MISSING_BRACES = 3


@dataclass(frozen=True)
class TextToolCall:
    name: str
    arguments: dict[str, Any]
    raw_arguments: str


_NAME_KEYS = ("name", "function", "tool", "tool_name", "function_name")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "tool_input", "params")
_IGNORED_KEYS = frozenset({"type", "id"})


def _arguments(value: Any) -> dict[str, Any] | None:
    """Arguments as an object: given as one, or as a JSON-encoded string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _as_call(obj: Any, names: Collection[str]) -> TextToolCall | None:
    """The call `obj` writes, in any of the shapes small open models use (all seen from the
    embedded Qwen2.5-Coder models and Llama/Hermes-style chat templates):
    `{"name": n, "arguments": {...}}` (or "parameters", "args", "input", "tool_input"),
    `{"function": n, "arguments": {...}}`, `{"tool": n, ...}`, `{"tool_name": n, ...}`,
    `{"function": {"name": n, "arguments": ...}}` and `{"type": "function", "function": {...}}`
    (OpenAI's own shape, written as text). Arguments may be a JSON-encoded string. Only a call
    to a declared tool, with no other keys, counts."""
    if not isinstance(obj, dict):
        return None
    inner = obj.get("function")
    if isinstance(inner, dict) and set(obj) <= {"function", "type", "id"}:
        return _as_call(inner, names)  # {"function": {"name": ..., "arguments": ...}}
    named = [k for k in _NAME_KEYS if isinstance(obj.get(k), str)]
    if len(named) != 1 or obj[named[0]] not in names:
        return None
    rest = set(obj) - {named[0]} - _IGNORED_KEYS
    if len(rest) > 1 or not rest <= set(_ARGUMENT_KEYS):
        return None
    args = _arguments(obj[rest.pop()]) if rest else {}
    if args is None:
        return None
    return TextToolCall(obj[named[0]], args, json.dumps(args, ensure_ascii=False))


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
            return calls, _without_fragments("".join(kept))
        i = text.find("{", pos)
    if not calls:
        return [], text
    kept.append(text[pos:])
    return calls, _without_fragments("".join(kept))


# Leftover punctuation and wrapper markers: a fence opened before several calls (```json) stays
# behind when only the first is taken, or when the calls are cut out one by one.
_FRAGMENT = re.compile(r"(?:[\s{}\[\](),;:`]|```(?:json|tool_call|tool)|</?tool_call>)*")


def _without_fragments(rest: str) -> str:
    """`rest` (the text around extracted calls), or "" if it is only leftover punctuation and
    wrapper markers (fences, `<tool_call>` tags)."""
    return "" if _FRAGMENT.fullmatch(rest) else rest
