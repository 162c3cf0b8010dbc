"""Any Python text, stored losslessly: lone surrogates in JSON, surrogate pairs joined.

A Python `str` may hold a lone surrogate (U+D800..U+DFFF): a server's JSON escape such as
`"\\ud83d"`, or a row read by `json.loads`. UTF-8 cannot encode it, so `str.encode("utf-8")`
raises `UnicodeEncodeError`. JSON can: the escape `\\ud83d` is valid JSON, and `json.loads`
gives back exactly that code point. `json_text_utf8` / `escape_lone_surrogates` write such code
points as escapes (only when there are any, so ordinary text costs one failed-free encode).

An astral character (an emoji) that a server escaped as a surrogate pair split across two
streamed deltas arrives as two code points; `join_surrogate_pairs` makes it the one character
it was.
"""

from __future__ import annotations

import re

__all__ = ["escape_lone_surrogates", "has_surrogates", "join_surrogate_pairs", "json_text_utf8"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def has_surrogates(text: str) -> bool:
    """Whether `text` holds any surrogate code point."""
    return _SURROGATE.search(text) is not None


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_lone_surrogates(json_text: str) -> str:
    """`json_text` (JSON as `json.dumps` writes it) with every surrogate code point written as
    its `\\uXXXX` escape: valid JSON that UTF-8 can encode and that reads back to the same text
    (a pair reads back as its astral character)."""
    if _SURROGATE.search(json_text) is None:
        return json_text
    return _SURROGATE.sub(_escape, json_text)


def json_text_utf8(json_text: str) -> bytes:
    """`json_text` (as `json.dumps` writes it) encoded as UTF-8, lone surrogates escaped."""
    try:
        return json_text.encode("utf-8")
    except UnicodeEncodeError:
        return escape_lone_surrogates(json_text).encode("utf-8")


def _join(match: re.Match[str]) -> str:
    pair = match.group()
    return chr(0x10000 + ((ord(pair[0]) - 0xD800) << 10) + (ord(pair[1]) - 0xDC00))


def join_surrogate_pairs(text: str) -> str:
    """`text` with every high+low surrogate pair (an astral character split in two, e.g. by
    streaming) joined into that character; lone surrogates are kept as they are."""
    if _SURROGATE.search(text) is None:
        return text
    return _PAIR.sub(_join, text)
