"""Validate tool arguments against a tool's JSON schema.

The agent loop checks every tool call, so the common case is made cheap: a schema built only
from the everyday keywords (`type`, `properties`, `required`, `additionalProperties`, `items`,
string `enum`, and annotations such as `description`) is compiled once into a small checker
that can only ever say "valid" when jsonschema would. Anything else — a richer schema, or
arguments the checker does not accept — goes to jsonschema itself (validators cached), which
also writes the error message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

_Check = Callable[[Any], bool]

_cache: dict[str, Any] = {}
# id(schema) -> (schema, fast checker or None): a Tool's parameters are one read-only object
# for its lifetime, so nothing is serialized per call (the entry holds the schema, so its id
# cannot be reused while cached).
_by_id: dict[int, tuple[Mapping[str, Any], _Check | None]] = {}
_CACHE_MAX = 512

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "deprecated", "readOnly", "writeOnly"}
)
_TYPE_CHECKS: dict[str, _Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": lambda x: type(x) is int or type(x) is float,
    "integer": lambda x: type(x) is int,
}


def _always(x: Any) -> bool:
    return True


def _any_type(checks: tuple[_Check, ...]) -> _Check:
    return lambda x: any(t(x) for t in checks)


def _one_of(allowed: frozenset[str]) -> _Check:
    return lambda x: isinstance(x, str) and x in allowed


def _has_keys(required: tuple[str, ...]) -> _Check:
    return lambda x: not isinstance(x, dict) or all(k in x for k in required)


def _each_item(check: _Check) -> _Check:
    return lambda x: not isinstance(x, list) or all(check(v) for v in x)


def _all_of(checks: tuple[_Check, ...]) -> _Check:
    return lambda x: all(c(x) for c in checks)


def _compile(schema: Any) -> _Check | None:
    """A checker that returns True only for instances valid under `schema` (False: ask
    jsonschema), or None if `schema` uses anything outside the everyday subset."""
    if schema is True:
        return _always
    if not isinstance(schema, Mapping):
        return None
    checks: list[_Check] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not names or any(n not in _TYPE_CHECKS for n in names):
                return None
            checks.append(_any_type(tuple(_TYPE_CHECKS[n] for n in names)))
        elif key == "enum":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return None
            checks.append(_one_of(frozenset(value)))
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return None
            checks.append(_has_keys(tuple(value)))
        elif key not in ("properties", "additionalProperties", "items"):
            return None
    props: dict[str, _Check] = {}
    if "properties" in schema:
        if not isinstance(schema["properties"], Mapping):
            return None
        for name, sub in schema["properties"].items():
            compiled = _compile(sub)
            if compiled is None:
                return None
            props[name] = compiled
    additional: _Check | None = _always
    if "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        additional = None if extra is False else _compile(extra)
        if additional is None and extra is not False:
            return None
    if props or "additionalProperties" in schema:

        def check_object(x: Any, props: dict[str, _Check] = props, additional: _Check | None = additional) -> bool:
            if not isinstance(x, dict):
                return True
            for k, v in x.items():
                check = props.get(k, additional)
                if check is None or not check(v):
                    return False
            return True

        checks.append(check_object)
    if "items" in schema:
        item_check = _compile(schema["items"])
        if item_check is None:
            return None
        checks.append(_each_item(item_check))
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return _all_of(tuple(checks))


def _fast_check(schema: Mapping[str, Any]) -> _Check | None:
    entry = _by_id.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    check = _compile(schema)
    if len(_by_id) >= _CACHE_MAX:
        _by_id.clear()
    _by_id[id(schema)] = (schema, check)
    return check


def _validator(schema: Mapping[str, Any]) -> Any:
    key = json.dumps(schema, sort_keys=True, default=str)
    v = _cache.get(key)
    if v is None:
        import jsonschema

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        v = cls(schema)
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = v
    return v


def argument_errors(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """A readable description of why `arguments` do not fit `schema`, or None if they do."""
    if not schema:
        return None
    instance = arguments if isinstance(arguments, dict) else dict(arguments)
    check = _fast_check(schema)
    if check is not None and check(instance):
        return None
    errors = sorted(_validator(schema).iter_errors(instance), key=lambda e: list(e.path))
    if not errors:
        return None
    parts = []
    for e in errors[:5]:
        where = "/".join(str(p) for p in e.path)
        parts.append(f"{where}: {e.message}" if where else e.message)
    return "; ".join(parts)
