"""The metric-call budget: what is spent, what is set aside for planned work, what finished but
is not yet committed, and what is left.

    budget = Budget(limit=500)
    if budget.covers(6):
        budget.reserve(6)           # planning an iteration: its minibatch evaluations
    budget.finished(3)              # an evaluation of 3 instances came back (shown, not yet spent)
    budget.settle(reserved=6, used=6)  # committing the iteration

`spent` and `reserved` are saved with the checkpoint (GEPAState); `live` (finished evaluations
of iterations not committed yet) is not: a resumed run redoes those iterations and takes their
rollouts from the log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Budget"]


@dataclass
class Budget:
    """Metric calls (evaluations of one instance). `limit` None: unlimited."""

    limit: int | None = None
    spent: int = 0
    reserved: int = 0
    live: int = 0

    @property
    def left(self) -> float:
        """What planning may still use: the limit less what is spent and reserved (inf: no limit)."""
        return math.inf if self.limit is None else self.limit - self.spent - self.reserved

    def covers(self, n: int) -> bool:
        """Whether `n` more calls fit in what is left."""
        return n <= self.left

    def cut(self, n: int) -> int:
        """The largest part of `n` calls that fits (0 when nothing is left)."""
        return max(0, min(n, int(min(self.left, n))))

    def reserve(self, n: int) -> None:
        """Set `n` calls aside for planned work."""
        assert n >= 0 and self.covers(n), f"reserving {n} calls with {self.left} left"
        self.reserved += n

    def finished(self, n: int) -> None:
        """An evaluation of `n` instances came back (counted in `shown` until settled)."""
        self.live += n

    def settle(self, *, reserved: int, used: int) -> None:
        """Planned work is committed: release its reservation, spend what it used."""
        assert 0 <= reserved <= self.reserved, f"releasing {reserved} of {self.reserved} reserved"
        self.reserved -= reserved
        self.spent += used
        self.live -= used

    @property
    def shown(self) -> int:
        """Calls made so far, committed or not (what progress reports)."""
        return self.spent + self.live

    def below_spent(self) -> bool:
        """Whether the limit is under what a resumed run already spent."""
        return self.limit is not None and self.limit < self.spent
