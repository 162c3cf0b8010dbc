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


def _builder(cls: type) -> Callable[[dict[str, Any]], Any]:
    """A function making `cls(**data)` (same checks, same result) without its `__init__`: `data`
    (a dict just parsed, owned by the caller) becomes the object's `__dict__`. A field it lacks
    reads the class's default, as dataclass fields with a default are class attributes."""
    fields = dataclasses.fields(cls)
    names = frozenset(f.name for f in fields)
    required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING)
    if (
        any(not f.init or f.default_factory is not dataclasses.MISSING for f in fields)
        or "__slots__" in vars(cls)
        or any(getattr(cls, f.name, None) != f.default for f in fields if f.name not in required)
    ):
        return lambda data: cls(**data)  # not safe to bypass: the constructor itself
    post_init = getattr(cls, "__post_init__", None)
    new = object.__new__
    set_attr = object.__setattr__

    def build(data: dict[str, Any]) -> Any:
        keys = data.keys()
        if not keys <= names or not required <= keys:
            return cls(**data)  # the constructor raises the TypeError naming the key
        obj: Any = new(cls)
        set_attr(obj, "__dict__", data)
        if post_init is not None:
            post_init(obj)
        return obj

    return build


_BLOCKS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "text": _builder(TextContent),
    "thinking": _builder(ThinkingContent),
    "tool_call": _builder(ToolCallContent),
    "image": _builder(ImageContent),
}
_usage = _builder(Usage)
_message = _builder(Message)
_MESSAGE_FIELDS = frozenset(f.name for f in dataclasses.fields(Message))


def _block(data: dict[str, Any]) -> ContentBlock:
    if type(data) is not dict:
        raise ValueError(f"a content block must be a JSON object, got {data!r:.80}")
    try:
        build = _BLOCKS[data["type"]]
    except (KeyError, TypeError):
        raise ValueError(f"unknown content block type {data.get('type')!r}") from None
    block: ContentBlock = build(data)
    return block


def message_from_dict(data: dict[str, Any]) -> Message:
    """`Message.from_dict(data)`, fast, for a dict parsed from a log line: `data` and the dicts
    in it are taken over (not copied), so the caller must not use them afterwards. Like
    `Message.from_dict`, keys that are not Message fields are ignored (a newer writer's)."""
    if not data.keys() <= _MESSAGE_FIELDS:
        data = {k: v for k, v in data.items() if k in _MESSAGE_FIELDS}
    raw = data.get("content")
    if raw is None:
        data["content"] = ""
    elif type(raw) is list:
        data["content"] = tuple([_block(b) for b in raw])
    usage = data.get("usage")
    if usage is not None:
        data["usage"] = _usage(usage) if usage else None
    message: Message = _message(data)
    return message


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic garbage collector paused while a log is turned into objects.

    Loading creates tens of thousands of objects that all stay alive, so every collection the
    allocations trigger scans a growing heap and frees nothing: with the collector running,
    decoding a 10,000-message log took about 1.7x as long. It is resumed (if it was enabled)
    on the way out, whatever happens; reference counting frees memory meanwhile as always."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
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
