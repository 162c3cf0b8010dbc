"""Parse a prefix of a JSON document into the most complete value it determines.

Used for streamed tool-call arguments: after every delta, `parse_partial_json(buffer)` returns
what is known so far. Rules:

* complete members are kept; a member whose value has not started is dropped;
* an unterminated string *value* is kept as far as it goes (never cutting an escape);
  an unterminated object *key* is dropped;
* a number is kept once it is a valid number prefix (`12` of `12.5`), literals only when whole;
* open objects and arrays are closed.

Text that cannot be the start of any JSON document raises `ValueError`.
"""

from __future__ import annotations

import json
import re
from typing import Any

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_WS = " \t\n\r"
_HEX = frozenset("0123456789abcdefABCDEF")

# Container states.
_KEY = 0  # object: expecting a key (or '}')
_COLON = 1  # object: key read, expecting ':'
_VALUE = 2  # expecting a value (or ']' right after '[')
_AFTER = 3  # value read, expecting ',' or the closer


def _closers(stack: list[list[Any]]) -> str:
    return "".join("}" if c[0] == "{" else "]" for c in reversed(stack))


def _scan_string(text: str, start: int) -> tuple[int, int]:
    """Scan a string starting at the quote `start`.

    Returns (end, safe): `end` is the index after the closing quote, or -1 if the string is
    unterminated; then `safe` is the index up to which the content can be cut without
    splitting an escape sequence."""
    n = len(text)
    j = start + 1
    while j < n:
        c = text[j]
        if c == '"':
            return j + 1, j
        if c == "\\":
            if j + 1 >= n:
                return -1, j
            esc = text[j + 1]
            if esc == "u":
                if j + 6 > n:
                    return -1, j
                code = text[j + 2 : j + 6]
                if not all(h in _HEX for h in code):
                    raise ValueError(f"invalid \\u escape at {j}")
                if 0xD800 <= int(code, 16) <= 0xDBFF and (j + 6 == n or (text[j + 6] == "\\" and j + 12 > n)):
                    return -1, j  # never split a surrogate pair
                j += 6
                continue
            if esc not in '"\\/bfnrt':
                raise ValueError(f"invalid escape at {j}")
            j += 2
            continue
        if c < " ":
            raise ValueError(f"control character in string at {j}")
        j += 1
    return -1, n


def parse_partial_json(text: str) -> Any:
    """The value determined so far by `text`, a prefix of a JSON document (None if nothing)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    n = len(text)
    stack: list[list[Any]] = []  # [opener, state]
    top_done = False
    # The best cut: text[:cut] + extra + closers is valid JSON.
    best: str | None = None
    i = 0
    while i < n:
        c = text[i]
        if c in _WS:
            i += 1
            continue
        if top_done:
            raise ValueError(f"unexpected data after the JSON value at {i}")
        state = stack[-1][1] if stack else _VALUE
        if state == _AFTER:
            if c == ",":
                stack[-1][1] = _KEY if stack[-1][0] == "{" else _VALUE
                i += 1
                continue
            if (c == "}" and stack[-1][0] == "{") or (c == "]" and stack[-1][0] == "["):
                stack.pop()
                i += 1
                _value_done(stack)
                top_done = not stack
                best = text[:i] + _closers(stack)
                continue
            raise ValueError(f"expected ',' or a closing bracket at {i}")
        if state == _COLON:
            if c != ":":
                raise ValueError(f"expected ':' at {i}")
            stack[-1][1] = _VALUE
            i += 1
            continue
        if state == _KEY:
            if c == "}":
                stack.pop()
                i += 1
                _value_done(stack)
                top_done = not stack
                best = text[:i] + _closers(stack)
                continue
            if c != '"':
                raise ValueError(f"expected an object key at {i}")
            end, _ = _scan_string(text, i)
            if end < 0:
                break  # unterminated key: dropped
            stack[-1][1] = _COLON
            i = end
            continue
        # state == _VALUE
        if c in "{[":
            stack.append([c, _KEY if c == "{" else _VALUE])
            i += 1
            best = text[:i] + _closers(stack)
            continue
        if c == "]" and stack and stack[-1][0] == "[":
            stack.pop()
            i += 1
            _value_done(stack)
            top_done = not stack
            best = text[:i] + _closers(stack)
            continue
        if c == '"':
            end, safe = _scan_string(text, i)
            if end < 0:
                best = text[:safe] + '"' + _closers(stack)
                break
            i = end
            _value_done(stack)
            top_done = not stack
            best = text[:i] + _closers(stack)
            continue
        if c == "-" or c.isdigit():
            m = _NUMBER.match(text, i)
            end = m.end() if m else i
            rest = text[end:]
            if rest and all(ch in _NUMBER_CHARS for ch in rest):
                # The number runs to the end of the text and may still grow.
                if m:
                    best = text[:end] + _closers(stack)
                break
            if not m:
                raise ValueError(f"invalid number at {i}")
            i = end
            _value_done(stack)
            top_done = not stack
            best = text[:i] + _closers(stack)
            continue
        for lit in _LITERALS:
            if text.startswith(lit, i):
                i += len(lit)
                _value_done(stack)
                top_done = not stack
                best = text[:i] + _closers(stack)
                break
            if lit.startswith(text[i:]):
                i = n  # a literal still arriving: dropped
                break
        else:
            raise ValueError(f"unexpected character {c!r} at {i}")
    if best is None:
        return None
    return json.loads(best)


def _value_done(stack: list[list[Any]]) -> None:
    if stack:
        stack[-1][1] = _AFTER
