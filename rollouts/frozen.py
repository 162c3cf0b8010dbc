"""Read-only JSON-like data: what the frozen types hold where a caller passed a dict or a list.

`freeze(value)` copies nested dicts and lists deeply into `FrozenDict` and `FrozenList`. They
are `dict` and `list` subclasses, so they compare equal to plain dicts and lists, serialize with
`json.dumps`, pass JSON-schema "object"/"array" checks and work wherever a dict or list is
read — but every method that would change them raises TypeError, and they hash (when their
contents do). Freezing an already frozen value returns it as is, so passing frozen data along
(as the agent loop does on every turn) costs one type check.

    args = freeze({"path": "a.txt", "lines": [1, 2]})
    args == {"path": "a.txt", "lines": [1, 2]}     # True
    args["lines"].append(3)                        # TypeError: ... is read-only
    thaw(args)                                     # plain, mutable dict and list copies
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["FrozenDict", "FrozenList", "freeze", "freeze_json", "thaw"]


def _read_only(self: object, *args: Any, **kwargs: Any) -> NoReturn:
    kind = "dict" if isinstance(self, dict) else "list"
    raise TypeError(
        f"this {type(self).__name__} is read-only (frozen data of a rollouts value); "
        f"copy it first, e.g. {kind}(x) or rollouts.frozen.thaw(x), or build a new value with dataclasses.replace"
    )


class FrozenDict(dict[Any, Any]):
    """A dict that cannot be changed, holding only frozen values (see the module docstring)."""

    __slots__ = ("_hash",)
    _hash: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        for key, value in dict.items(self):
            frozen = freeze(value)
            if frozen is not value:
                dict.__setitem__(self, key, frozen)

    __setitem__ = _read_only
    __delitem__ = _read_only
    __ior__ = _read_only
    clear = _read_only
    pop = _read_only
    popitem = _read_only
    setdefault = _read_only
    update = _read_only

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            h = hash(frozenset(dict.items(self)))
            self._hash = h
            return h

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A list that cannot be changed, holding only frozen values (see the module docstring)."""

    __slots__ = ("_hash",)
    _hash: int

    def __init__(self, items: Any = ()) -> None:
        list.__init__(self, (freeze(v) for v in items))

    __setitem__ = _read_only
    __delitem__ = _read_only
    __iadd__ = _read_only
    __imul__ = _read_only
    append = _read_only
    extend = _read_only
    insert = _read_only
    pop = _read_only
    remove = _read_only
    clear = _read_only
    sort = _read_only
    reverse = _read_only

    def __hash__(self) -> int:  # type: ignore[override]
        try:
            return self._hash
        except AttributeError:
            h = hash(tuple(self))
            self._hash = h
            return h

    def __repr__(self) -> str:
        return f"FrozenList({list.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


_SCALARS = (str, int, float, bool, type(None))


def freeze(value: Any) -> Any:
    """`value` with every dict (any Mapping) and list inside it copied into a FrozenDict or
    FrozenList; tuples keep their type with frozen items; scalars and other objects are
    returned as they are. A frozen value is returned unchanged (no copy)."""
    t = type(value)
    if t is FrozenDict or t is FrozenList or t in _SCALARS:
        return value
    if isinstance(value, Mapping):
        return FrozenDict(value)
    if isinstance(value, list):
        return FrozenList(value)
    if t is tuple:
        items = tuple(freeze(v) for v in value)
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


_new_dict = dict.__new__
_new_list = list.__new__
_dict_update = dict.update
_dict_set = dict.__setitem__
_list_extend = list.extend


def freeze_json(value: Any) -> Any:
    """`freeze(value)` for data just parsed by `json.loads` (plain dicts, lists and scalars, not
    used elsewhere), about 3x faster: the same FrozenDict and FrozenList, filled directly
    instead of through their generic constructors. Any other value goes through `freeze`."""
    t = type(value)
    if t is dict:
        out = _new_dict(FrozenDict)
        _dict_update(out, value)
        for key, item in value.items():
            ti = type(item)
            if ti is dict or ti is list:
                _dict_set(out, key, freeze_json(item))
        return out
    if t is list:
        items = _new_list(FrozenList)
        _list_extend(items, [freeze_json(v) if type(v) in _CONTAINERS else v for v in value])
        return items
    return value if t in _SCALARS else freeze(value)


_CONTAINERS = (dict, list)


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of frozen data: dicts for mappings, lists for lists (tuples
    stay tuples); other values as they are."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [thaw(v) for v in value]
    if type(value) is tuple:
        return tuple(thaw(v) for v in value)
    return value
