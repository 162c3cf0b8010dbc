"""What makes a sample's outcome what it is, as short hashes: resume reuses a recorded sample only
when every part still matches.

    fp = task_fingerprint(config)           # endpoint, environment, max_turns, score_fn
    fp = fp.with_messages(messages)         # + the prepared messages (system prompt included)
    fp.differences(recorded)                # ["score_fn"]: what changed, by name

Parts:
* `endpoint`: provider, model, api_base (credentials blanked), max_tokens, temperature, thinking
  and extra_params (secret-looking entries blanked). The API key, timeout, retries and transport
  do not change an outcome and are left out. Only the hash is stored: no secret is ever written.
* `environment`: the factory's identity (see `callable_identity`); for a class (the usual
  `environment_factory=CalculatorEnvironment`) that is the class and its source. The initial
  state an environment serializes is not hashed: it holds per-instance paths (a worktree's root)
  that would make every resume mismatch.
* `max_turns`: the effective bound.
* `score_fn`: its qualified name, a hash of its source, and the values it closes over (so
  `combine(metric("contains", ...))` differs from `combine(metric("exact_match", ...))`).
* `messages`: a hash of the messages `prepare_messages` made for the row (per sample).

A callable may declare its own identity with a `rollouts_fingerprint` attribute (any JSON-safe
value), e.g. for a score function whose behaviour depends on a file it reads.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING, Any

from rollouts._unicode import json_text_utf8
from rollouts.dtypes import Endpoint, Message
from rollouts.eval.io import redact_secrets

if TYPE_CHECKING:
    from rollouts.eval.config import EvalConfig

__all__ = [
    "Fingerprint",
    "callable_identity",
    "describe_parts",
    "endpoint_identity",
    "messages_hash",
    "output_hash",
    "task_fingerprint",
]

_HASH_CHARS = 16
_ENDPOINT_OUTCOME_FIELDS = ("provider", "model", "api_base", "max_tokens", "temperature", "thinking", "extra_params")
_PART_NAMES = {
    "endpoint": "model endpoint (model, api_base, sampling or extra params)",
    "environment": "environment (its factory or class)",
    "max_turns": "max_turns",
    "score_fn": "score function",
    "messages": "prepared messages (system prompt or prepare_messages)",
}


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.sha256(json_text_utf8(text)).hexdigest()[:_HASH_CHARS]  # any text (lone surrogates too)


def endpoint_identity(endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint settings that change what the model answers, secrets blanked."""
    d = endpoint.to_dict()
    return redact_secrets({k: d.get(k) for k in _ENDPOINT_OUTCOME_FIELDS})  # type: ignore[no-any-return]


def _source_hash(obj: Any) -> str | None:
    key = getattr(getattr(obj, "__func__", obj), "__code__", obj)  # a code object or a class
    try:
        return _cached_source_hash(key)
    except TypeError:  # unhashable
        return _read_source_hash(key)


@functools.lru_cache(maxsize=1024)
def _cached_source_hash(key: Any) -> str | None:
    # Keyed by code object (immutable) or class: reading source is the costly part of an identity.
    return _read_source_hash(key)


def _read_source_hash(key: Any) -> str | None:
    try:
        return _digest(inspect.getsource(key))
    except (OSError, TypeError):
        return None


def _value_identity(value: Any, depth: int) -> Any:
    """A JSON-safe stand-in for a value a callable closes over."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_value_identity(v, depth) for v in value[:64]]
    if isinstance(value, Mapping):
        return {str(k): _value_identity(v, depth) for k, v in list(value.items())[:64]}
    if is_dataclass(value) and not isinstance(value, type):
        return {
            "type": f"{type(value).__module__}:{type(value).__qualname__}",
            **{f.name: _value_identity(getattr(value, f.name), depth) for f in fields(value)},
        }
    if callable(value):
        return _identity(value, depth + 1)
    if hasattr(value, "pattern") and isinstance(value.pattern, str):  # a compiled regex
        return {"pattern": value.pattern}
    return f"{type(value).__module__}:{type(value).__qualname__}"


def _identity(fn: Any, depth: int) -> Any:
    if fn is None:
        return None
    declared = getattr(fn, "rollouts_fingerprint", None)
    if declared is not None and not callable(declared):
        return {"declared": declared}
    if depth > 4:
        return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    if isinstance(fn, functools.partial):
        return {
            "partial": _identity(fn.func, depth + 1),
            "args": [_value_identity(a, depth) for a in fn.args],
            "keywords": {k: _value_identity(v, depth) for k, v in fn.keywords.items()},
        }
    target = fn if inspect.isfunction(fn) or inspect.isclass(fn) or inspect.ismethod(fn) else type(fn)
    out: dict[str, Any] = {
        "name": f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}",
        "source": _source_hash(target),
    }
    func = getattr(fn, "__func__", fn)
    closure = getattr(func, "__closure__", None)
    if closure:
        cells = []
        for cell in closure:
            try:
                cells.append(_value_identity(cell.cell_contents, depth))
            except ValueError:  # an empty cell
                cells.append(None)
        out["closure"] = cells
    if target is type(fn) and is_dataclass(fn):  # a callable object: its settings count too
        out["state"] = _value_identity(fn, depth)
    return out


def callable_identity(fn: Any) -> str:
    """A short hash of what a callable is: its qualified name, its source and what it closes
    over (or its `rollouts_fingerprint` attribute). None hashes as the absence of a callable."""
    if fn is None:
        return "none"
    return _digest(_identity(fn, 0))


def messages_hash(messages: Sequence[Message]) -> str:
    """A short hash of prepared messages (roles, content, details)."""
    return _digest([m.to_dict() for m in messages])


@dataclass(frozen=True)
class Fingerprint:
    """Hashes of everything that changes a sample's outcome (see the module docstring).
    `messages` is None for a task-level fingerprint (before a row is prepared)."""

    endpoint: str
    environment: str
    max_turns: int
    score_fn: str
    messages: str | None = None

    def with_messages(self, messages: Sequence[Message]) -> Fingerprint:
        return replace(self, messages=messages_hash(messages))

    @property
    def task(self) -> Fingerprint:
        """This fingerprint without the per-sample messages."""
        return self if self.messages is None else replace(self, messages=None)

    @property
    def short(self) -> str:
        """8 hex characters of the task-level parts (for directory names)."""
        return _digest([self.endpoint, self.environment, self.max_turns, self.score_fn])[:8]

    def differences(self, other: Fingerprint, *, include_messages: bool = True) -> list[str]:
        """The names of the parts that differ (messages only when both have them)."""
        names = ["endpoint", "environment", "max_turns", "score_fn"]
        if include_messages and self.messages is not None and other.messages is not None:
            names.append("messages")
        return [n for n in names if getattr(self, n) != getattr(other, n)]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "endpoint": self.endpoint,
            "environment": self.environment,
            "max_turns": self.max_turns,
            "score_fn": self.score_fn,
        }
        if self.messages is not None:
            d["messages"] = self.messages
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        return cls(
            endpoint=str(data["endpoint"]),
            environment=str(data["environment"]),
            max_turns=int(data["max_turns"]),
            score_fn=str(data["score_fn"]),
            messages=data.get("messages"),
        )


def describe_parts(names: Sequence[str]) -> str:
    """'score function and max_turns' for ["score_fn", "max_turns"]."""
    words = [_PART_NAMES.get(n, n) for n in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def output_hash(config: EvalConfig) -> str:
    """8 hex characters naming a task setting, for default output directory names: the task
    fingerprint plus `prepare_messages`' identity (a system prompt given on the command line
    lives there), so two settings never share a default directory."""
    return _digest([config.fingerprint.to_dict(), callable_identity(config.prepare_messages)])[:8]


def task_fingerprint(config: EvalConfig) -> Fingerprint:
    """The task-level fingerprint of an EvalConfig (everything but the per-row messages)."""
    return Fingerprint(
        endpoint=_digest(endpoint_identity(config.endpoint)),
        environment=callable_identity(config.environment_factory),
        max_turns=config.effective_max_turns,
        score_fn=callable_identity(config.score_fn),
    )
