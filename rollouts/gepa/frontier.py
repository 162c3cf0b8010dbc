"""The Pareto fronts GEPA samples parents from: per validation instance (the default), and over
objectives (per objective, hybrid, cartesian: `objective_fronts`).

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
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "FRONT_TYPES",
    "Front",
    "FrontType",
    "ParetoFront",
    "front_frequencies",
    "objective_fronts",
    "remove_dominated",
]


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


# --------------------------------------------------------------------------------------------
# fronts over objectives
# --------------------------------------------------------------------------------------------

FrontType = Literal["instance", "objective", "hybrid", "cartesian"]
FRONT_TYPES: tuple[str, ...] = ("instance", "objective", "hybrid", "cartesian")


@dataclass(frozen=True)
class Front:
    """One front: what it is over (`key`), the best value reached there, the candidates reaching it.

    Keys: "instance:3" (validation instance 3's score), "objective:NAME" (the mean of objective
    NAME over the validation set), "cartesian:3:NAME" (objective NAME on instance 3)."""

    key: str
    best: float
    members: frozenset[int]


def _add(fronts: dict[str, tuple[float, set[int]]], key: str, value: float, idx: int) -> None:
    held = fronts.get(key)
    if held is None or value > held[0]:
        fronts[key] = (value, {idx})
    elif value == held[0]:
        held[1].add(idx)


def objective_fronts(candidates: Sequence[Any], front_type: str) -> list[Front]:
    """The fronts of `front_type` over candidates (CandidateRecord-like: idx, val_scores,
    val_objectives, complete, screened_out), in a stable key order.

    instance: per validation instance, the best score and who reaches it. objective: per objective,
    the best mean over the validation set (candidates evaluated on all of it only: a mean over
    part of it is not comparable) and who reaches it. hybrid: both. cartesian: per (instance,
    objective), the best value and who reaches it. A candidate screened out by the incremental
    validation policy is on no front."""
    if front_type not in FRONT_TYPES:
        raise ValueError(f"unknown front type {front_type!r}; use one of {', '.join(FRONT_TYPES)}")
    fronts: dict[str, tuple[float, set[int]]] = {}
    for c in candidates:
        if getattr(c, "screened_out", False):
            continue
        if front_type in ("instance", "hybrid"):
            for k, s in sorted(c.val_scores.items()):
                _add(fronts, f"instance:{k}", float(s), c.idx)
        if front_type in ("objective", "hybrid") and c.complete and c.val_objectives:
            names = sorted({n for o in c.val_objectives.values() for n in o})
            for name in names:
                values = [o[name] for o in c.val_objectives.values() if name in o]
                _add(fronts, f"objective:{name}", sum(values) / len(values), c.idx)
        if front_type == "cartesian":
            for k, o in sorted(c.val_objectives.items()):
                for name, v in sorted(o.items()):
                    _add(fronts, f"cartesian:{k}:{name}", float(v), c.idx)
    return [Front(key, best, frozenset(members)) for key, (best, members) in sorted(fronts.items(), key=_key_order)]


def _key_order(item: tuple[str, Any]) -> tuple[Any, ...]:
    kind, _, rest = item[0].partition(":")
    head, _, tail = rest.partition(":")
    return (kind, int(head) if head.isdigit() else head, tail)
