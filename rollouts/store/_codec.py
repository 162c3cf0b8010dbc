"""Messages to log lines and back, fast: the same JSON `Message.to_dict` gives and the same
objects `Message.from_dict` makes, in about half the time.

Writing: `encode_message_dict` builds the dict `Message.to_dict` would without going through
`dataclasses.fields` and a clean-up pass per block, and one `json.JSONEncoder` is kept instead
of `json.dumps` making one per call (read-only mappings are written as objects).

Reading:
Building Messages was slower than parsing their JSON: per message, a dict of every field, then
a frozen dataclass `__init__` setting each one with `object.__setattr__`, the same again for
each content block and the usage. Here the dict just parsed from the line becomes the object's
`__dict__` (a field the line leaves out reads the class default, as `to_dict` drops None
values) and then the class's own `__post_init__` runs, so every check and normalisation the
class does still happens. Unknown or missing keys go through the constructor, which raises
the TypeError naming them. A class this cannot be done for safely (slots, default factories)
uses its constructor.

`tests/test_store.py` checks that every kind of message encodes to exactly what
`Message.to_dict` gives and decodes to exactly what `Message.from_dict` gives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rollouts.dtypes import (
    ContentBlock,
    ImageContent,
    Message,
    TextContent,
    ThinkingContent,
    ToolCallContent,
    Usage,
    block_to_dict,
)
from rollouts.frozen import freeze_json


class _Shape:
    """What building `cls` from a parsed dict needs: its field names, the required ones, its
    `__post_init__`, and whether its `__init__` may be bypassed (no slots, no default factory,
    every default readable as a class attribute, as dataclasses make them).

    `verdicts` remembers, per tuple of keys seen (a log repeats a handful), whether a dict with
    exactly those keys may bypass `__init__`: a tuple and a dict lookup instead of two set
    comparisons per object."""

    __slots__ = ("cls", "fast", "names", "post_init", "required", "verdicts")

    def __init__(self, cls: type, required: frozenset[str] | None = None) -> None:
        fields = dataclasses.fields(cls)
        self.cls = cls
        self.names = frozenset(f.name for f in fields)
        self.required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING)
        self.post_init: Callable[[Any], None] | None = getattr(cls, "__post_init__", None)
        self.fast = not (
            any(not f.init or f.default_factory is not dataclasses.MISSING for f in fields)
            or "__slots__" in vars(cls)
            or any(getattr(cls, f.name, None) != f.default for f in fields if f.name not in self.required)
        )
        if required is not None:
            self.required = required
        self.verdicts: dict[tuple[str, ...], bool] = {}

    def learn(self, keys: tuple[str, ...]) -> bool:
        """Whether a dict with exactly `keys` may bypass `__init__` (remembered, up to a bound)."""
        ok = self.fast and self.required.issubset(keys) and self.names.issuperset(keys)
        if len(self.verdicts) < _VERDICTS:
            self.verdicts[keys] = ok
        return ok


_VERDICTS = 256
_new = object.__new__
_set = object.__setattr__
_BLOCKS = {"text": _Shape(TextContent), "thinking": _Shape(ThinkingContent)}
_BLOCKS |= {"tool_call": _Shape(ToolCallContent), "image": _Shape(ImageContent)}
_TOOL_CALL = _BLOCKS["tool_call"]
_USAGE = _Shape(Usage)
_MESSAGE = _Shape(Message, required=frozenset({"role"}))  # a missing content is filled in first


def _build(shape: _Shape, data: dict[str, Any]) -> Any:
    """`shape.cls(**data)` with `data` as the new object's `__dict__` (a field it lacks reads
    the class default), then the class's own `__post_init__`. Anything unusual (an unknown or
    missing key) goes through the constructor, which raises the TypeError naming it."""
    keys = tuple(data)
    ok = shape.verdicts.get(keys)
    if not (shape.learn(keys) if ok is None else ok):
        return shape.cls(**data)
    obj: Any = _new(shape.cls)
    _set(obj, "__dict__", data)
    if shape.post_init is not None:
        shape.post_init(obj)
    return obj


def _blocks(raw: list[Any]) -> tuple[ContentBlock, ...]:
    """The content blocks of a message (`_build` for each, inlined: this is the hot loop)."""
    out = []
    for data in raw:
        if type(data) is not dict:
            raise ValueError(f"a content block must be a JSON object, got {data!r:.80}")
        shape = _BLOCKS.get(data.get("type"))  # type: ignore[arg-type]
        if shape is None:
            raise ValueError(f"unknown content block type {data.get('type')!r}")
        if shape is _TOOL_CALL:
            arguments = data.get("arguments")
            if type(arguments) is dict:
                data["arguments"] = freeze_json(arguments)  # what its __post_init__ would make
        keys = tuple(data)
        ok = shape.verdicts.get(keys)
        if not (shape.learn(keys) if ok is None else ok):
            out.append(shape.cls(**data))  # the constructor's own errors
            continue
        block: Any = _new(shape.cls)
        _set(block, "__dict__", data)
        if shape.post_init is not None:
            shape.post_init(block)
        out.append(block)
    return tuple(out)


def message_from_dict(data: dict[str, Any]) -> Message:
    """`Message.from_dict(data)`, fast, for a dict parsed from a log line: `data` and the dicts
    in it are taken over (not copied), so the caller must not use them afterwards. Like
    `Message.from_dict`, keys that are not Message fields are ignored (a newer writer's).

    Nested data (`details`, a tool call's `arguments`) is frozen here with `freeze_json`, so
    the classes' `__post_init__` find it frozen already and keep it as is."""
    shape = _MESSAGE
    keys = tuple(data)
    ok = shape.verdicts.get(keys)
    if ok is None:
        ok = shape.learn(keys)
    if not ok and not shape.names.issuperset(keys):
        data = {k: v for k, v in data.items() if k in shape.names}
        ok = shape.fast and "role" in data
    raw = data.get("content")
    if raw is None:
        data["content"] = ""
    elif type(raw) is list:
        data["content"] = _blocks(raw)
    usage = data.get("usage")
    if usage is not None:
        data["usage"] = _build(_USAGE, usage) if usage else None
    details = data.get("details")
    if type(details) is dict:
        data["details"] = freeze_json(details)
    if not ok:
        return Message(**data)  # the constructor's own errors
    message: Message = _new(Message)
    _set(message, "__dict__", data)
    if shape.post_init is not None:
        shape.post_init(message)
    return message


_PROMOTE_AFTER = 10_000  # allocations (a log of about 2,000 messages); smaller loads are left to the collector


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while a log is turned into objects; a big log's
    objects are then handed to its oldest generation.

    Loading creates tens of thousands of objects that all stay alive, so every collection the
    allocations trigger scans a growing heap and frees nothing: with the collector running,
    decoding a 10,000-message log took about 1.7x as long. Paused, the objects pile up in the
    youngest generation, and the first collection after it is resumed would scan all of them
    at once (about 10 ms for 10,000 messages, as long as the rest of the decoding), then again
    as they pass through the middle generation, to free nothing. So after a big load (more than
    `_PROMOTE_AFTER` allocations) the young objects are moved to the oldest generation
    (`gc.freeze()` then `gc.unfreeze()`: two list splices), where the next full collection
    examines them like any long-lived data. The objects moved are those made since the last
    collection: the log's, and the few thousand at most that the rest of the process made
    meanwhile, whose cyclic garbage, if any, waits for that full collection too. Skipped if
    the process holds frozen objects of its own (`gc.get_freeze_count()`), which
    `gc.unfreeze()` would release. The collector is resumed (if it was enabled) whatever
    happens; reference counting frees memory meanwhile as always."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if was_enabled and gc.get_count()[0] > _PROMOTE_AFTER and gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
    finally:
        if was_enabled:
            gc.enable()


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------

_BLOCK_FIELDS = {
    cls: tuple(f.name for f in dataclasses.fields(cls))
    for cls in (TextContent, ThinkingContent, ToolCallContent, ImageContent)
}
_USAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Usage))
_OPTIONAL = ("tool_call_id", "timestamp", "provider", "model")


def _plain(obj: object) -> object:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=_plain)
dumps = _ENCODER.encode


def message_to_dict(message: Message) -> dict[str, Any]:
    """`message.to_dict()`, fast (nested read-only mappings are left for `dumps` to write)."""
    content: Any = message.content
    if type(content) is not str:
        blocks = []
        for b in content:
            names = _BLOCK_FIELDS.get(type(b))
            if names is None:  # a block type this module does not know: the general way
                blocks.append(block_to_dict(b))
                continue
            d = {}
            for name in names:
                v = getattr(b, name)
                if v is not None:
                    d[name] = v
            blocks.append(d)
        content = blocks
    out: dict[str, Any] = {"role": message.role, "content": content}
    for name in _OPTIONAL:
        v = getattr(message, name)
        if v is not None:
            out[name] = v
    usage = message.usage
    if usage is not None:
        out["usage"] = {name: getattr(usage, name) for name in _USAGE_FIELDS}
    if message.details is not None:
        out["details"] = message.details
    return out
