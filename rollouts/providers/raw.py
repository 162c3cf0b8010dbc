"""Each model call's raw request and response, kept when a run asks (`RunConfig(record_raw=True)`).

Off by default, and free when off: `run_call` (the call skeleton every built-in API provider and
the scripted provider run through) asks `recording()` once per call. When on, the call's
`Completion` gets two texts:

* `raw_request`: the request as the provider built it for its SDK or HTTP transport (messages,
  tools, parameters, `extra_params` such as extra headers), as JSON (a request object that is
  not plain data says what it sends through a `raw_record()` method, as the scripted provider's);
* `raw_response`: the raw stream items of the attempt that succeeded (SDK chunk objects dumped,
  or the transport's decoded JSON), one JSON value a line.

Both are masked before they are kept, like everything rollouts writes: secret-looking fields of
the request (`Authorization`, `X-Api-Key`, `api_key`, ...) become `[redacted]` and every known
secret value (`rollouts.redaction.known_secrets`) becomes `***`, in the request and in the
response. Each text is cut at `RAW_MAX_CHARS` characters, with a marker saying what was left out.

`agents.rollout` turns recording on around one call with `record_raw_calls()` (a context
variable, so concurrent samples of one process decide independently).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from rollouts.redaction import redact_secrets, redact_value

__all__ = ["RAW_MAX_CHARS", "RawCall", "record_raw_calls", "recording"]

RAW_MAX_CHARS = 100_000
"""The most characters kept of one call's request, and of its response."""

_DEPTH_MAX = 64
_RECORDING: ContextVar[bool] = ContextVar("rollouts_record_raw", default=False)


@contextlib.contextmanager
def record_raw_calls(on: bool = True) -> Iterator[None]:
    """Model calls made inside record their raw request and response (when `on`)."""
    token = _RECORDING.set(on)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def recording() -> bool:
    """Whether a model call made now records its raw request and response."""
    return _RECORDING.get()


def _jsonable(value: Any, depth: int = 0) -> Any:
    """`value` as plain JSON values: SDK (pydantic) objects dumped, dataclasses by field,
    anything else by its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if depth > _DEPTH_MAX:
        return "[too deep]"
    if isinstance(value, bytes | bytearray):
        return value[:RAW_MAX_CHARS].decode("utf-8", "replace")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    record = getattr(value, "raw_record", None)  # (a request object that says what it sends)
    if callable(record):
        return _jsonable(record(), depth + 1)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _jsonable(dump(mode="json", exclude_none=True), depth + 1)
        except Exception:  # (an SDK object that cannot dump itself: shown by its repr)
            return repr(value)[:2000]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)  # (our dataclasses: their own JSON form)
        if callable(to_dict):
            return _jsonable(to_dict(), depth + 1)
        return {f.name: _jsonable(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    return repr(value)[:2000]


def _cut(text: str) -> str:
    if len(text) <= RAW_MAX_CHARS:
        return text
    return text[:RAW_MAX_CHARS] + f"\n[… cut: {len(text) - RAW_MAX_CHARS:,} more characters not kept]"


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


class RawCall:
    """What one call records: its request (masked now), and the raw items of its current attempt."""

    def __init__(self, request: Any) -> None:
        self.request = _cut(_dump(redact_secrets(_jsonable(request))))
        self._lines: list[str] = []
        self._size = 0
        self._dropped = 0

    def start_attempt(self) -> None:
        """A new attempt: the items of a failed one are not its response."""
        self._lines, self._size, self._dropped = [], 0, 0

    def add(self, item: Any) -> None:
        if self._size >= RAW_MAX_CHARS:
            self._dropped += 1
            return
        line = _dump(redact_value(_jsonable(item)))
        self._lines.append(line)
        self._size += len(line) + 1

    def tee(self, feed: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """`feed` that also keeps each item."""

        async def feed_and_keep(item: Any) -> None:
            self.add(item)
            await feed(item)

        return feed_and_keep

    def response(self) -> str:
        text = _cut("\n".join(self._lines))
        if self._dropped:
            text += f"\n[… {self._dropped:,} more stream items not kept (over {RAW_MAX_CHARS:,} characters)]"
        return text
