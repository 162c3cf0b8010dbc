"""Reading API request bodies: JSON within a size limit, each field checked, every problem a
4xx `ApiError` naming the field (`tasks[3].task_id`), so nothing half-valid is accepted.

    body = await read_json(request, max_bytes)
    name = string(body, "name", required=True, max_len=200)
"""

from __future__ import annotations

import json
import math
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


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object (400 for malformed JSON or another JSON type)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON{pos}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "malformed_json", f"the request body must be a JSON object, not {_kind(data)}", "body")
    return data


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
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
    non_empty: bool = False,
) -> str | None:  # fmt: skip
    v, path = _get(body, name, prefix, required)
    if v is None:
        return None
    if not isinstance(v, str):
        raise invalid(path, f"must be a string, not {_kind(v)}")
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
    return list(v)
