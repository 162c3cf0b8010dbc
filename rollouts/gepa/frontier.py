"""The per-instance Pareto front over the validation set.

For every validation instance the front keeps the best score seen and the set of candidates that
reach it. A candidate is worth keeping when it is the best on at least one instance, even if its
average is not the highest: that diversity is what GEPA samples parents from.

    front = ParetoFront(3)
    front.add(0, {0: 0.0, 1: 1.0, 2: 0.0})
    front.add(1, {0: 1.0, 1: 1.0, 2: 0.0})
    front.members  # [{1}, {0, 1}, {0, 1}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["ParetoFront", "front_frequencies", "remove_dominated"]


class ParetoFront:
    """Best score and the candidates reaching it, per validation instance."""

    def __init__(self, n_instances: int) -> None:
        assert n_instances >= 0
        self.best: list[float | None] = [None] * n_instances
        self.members: list[set[int]] = [set() for _ in range(n_instances)]

    def add(self, candidate: int, scores: Mapping[int, float]) -> list[int]:
        """Record `candidate`'s scores (validation index -> score; may cover only some instances).
        Returns the instances where it became the single best (a new record)."""
        improved = []
        for i, s in scores.items():
            assert 0 <= i < len(self.best), f"validation index {i} out of range"
            best = self.best[i]
            if best is None or s > best:
                self.best[i] = s
                self.members[i] = {candidate}
                improved.append(i)
            elif s == best:
                self.members[i].add(candidate)
        return improved

    def fronts(self) -> list[frozenset[int]]:
        """The candidate set of each instance (empty for instances nobody was evaluated on)."""
        return [frozenset(m) for m in self.members]

    def to_lists(self) -> list[list[int]]:
        return [sorted(m) for m in self.members]


def _is_dominated(y: int, others: set[int], fronts: Sequence[frozenset[int]]) -> bool:
    """Whether every instance front that holds `y` also holds one of `others`."""
    holding = [f for f in fronts if y in f]
    return bool(holding) and all(f & others for f in holding)


def remove_dominated(fronts: Sequence[frozenset[int]], scores: Mapping[int, float]) -> list[frozenset[int]]:
    """The fronts without dominated candidates: a candidate is dominated when, on every
    instance where it is among the best, some other remaining candidate is too. Candidates are
    considered from the lowest aggregate score up (ties: higher index first), removing one at a
    time, so of two candidates with identical fronts the better-scoring one (or the older one on
    a tie) stays."""
    present = {c for f in fronts for c in f}
    order = sorted(present, key=lambda c: (scores[c], -c))
    dominated: set[int] = set()
    changed = True
    while changed:
        changed = False
        for y in order:
            if y in dominated:
                continue
            if _is_dominated(y, present - dominated - {y}, fronts):
                dominated.add(y)
                changed = True
                break
    return [frozenset(f - dominated) for f in fronts]


def front_frequencies(fronts: Sequence[frozenset[int]]) -> dict[int, int]:
    """How many instance fronts each candidate is in, in ascending candidate order."""
    counts: dict[int, int] = {}
    for f in fronts:
        for c in f:
            counts[c] = counts.get(c, 0) + 1
    return dict(sorted(counts.items()))
