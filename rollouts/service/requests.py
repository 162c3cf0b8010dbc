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
from typing import TYPE_CHECKING, Any

from rollouts.dtypes import Message
from rollouts.service.accounts import VersionSpec
from rollouts.service.execution import BUILTIN_SCORERS, ENVIRONMENTS
from rollouts.service.policy import PolicyError, ServicePolicy

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = [
    "ApiError",
    "boolean",
    "integer",
    "invalid",
    "known_fields",
    "not_found",
    "number",
    "obj",
    "parse_endpoint",
    "parse_environment",
    "parse_json",
    "parse_score",
    "parse_tasks",
    "read_body",
    "read_json",
    "string",
    "string_list",
    "version_spec",
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


async def read_body(request: Request, max_bytes: int, what: str = "the request body") -> bytes:
    """The body, at most `max_bytes` (413 naming `what` over it: a declared length is refused
    before reading, a streamed one as soon as it passes the limit). The one reader of request
    bodies: the API's JSON and the UI's forms."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, "too_large", f"{what} is over {max_bytes} bytes", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, "too_large", f"{what} is over {max_bytes} bytes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, at most `max_bytes` (see read_body, parse_json)."""
    return parse_json(await read_body(request, max_bytes))


def not_found(what: str, field: str | None = None) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found", field)


# ---- agents, versions and tasks -------------------------------------------------------------------

_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_BUILTIN_POLICY = ServicePolicy()


def parse_endpoint(
    body: Mapping[str, Any], field: str = "endpoint", required: bool = True, policy: ServicePolicy | None = None
) -> dict[str, Any] | None:
    """The endpoint object `body[field]`, if the operator's policy allows it (its credential,
    address, provider and extra_params; see rollouts.service.policy): 422 naming the field."""
    spec = obj(body, field, required=required)
    if spec is None:
        return None
    string(spec, "model", prefix=f"{field}.", required=True, non_empty=True, max_len=200)
    try:
        return (policy or _BUILTIN_POLICY).check_endpoint(spec, field)
    except PolicyError as e:
        raise invalid(e.field, e.reason) from None


def parse_environment(body: Mapping[str, Any], policy: ServicePolicy | None = None) -> str | None:
    """A built-in name, 'none', an allowed module:Class, or several joined with '+', where
    `mcp/<name>` adds an MCP server the operator's policy defines (e.g. "calculator+mcp/github")."""
    env = string(body, "environment", max_len=300)
    if env is None or env == "none":
        return env
    for part in env.split("+"):
        if part.startswith("mcp/"):
            try:
                (policy or _BUILTIN_POLICY).mcp_server(part.removeprefix("mcp/"), "environment")
            except PolicyError as e:
                raise invalid(e.field, e.reason) from None
        elif part not in ENVIRONMENTS:
            if not _REF.match(part):
                raise invalid(
                    "environment",
                    f"must be one of {', '.join(sorted(ENVIRONMENTS))}, 'none', module:Class or mcp/<server>, "
                    f"or several joined with '+'; got {env!r}",
                )
            _allowed_import(policy, part, "environment")
    return env


def _allowed_import(policy: ServicePolicy | None, ref: str, field: str) -> None:
    try:
        (policy or _BUILTIN_POLICY).check_import(ref, field)
    except PolicyError as e:
        raise invalid(e.field, e.reason) from None


def parse_score(
    body: Mapping[str, Any], name: str = "score", prefix: str = "", required: bool = False,
    policy: ServicePolicy | None = None,
) -> str | None:  # fmt: skip
    ref = string(body, name, prefix=prefix, required=required, max_len=300)
    if ref is None:
        return None
    if ":" in ref:
        if not _REF.match(ref):
            raise invalid(f"{prefix}{name}", f"must look like module:function, got {ref!r}")
        _allowed_import(policy, ref, f"{prefix}{name}")
        return ref
    unknown = [n.strip() for n in ref.split(",") if n.strip() not in BUILTIN_SCORERS]
    if unknown:
        raise invalid(
            f"{prefix}{name}",
            f"unknown scorer {', '.join(unknown)!r}; built-in: {', '.join(sorted(BUILTIN_SCORERS))}, or module:function",
        )
    return ref


def parse_tasks(
    body: Mapping[str, Any], name: str, max_tasks: int, *, ids_required: bool = True
) -> list[tuple[str, dict[str, Any]]]:
    """[(task_id, input)] from `tasks` (each {task_id, user_message | messages, context?})."""
    raw = body.get(name)
    if raw is None:
        raise invalid(name, "is required")
    if not isinstance(raw, list):
        raise invalid(name, "must be an array of tasks")
    if not raw:
        raise invalid(name, "must not be empty")
    if len(raw) > max_tasks:
        raise invalid(name, f"has {len(raw)} tasks; at most {max_tasks} per request")
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, task in enumerate(raw):
        p = f"{name}[{i}]"
        if not isinstance(task, dict):
            raise invalid(p, "must be an object")
        tid = string(task, "task_id", prefix=f"{p}.", required=ids_required, non_empty=True, max_len=200)
        tid = tid if tid is not None else str(i)
        if tid in seen:
            raise invalid(f"{p}.task_id", f"duplicate task_id {tid!r} (also {name}[{seen[tid]}])")
        seen[tid] = i
        user = string(task, "user_message", prefix=f"{p}.", nul=True)  # (stored inside JSON: any text)
        messages = task.get("messages")
        if (user is None) == (messages is None):
            raise invalid(p, "give exactly one of user_message or messages")
        inp: dict[str, Any] = {}
        if user is not None:
            inp["user_message"] = user
        else:
            if not isinstance(messages, list) or not messages:
                raise invalid(f"{p}.messages", "must be a non-empty array of messages")
            for j, m in enumerate(messages):
                try:
                    if not isinstance(m, dict):
                        raise TypeError("must be an object")
                    Message.from_dict(m)
                except (KeyError, TypeError, ValueError) as e:
                    raise invalid(f"{p}.messages[{j}]", f"is not a message ({e})") from None
            inp["messages"] = messages
        context = obj(task, "context", prefix=f"{p}.")
        if context is not None:
            inp["context"] = context
        out.append((tid, inp))
    return out


def version_spec(
    body: Mapping[str, Any], base: Mapping[str, Any] | None, policy: ServicePolicy | None = None
) -> VersionSpec:
    """A version from the body, fields it does not give taken from `base` (the active version)."""
    endpoint = parse_endpoint(body, required=base is None, policy=policy)
    environment = parse_environment(body, policy)
    system_prompt = string(body, "system_prompt", max_len=200_000)
    max_turns = integer(body, "max_turns", minimum=1, maximum=1000)
    tags = string_list(body, "tags", max_items=100)
    b = base or {}
    return VersionSpec(
        endpoint=endpoint if endpoint is not None else b["endpoint"],
        environment=environment if "environment" in body else b.get("environment"),
        system_prompt=system_prompt if system_prompt is not None else b.get("system_prompt", ""),
        max_turns=max_turns if max_turns is not None else b.get("max_turns", 10),
        tags=tuple(tags if tags is not None else b.get("tags", ())),
    )


def known_fields(body: Mapping[str, Any], known: tuple[str, ...], prefix: str = "") -> None:
    """422 naming the first field `body` has that is not in `known` (a misspelt or misplaced
    field is never silently dropped)."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise invalid(f"{prefix}{unknown[0]}", f"unknown field; known: {', '.join(sorted(known))}")
