"""Reading API request bodies: JSON within a size limit, each field checked, every problem a
4xx `ApiError` naming the field (`tasks[3].task_id`), so nothing half-valid is accepted.

    body = await read_json(request, max_bytes)
    name = string(body, "name", required=True, max_len=200)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "ApiError",
    "boolean",
    "integer",
    "number",
    "obj",
    "parse_json",
    "string",
    "string_list",
]


class ApiError(Exception):
    """An error answered as `{"error": {"code", "message", "field"?}}` with `status`."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            err["field"] = self.field
        return {"error": err}


def invalid(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid", f"{field}: {message}", field)


_MAX_DEPTH = 64  # nesting of arrays and objects a request may use (a message's content is ~5 deep)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large")
    return value


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (400 for malformed JSON, NaN/Infinity, numbers too large for a
    float or too long for an integer, nesting deeper than 64, or another JSON type; 422 naming
    the field for a string with a lone surrogate, which no database stores)."""
    try:
        data = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON{pos}", "body") from None
    except RecursionError:
        raise ApiError(
            400, "malformed_json", f"the request body nests deeper than {_MAX_DEPTH} levels", "body"
        ) from None
    except ValueError as e:  # NaN/Infinity, 1e999, an integer of over 4,300 digits
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {e}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "malformed_json", f"the request body must be a JSON object, not {_kind(data)}", "body")
    _check_text(data, surrogates=_SURROGATE_ESCAPE.search(raw) is not None)
    return data


def _check_text(data: Any, *, surrogates: bool) -> None:
    """400 for nesting deeper than `_MAX_DEPTH`; with `surrogates` (the raw body escapes one),
    422 naming the first string or key holding a lone surrogate. Iterative: any depth is safe."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= _MAX_DEPTH:
                raise ApiError(400, "malformed_json", f"the request body nests deeper than {_MAX_DEPTH} levels", "body")
            for k, v in value.items():
                sub = f"{path}.{k}" if path else str(k)
                if surrogates and _SURROGATE.search(k):
                    raise invalid(
                        _printable(path or "body"), "has a key with a lone surrogate (not valid Unicode text)"
                    )
                stack.append((v, sub, depth + 1))
        elif isinstance(value, list):
            if depth >= _MAX_DEPTH:
                raise ApiError(400, "malformed_json", f"the request body nests deeper than {_MAX_DEPTH} levels", "body")
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
        elif surrogates and isinstance(value, str) and _SURROGATE.search(value):
            raise invalid(_printable(path), "holds a lone surrogate (not valid Unicode text)")


def _printable(path: str) -> str:
    """A field path safe to echo (a key may itself hold what is refused)."""
    return _SURROGATE.sub("\ufffd", path).replace("\x00", "\ufffd")[:200]


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN or an infinity"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def _get(body: Mapping[str, Any], name: str, prefix: str, required: bool) -> tuple[Any, str]:
    path = f"{prefix}{name}"
    if name not in body or body[name] is None:
        if required:
            raise invalid(path, "is required")
        return None, path
    return body[name], path


def string(
    body: Mapping[str, Any], name: str, *, prefix: str = "", required: bool = False, max_len: int = 1_000_000,
    non_empty: bool = False, nul: bool = False,
) -> str | None:  # fmt: skip
    """`body[name]` as a string; NUL characters only with `nul` (free text stored inside JSON:
    a name, id, key or prompt is a database column, which on PostgreSQL cannot hold one)."""
    v, path = _get(body, name, prefix, required)
    if v is None:
        return None
    if not isinstance(v, str):
        raise invalid(path, f"must be a string, not {_kind(v)}")
    if not nul and "\x00" in v:
        raise invalid(path, "must not contain NUL characters (\\u0000)")
    if non_empty and not v.strip():
        raise invalid(path, "must not be empty")
    if len(v) > max_len:
        raise invalid(path, f"is too long ({len(v)} characters; at most {max_len})")
    return v


def integer(
    body: Mapping[str, Any], name: str, *, prefix: str = "", required: bool = False, minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:  # fmt: skip
    v, path = _get(body, name, prefix, required)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid(path, f"must be an integer, not {_kind(v)}")
    if minimum is not None and v < minimum:
        raise invalid(path, f"must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise invalid(path, f"must be <= {maximum}, got {v}")
    return v


def number(
    body: Mapping[str, Any], name: str, *, prefix: str = "", required: bool = False, minimum: float | None = None,
    maximum: float | None = None,
) -> float | None:  # fmt: skip
    v, path = _get(body, name, prefix, required)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise invalid(path, f"must be a number, not {_kind(v)}")
    if minimum is not None and v < minimum:
        raise invalid(path, f"must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise invalid(path, f"must be <= {maximum}, got {v}")
    return float(v)


def boolean(body: Mapping[str, Any], name: str, *, prefix: str = "") -> bool | None:
    v, path = _get(body, name, prefix, False)
    if v is None:
        return None
    if not isinstance(v, bool):
        raise invalid(path, f"must be true or false, not {_kind(v)}")
    return v


def obj(body: Mapping[str, Any], name: str, *, prefix: str = "", required: bool = False) -> dict[str, Any] | None:
    v, path = _get(body, name, prefix, required)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise invalid(path, f"must be an object, not {_kind(v)}")
    return v


def string_list(body: Mapping[str, Any], name: str, *, prefix: str = "", max_items: int = 1000) -> list[str] | None:
    v, path = _get(body, name, prefix, False)
    if v is None:
        return None
    if not isinstance(v, list):
        raise invalid(path, f"must be an array of strings, not {_kind(v)}")
    if len(v) > max_items:
        raise invalid(path, f"has {len(v)} items; at most {max_items}")
    for i, item in enumerate(v):
        if not isinstance(item, str):
            raise invalid(f"{path}[{i}]", f"must be a string, not {_kind(item)}")
        if "\x00" in item:
            raise invalid(f"{path}[{i}]", "must not contain NUL characters (\\u0000)")
    return list(v)
