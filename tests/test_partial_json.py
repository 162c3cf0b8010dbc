"""The partial-JSON parser used for streamed tool arguments (property-tested)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollouts.partial_json import parse_partial_json

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


def _is_prefix_value(partial: Any, full: Any) -> bool:
    """Whether `partial` is what a prefix of `full`'s JSON may determine."""
    if partial is None and full is not None:
        return True  # nothing known yet (also a dropped literal / number sign)
    if isinstance(full, dict):
        if not isinstance(partial, dict):
            return False
        if list(partial) != list(full)[: len(partial)]:
            return False
        keys = list(partial)
        # every member but the last is complete; the last may still be arriving
        return all(partial[k] == full[k] for k in keys[:-1]) and (
            not keys or _is_prefix_value(partial[keys[-1]], full[keys[-1]])
        )
    if isinstance(full, list):
        if not isinstance(partial, list) or len(partial) > len(full):
            return False
        return all(p == f for p, f in zip(partial[:-1], full, strict=False)) and (
            not partial or _is_prefix_value(partial[-1], full[len(partial) - 1])
        )
    if isinstance(full, str):
        return isinstance(partial, str) and full.startswith(partial)
    if isinstance(full, bool) or full is None:
        return partial == full
    if isinstance(full, int | float):
        # a number still arriving parses as the number its digits so far spell
        return isinstance(partial, int | float) and not isinstance(partial, bool)
    return False


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_every_prefix_parses_to_a_prefix_of_the_value(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert parse_partial_json(text) == value
    for cut in range(len(text)):
        partial = parse_partial_json(text[:cut])
        assert _is_prefix_value(partial, value), (text[:cut], partial, value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=5), json_values, min_size=1, max_size=4))
def test_objects_never_lose_completed_members(value: dict) -> None:
    text = json.dumps(value)
    seen_keys = 0
    for cut in range(1, len(text) + 1):
        partial = parse_partial_json(text[:cut])
        assert isinstance(partial, dict)
        assert len(partial) >= seen_keys - 1  # the in-flight member may appear late, never vanish twice
        seen_keys = max(seen_keys, len(partial))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("{", {}),
        ('{"a', {}),
        ('{"a":', {}),
        ('{"a": "hel', {"a": "hel"}),
        ('{"a": "x\\', {"a": "x"}),
        ('{"a": "\\u00e', {"a": ""}),
        ('{"a": 12.', {"a": 12}),
        ('{"a": tr', {}),
        ('{"a": [1, {"b": [', {"a": [1, {"b": []}]}),
        ('{"a": {"b": {"c": [1, 2], "d"', {"a": {"b": {"c": [1, 2]}}}),
        ("[1, 2, ", [1, 2]),
        ('{"path": "src/main.py", "content": "line1\\nline', {"path": "src/main.py", "content": "line1\nline"}),
    ],
)
def test_known_prefixes(text: str, expected: Any) -> None:
    assert parse_partial_json(text) == expected


@pytest.mark.parametrize("text", ['{"a" 1}', "{1: 2}", '{"a": 1} x', "[1,, 2]", '{"a": @}', '"\\x"'])
def test_text_that_cannot_start_json_raises(text: str) -> None:
    with pytest.raises(ValueError):
        parse_partial_json(text)
