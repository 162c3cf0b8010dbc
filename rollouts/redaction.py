"""Redaction: what counts as a secret, and how secrets are kept out of everything printed and written.

Two rules, one module, used by every output of the library and the CLI:

1. **Known secret values** are masked as `***` wherever they appear: in text, in JSON records
   (also in their JSON-escaped form), and in streamed text cut into pieces (`StreamRedactor`
   holds back a piece that could be the start of a secret until the next piece shows it is
   not). The known values of this process (`known_secrets()`):

   * every `Endpoint.api_key` and `Endpoint.oauth_token` the process has made (registered by
     `Endpoint` itself), and the values of secret-looking fields in an endpoint's `extra_params` (e.g. a header
     `{"headers": {"X-Api-Key": ...}}`) and of secret-looking query parameters of its `api_base`;
   * the current values of the providers' key variables (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`,
     `GEMINI_API_KEY`, `GOOGLE_API_KEY`) and of every variable named with `register_secret_env`
     (the CLI names the ones given by `--api-key-env`, `--reflection-api-key-env` and config
     files' `api_key_env`);
   * anything passed to `register_secrets`.

   Values shorter than `MIN_SECRET_LENGTH` characters (placeholders such as `EMPTY`) are not
   secrets. The set only grows: a key this process has seen is never written by it.

2. **Secret-looking fields** of configuration-like records (an endpoint, an eval config, its
   metadata) are replaced by `[redacted]`: a field whose name looks like a credential
   (`api_key`, `token`, `authorization`, `password`, `secret`, `cookie`, ...; `max_tokens` is
   not one), and credentials in URLs (`user:password@`, `?key=...`). `redact_secret_fields`
   applies this rule; `redact_secrets` applies both rules.

Writers apply rule 1 to every record just before it is written (`redact_json` on the
serialized text): the session store (`messages.jsonl`, `session.json`), evaluation files
(`samples.jsonl`, `report.json`) and GEPA run directories (`state.json`, `result.json`,
`rollouts.jsonl`, `reflections.jsonl`, `best_*`). Stream consumers use `redact_events` (an
`on_chunk` wrapper) or `StreamRedactor` (text written in pieces).

Limits: only the exact value is recognised. A key the model transforms (reversed, base64,
spaced out, split by a newline) is not, nor a secret this process was never told about.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollouts.dtypes import Endpoint
    from rollouts.events import StreamEvent

__all__ = [
    "MASK",
    "MIN_SECRET_LENGTH",
    "REDACTED",
    "Redactor",
    "StreamRedactor",
    "is_secret_field",
    "known_secrets",
    "redact_events",
    "redact_json",
    "redact_secret_fields",
    "redact_secrets",
    "redact_text",
    "redact_value",
    "register_endpoint_secrets",
    "register_secret_env",
    "register_secrets",
]

MASK = "***"
"""What a known secret value is replaced by."""

REDACTED = "[redacted]"
"""What the value of a secret-looking field is replaced by."""

MIN_SECRET_LENGTH = 8
"""Shorter values (placeholders such as `EMPTY` or `x`) are never treated as secrets."""

_SECRET_FIELD = re.compile(
    r"api[_-]?key|secret|password|passwd|authorization|credential|cookie|bearer|private[_-]?key"
    r"|(?:^|[_-])(?:token|auth|key)(?:[_-]|$)",
    re.I,
)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@", re.I)
_URL_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&#;\s]+)=(?P<value>[^&#;\s]*)")


# --------------------------------------------------------------------------------------------
# Rule 2: secret-looking fields
# --------------------------------------------------------------------------------------------


def is_secret_field(name: str) -> bool:
    """Whether a field (or header, or URL parameter) named `name` holds a credential:
    `api_key`, `X-Api-Key`, `Authorization`, `access_token`, `password`, `key`, ... but not
    `max_tokens`, `keepalive` or `author`."""
    return bool(_SECRET_FIELD.search(name))


def redact_secret_fields(value: Any) -> Any:
    """A copy of `value` with secret-looking mapping entries replaced by `[redacted]` and
    credentials removed from URLs (`user:password@`, and query parameters such as `?key=...`).
    Recurses into mappings and lists; empty values are left as they are."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            if is_secret_field(key) and v not in (None, "", {}, []):
                out[key] = REDACTED
            else:
                out[key] = redact_secret_fields(v)
        return out
    if isinstance(value, list | tuple):
        return [redact_secret_fields(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return _redact_url(value)
    return value


def _redact_url(text: str) -> str:
    if "@" in text:
        text = _URL_USERINFO.sub(r"\g<scheme>" + REDACTED + "@", text)
    if "?" in text:

        def param(m: re.Match[str]) -> str:
            if is_secret_field(m["name"]) and m["value"]:
                return f"{m['sep']}{m['name']}={REDACTED}"
            return m.group(0)

        text = _URL_QUERY_PARAM.sub(param, text)
    return text


def _secret_field_values(value: Any) -> Iterable[str]:
    """The string values of secret-looking fields in `value`, and URL credentials in its strings."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if is_secret_field(str(k)) and isinstance(v, str):
                yield v
                yield from _bearer_token(v)
            else:
                yield from _secret_field_values(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _secret_field_values(v)
    elif isinstance(value, str) and "://" in value:
        for m in _URL_USERINFO.finditer(value):
            yield m["userinfo"]
            yield m["userinfo"].partition(":")[2]
        for m in _URL_QUERY_PARAM.finditer(value):
            if is_secret_field(m["name"]):
                yield m["value"]


def _bearer_token(value: str) -> Iterable[str]:
    scheme, _, token = value.strip().partition(" ")
    if token and scheme.lower() in ("bearer", "basic", "token"):
        yield token.strip()


# --------------------------------------------------------------------------------------------
# Rule 1: known secret values
# --------------------------------------------------------------------------------------------


def _json_forms(secret: str) -> tuple[str, ...]:
    """How `secret` appears inside a JSON string (ASCII-escaped or not); a form that would
    reach outside a string literal (the value holds a quote) is only matched escaped."""
    return tuple(dict.fromkeys((json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1])))


class Redactor:
    """A fixed set of secret values and the ways to mask them (immutable; cheap to share).

    `redact(text)` masks every occurrence; `redact_json(text)` also masks JSON-escaped ones;
    `redact_value(obj)` masks inside any JSON-like value; `stream()` makes a `StreamRedactor`."""

    __slots__ = ("_first_chars", "_json", "secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LENGTH}
        self.secrets: tuple[str, ...] = tuple(sorted(values, key=lambda s: (-len(s), s)))
        forms = {f for s in self.secrets for f in _json_forms(s)}
        self._json: tuple[str, ...] = tuple(sorted(forms, key=lambda s: (-len(s), s)))
        self._first_chars = frozenset(s[0] for s in self.secrets)

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def __repr__(self) -> str:
        return f"Redactor({len(self.secrets)} secrets)"

    def redact(self, text: str) -> str:
        """`text` with every secret replaced by `***` (longest first)."""
        for s in self.secrets:
            if s in text:
                text = text.replace(s, MASK)
        return text

    def redact_json(self, text: str) -> str:
        """Serialized JSON with every secret masked inside its strings, as written raw or
        JSON-escaped. The result is valid JSON whenever `text` is: in the rare case a match
        was not a whole piece of a string (a numeric secret inside a number, a match starting
        inside an escape such as `\\n`), the value is parsed, masked and written compactly."""
        out = text
        for s in self._json:
            if s in out:
                out = out.replace(s, MASK)
        if out is text:
            return text
        try:
            json.loads(out)
            return out
        except ValueError:
            pass
        try:
            value = json.loads(text)
        except ValueError:
            return out  # (not JSON to begin with)
        return json.dumps(self.redact_value(value), ensure_ascii=False, separators=(",", ":"))

    def redact_value(self, value: Any) -> Any:
        """`value` with secrets masked in every string inside it (mapping keys too). Mappings
        become dicts, lists and tuples keep their type, frozen dataclasses are copied with
        `dataclasses.replace` when a field changes; anything else is returned as it is."""
        if not self.secrets:
            return value
        return self._walk(value)

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, Mapping):
            return {self._walk(k) if isinstance(k, str) else k: self._walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v) for v in value]
        if isinstance(value, tuple):
            items = tuple(self._walk(v) for v in value)
            return type(value)(*items) if hasattr(value, "_fields") else items
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            changes = {}
            for f in dataclasses.fields(value):
                if not f.init:
                    continue
                old = getattr(value, f.name)
                new = self._walk(old)
                if new is not old and new != old:
                    changes[f.name] = new
            return dataclasses.replace(value, **changes) if changes else value
        return value

    def held_length(self, text: str) -> int:
        """The length of the longest suffix of `text` that is the start (not the whole) of a
        secret: what a stream must hold back until it knows more."""
        best = 0
        if not self.secrets or self._first_chars.isdisjoint(text[1 - len(self.secrets[0]) :]):
            return 0  # (the common case, decided in C: no character of the tail can start a secret)
        for s in self.secrets:
            window = min(len(s) - 1, len(text))
            if window <= best:
                continue
            start = len(text) - window
            i = text.find(s[0], start)
            while i != -1:
                k = len(text) - i
                if k <= best:
                    break
                if s.startswith(text[i:]):
                    best = k
                    break
                i = text.find(s[0], i + 1)
        return best

    def safe_cut(self, text: str) -> int:
        """Where `text`, known to continue, can be cut: everything before the cut can be shown
        (masked) now. The tail after it could still grow into a secret: it is the longest suffix
        that starts a secret (`held_length`), extended back over any secret it would cut in two
        (so a key that is the start of a longer key is never shown in halves)."""
        cut = len(text) - self.held_length(text)
        if cut == len(text):
            return cut  # nothing held: no secret can straddle the end
        for _ in range(len(text) + 1):  # the cut only moves back
            moved = False
            for s in self.secrets:
                i = text.find(s, max(0, cut - len(s) + 1), cut + len(s) - 1)
                if i != -1 and i < cut:
                    cut, moved = i, True
            if not moved:
                return cut
        return cut

    def stream(self) -> StreamRedactor:
        """A StreamRedactor over these secrets."""
        return StreamRedactor(self)


class StreamRedactor:
    """Masks secrets in text that arrives in pieces, even when a secret is cut across pieces.

    `feed(piece)` returns what can be shown now: the text so far with secrets masked, minus the
    longest tail that could still grow into a secret (held back); `flush()` returns what is held
    (call it when the text ends). Joined, the outputs equal the whole text redacted (when no two
    secrets overlap in the text; when they do, the joined outputs still hold neither whole).

    With no `redactor`, the process's `known_secrets()` at the time of each piece are used."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self._redactor = redactor
        self._held = ""

    @property
    def redactor(self) -> Redactor:
        return self._redactor if self._redactor is not None else known_secrets()

    @property
    def held(self) -> str:
        """The text held back so far, unmasked (shown, masked, by the next `feed` or `flush`)."""
        return self._held

    def feed(self, piece: str) -> str:
        r = self.redactor
        text = self._held + piece
        if not r:
            self._held = ""
            return text
        cut = r.safe_cut(text)
        self._held = text[cut:]
        return r.redact(text[:cut])

    def flush(self) -> str:
        held, self._held = self._held, ""
        return self.redactor.redact(held)


# --------------------------------------------------------------------------------------------
# The process's known secrets
# --------------------------------------------------------------------------------------------

_lock = threading.Lock()
_values: set[str] = set()
_env_names: dict[str, None] = {}
_version = 0
_cache: tuple[Any, Redactor] | None = None


_provider_names: tuple[str, ...] | None = None


def _provider_key_names() -> tuple[str, ...]:
    global _provider_names
    if _provider_names is None:
        from rollouts.config import PROVIDER_KEY_ENV  # (config imports dtypes, which imports this module)

        _provider_names = tuple(dict.fromkeys(n for names in PROVIDER_KEY_ENV.values() for n in names))
    return _provider_names


def register_secrets(*values: str) -> None:
    """Treat `values` as secrets from now on (in this process); short or empty ones, and values
    holding a redaction marker, are ignored."""
    global _version
    new = [v.strip() for v in values if isinstance(v, str) and len(v.strip()) >= MIN_SECRET_LENGTH]
    # (an endpoint read back from a file holds the markers, never a secret)
    new = [v for v in new if v not in _values and REDACTED not in v and MASK not in v]
    if not new:
        return
    with _lock:
        _values.update(new)
        _version += 1


def register_secret_env(*names: str) -> None:
    """Treat the values of the environment variables `names` as secrets (read at each use)."""
    global _version
    new = [n for n in names if n and n not in _env_names]
    if not new:
        return
    with _lock:
        _env_names.update(dict.fromkeys(new))
        _version += 1


def register_endpoint_secrets(endpoint: Endpoint) -> None:
    """Register an endpoint's key, the values of secret-looking fields in its `extra_params`
    (headers included) and credentials in its `api_base` (`Endpoint` calls this itself)."""
    values = [endpoint.api_key, endpoint.oauth_token]
    if endpoint.extra_params:
        values += _secret_field_values(endpoint.extra_params)
    if endpoint.api_base and ("@" in endpoint.api_base or "?" in endpoint.api_base):
        values += _secret_field_values(endpoint.api_base)
    register_secrets(*values)


def _env_snapshot(names: tuple[str, ...], encoded: tuple[bytes, ...]) -> tuple[Any, ...]:
    """Something that changes when the values of `names` in `os.environ` change, read cheaply:
    `os.environ.get` encodes and decodes on every call (microseconds each, on every write and
    every streamed piece), so on POSIX the raw mapping behind `os.environ` is read instead."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        return tuple(map(data.get, encoded))
    return tuple(map(os.environ.get, names))


_names_cache: tuple[int, tuple[str, ...], tuple[bytes, ...]] | None = None


def _watched_names() -> tuple[tuple[str, ...], tuple[bytes, ...]]:
    global _names_cache
    cached = _names_cache
    if cached is None or cached[0] != _version:
        names = tuple(dict.fromkeys((*_provider_key_names(), *_env_names)))
        cached = _names_cache = (_version, names, tuple(n.encode() for n in names))
    return cached[1], cached[2]


def known_secrets() -> Redactor:
    """A Redactor over every secret this process knows now (see the module docstring)."""
    global _cache
    names, encoded = _watched_names()
    key = (_version, _env_snapshot(names, encoded))
    cached = _cache
    if cached is not None and cached[0] == key:
        return cached[1]
    with _lock:
        redactor = Redactor((*_values, *(os.environ.get(n, "").strip() for n in names)))
    _cache = (key, redactor)
    return redactor


def redact_text(text: str) -> str:
    """`text` with every known secret masked."""
    return known_secrets().redact(text)


def redact_json(text: str) -> str:
    """Serialized JSON with every known secret masked (raw or JSON-escaped); writers call it on
    each record just before writing."""
    return known_secrets().redact_json(text)


def redact_value(value: Any) -> Any:
    """A JSON-like value (or frozen dataclass) with every known secret masked in its strings."""
    return known_secrets().redact_value(value)


def redact_secrets(value: Any) -> Any:
    """Both rules, for configuration-like records: secret-looking fields and URL credentials
    blanked (`[redacted]`), and known secret values masked (`***`) everywhere else."""
    return redact_value(redact_secret_fields(value))


# --------------------------------------------------------------------------------------------
# Stream events
# --------------------------------------------------------------------------------------------


def redact_events(
    on_chunk: Callable[[StreamEvent], Awaitable[None]], redactor: Redactor | None = None
) -> Callable[[StreamEvent], Awaitable[None]]:
    """An `on_chunk` that passes events to `on_chunk` with secrets masked, also across deltas.

    Text, thinking and tool-argument deltas go through one `StreamRedactor` per block, so a
    secret cut across many deltas never appears in them, even joined; what a block's redactor
    holds back is sent as one more delta right before the block's end event. End events, tool
    calls, tool results and errors are masked whole. With no `redactor`, `known_secrets()`."""
    from rollouts.events import (
        LLMCallStart,
        StreamError,
        StreamStart,
        TextDelta,
        TextEnd,
        ThinkingDelta,
        ThinkingEnd,
        ToolCallDelta,
        ToolCallEnd,
        ToolCallError,
    )
    from rollouts.partial_json import parse_partial_json

    streams: dict[tuple[str, int], StreamRedactor] = {}
    shown_args: dict[int, str] = {}
    last_call: dict[int, ToolCallDelta] = {}

    def current() -> Redactor:
        return redactor if redactor is not None else known_secrets()

    def stream_for(kind: str, index: int) -> StreamRedactor:
        s = streams.get((kind, index))
        if s is None:
            s = streams[(kind, index)] = StreamRedactor(redactor)
        return s

    def args_delta(event: ToolCallDelta, delta: str) -> ToolCallDelta:
        shown = shown_args.get(event.content_index, "") + delta
        shown_args[event.content_index] = shown
        try:
            partial = parse_partial_json(shown) if shown.strip() else None
        except ValueError:
            partial = None
        return dataclasses.replace(event, delta=delta, partial_args=partial if isinstance(partial, Mapping) else None)

    async def flush(kind: str, index: int) -> None:
        s = streams.pop((kind, index), None)
        rest = s.flush() if s is not None else ""
        if not rest:
            return
        if kind == "text":
            await on_chunk(TextDelta(index, rest))
        elif kind == "thinking":
            await on_chunk(ThinkingDelta(index, rest))
        elif index in last_call:
            await on_chunk(args_delta(last_call[index], rest))

    async def flush_all() -> None:
        for kind, index in list(streams):
            await flush(kind, index)
        shown_args.clear()
        last_call.clear()

    async def redacting_on_chunk(event: StreamEvent) -> None:
        if isinstance(event, TextDelta):
            await on_chunk(dataclasses.replace(event, delta=stream_for("text", event.content_index).feed(event.delta)))
        elif isinstance(event, ThinkingDelta):
            delta = stream_for("thinking", event.content_index).feed(event.delta)
            await on_chunk(dataclasses.replace(event, delta=delta))
        elif isinstance(event, ToolCallDelta):
            last_call[event.content_index] = event
            await on_chunk(args_delta(event, stream_for("args", event.content_index).feed(event.delta)))
        else:
            if isinstance(event, TextEnd):
                await flush("text", event.content_index)
            elif isinstance(event, ThinkingEnd):
                await flush("thinking", event.content_index)
            elif isinstance(event, ToolCallEnd | ToolCallError):
                await flush("args", event.content_index)
                shown_args.pop(event.content_index, None)
                last_call.pop(event.content_index, None)
            elif isinstance(event, LLMCallStart | StreamStart | StreamError):
                await flush_all()
            await on_chunk(current().redact_value(event))

    return redacting_on_chunk
