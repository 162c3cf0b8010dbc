"""Exception groups from trio nurseries, read the way a user wants their error."""

from __future__ import annotations

import trio


def single_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one real error inside (nested) exception groups, cancellations aside; else the group."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for x in e.exceptions:
                walk(x)
        elif not isinstance(e, trio.Cancelled):
            leaves.append(e)

    walk(group)
    return leaves[0] if len(leaves) == 1 else group
