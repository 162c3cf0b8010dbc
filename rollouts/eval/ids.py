"""The ids of a dataset's rows in order, and the check that they are unique, in memory that does
not grow with rows that use their index as id (the common case: rows without an `id` field).

An index id ("17" for row 17) costs one bit; only explicit ids (a row's own `id` field) are kept
as strings. So a 100,000-row run does not hold 100,000 id strings and a set of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from rollouts.errors import ConfigurationError

__all__ = ["SampleIds"]


def _as_index(sid: str) -> int | None:
    """The row index an id would be as an index id ("17" -> 17), else None."""
    if sid.isdigit() and sid.isascii() and (sid == "0" or not sid.startswith("0")):
        return int(sid)
    return None


class SampleIds(Sequence[str]):
    """Ids in dataset order: `add(index, sid, explicit)` for each row, then index and iterate."""

    def __init__(self) -> None:
        self._n = 0
        self._index_ids = bytearray()  # bit i: row i uses its index as id
        self._explicit: dict[int, str] = {}  # row -> its own id
        self._explicit_rows: dict[str, int] = {}  # its own id -> row

    def _uses_index(self, i: int) -> bool:
        return i < self._n and bool(self._index_ids[i >> 3] & (1 << (i & 7)))

    def add(self, index: int, sid: str, explicit: bool) -> None:
        """Row `index` (the next one) has id `sid`; ConfigurationError when an earlier row has it."""
        assert index == self._n, "rows are added in order"
        first = self._explicit_rows.get(sid)
        if first is None and explicit:
            k = _as_index(sid)
            if k is not None and self._uses_index(k):
                first = k
        if first is not None:
            raise ConfigurationError(
                f"dataset rows {first} and {index} have the same id {sid!r}; "
                "sample ids must be unique (remove the 'id' field to use row indices)"
            )
        if index >> 3 >= len(self._index_ids):
            self._index_ids.extend(bytes(max(64, len(self._index_ids))))
        if explicit:
            self._explicit[index] = sid
            self._explicit_rows[sid] = index
        else:
            self._index_ids[index >> 3] |= 1 << (index & 7)
        self._n += 1

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._explicit.get(i) or str(i)

    def __iter__(self) -> Iterator[str]:
        explicit = self._explicit
        for i in range(self._n):
            yield explicit.get(i) or str(i)
