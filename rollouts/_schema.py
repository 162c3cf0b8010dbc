"""Validate tool arguments against a tool's JSON schema (jsonschema, validators cached)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_cache: dict[str, Any] = {}
_CACHE_MAX = 512


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
    errors = sorted(_validator(schema).iter_errors(dict(arguments)), key=lambda e: list(e.path))
    if not errors:
        return None
    parts = []
    for e in errors[:5]:
        where = "/".join(str(p) for p in e.path)
        parts.append(f"{where}: {e.message}" if where else e.message)
    return "; ".join(parts)
