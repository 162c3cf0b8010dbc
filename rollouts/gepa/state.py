"""The engine's whole state: candidates, scores, lineage, front, RNG and sampler state, budget.

Everything a resumed run needs is here and round-trips through JSON exactly (the RNG state
included), so a run restarted from a checkpoint makes the same decisions as one that never
stopped.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollouts.gepa.budget import Budget
from rollouts.gepa.frontier import ParetoFront, objective_fronts
from rollouts.gepa.result import CandidateRecord, GEPAResult, IterationRecord, best_index

__all__ = ["Carry", "GEPAState", "ProposalSpec"]

STATE_VERSION = 1


@dataclass
class ProposalSpec:
    """One planned iteration: decided in a fixed order from the state of the moment, so that it
    can be saved with the checkpoint and restarted identically.

    kind "mutation": `parents == (parent,)`, `instances` the minibatch (training indices),
    `components` those to rewrite. kind "merge": `parents == (i, j, ancestor)`, `instances`
    the screening subsample (validation indices), `merged` the combined texts.
    `known` is how many candidates existed when it was planned (a proposal equal to one of them
    is not evaluated). `reserved` is the metric calls set aside for it."""

    iteration: int
    kind: str
    parents: tuple[int, ...]
    instances: tuple[int, ...]
    components: tuple[str, ...] = ()
    merged: dict[str, str] | None = None
    known: int = 0
    reserved: int = 0
    texts: dict[str, str] | None = None  # the parent's texts, when planned before it joined the pool

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "kind": self.kind,
            "parents": list(self.parents),
            "instances": list(self.instances),
            "components": list(self.components),
            "merged": self.merged,
            "known": self.known,
            "reserved": self.reserved,
            "texts": self.texts,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProposalSpec:
        return cls(
            iteration=d["iteration"],
            kind=d["kind"],
            parents=tuple(d["parents"]),
            instances=tuple(d["instances"]),
            components=tuple(d.get("components", ())),
            merged=d.get("merged"),
            known=d.get("known", 0),
            reserved=d.get("reserved", 0),
            texts=d.get("texts"),
        )


def _rng_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_json(data: Sequence[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


@dataclass(frozen=True)
class Carry:
    """What a dropped speculative iteration hands the next one: the parent the selection chose
    (None: select again) and the minibatch already drawn (and paid for) for it."""

    parent: int | None
    minibatch: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"parent": self.parent, "minibatch": list(self.minibatch)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Carry | None:
        return None if d is None else cls(d.get("parent"), tuple(d["minibatch"]))


@dataclass
class GEPAState:
    """Mutable engine state. `budget.spent` (`metric_calls`) counts committed evaluations of one
    instance (the seed's and those of finished iterations); `budget.reserved` is set aside for
    planned ones."""

    valset_size: int
    seed: int = 0
    candidates: list[CandidateRecord] = field(default_factory=list)
    history: list[IterationRecord] = field(default_factory=list)
    iteration: int = 0  # the last iteration planned
    budget: Budget = field(default_factory=Budget)
    rng: random.Random = field(default_factory=random.Random)
    sampler: dict[str, Any] = field(default_factory=dict)
    component_cursor: list[int] = field(default_factory=list)
    merges_due: int = 0
    merges_tried: int = 0
    merge_triples: set[tuple[int, int, int]] = field(default_factory=set)
    last_found_new: bool = False
    last_improvement: int = 0  # the iteration that last raised the best score
    reflection_failures: int = 0  # consecutive
    idle_iterations: int = 0  # consecutive iterations that made no metric call
    pending: list[ProposalSpec] = field(default_factory=list)
    carry: Carry | None = None  # parent and minibatch chosen for the next iteration
    speculation_calls: int = 0  # calls spent on speculative iterations that were dropped
    calls_saved: int = 0  # evaluations the cache answered (committed work only, like `budget.spent`)
    cache_records: int = 0  # the evaluation cache's records covered by this state (set when saved)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    front_type: str = "instance"  # (from GEPAConfig.frontier_type; not saved: the fingerprint holds it)
    front: ParetoFront = field(init=False)

    def __post_init__(self) -> None:
        self.front = ParetoFront(self.valset_size)
        for c in self.candidates:
            if not c.screened_out:
                self.front.add(c.idx, c.val_scores)

    # ---- queries ----------------------------------------------------------------------------

    @property
    def metric_calls(self) -> int:
        """Committed metric calls (`budget.spent`)."""
        return self.budget.spent

    @property
    def reserved(self) -> int:
        """Metric calls set aside for planned iterations (`budget.reserved`)."""
        return self.budget.reserved

    @property
    def best_idx(self) -> int:
        return best_index(self.candidates)

    @property
    def best_score(self) -> float:
        return self.candidates[self.best_idx].val_score if self.candidates else 0.0

    def fronts(self) -> list[frozenset[int]]:
        """The candidate sets of the fronts of `front_type` (what the Pareto selection and
        merge planning sample from)."""
        if self.front_type == "instance":
            return self.front.fronts()
        return [f.members for f in objective_fronts(self.candidates, self.front_type)]

    def scores(self) -> dict[int, float]:
        """Candidate index -> mean validation score."""
        return {c.idx: c.val_score for c in self.candidates}

    def known_index(self, components: Mapping[str, str], limit: int | None = None) -> int | None:
        """The index of an existing candidate (among the first `limit`) with these texts."""
        for c in self.candidates[:limit]:
            if c.components == components:
                return c.idx
        return None

    def ancestors(self, idx: int) -> set[int]:
        """Every candidate `idx` descends from (not itself)."""
        seen: set[int] = set()
        todo = list(self.candidates[idx].parents)
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(self.candidates[p].parents)
        return seen

    # ---- changes ----------------------------------------------------------------------------

    def add_candidate(self, record: CandidateRecord) -> None:
        assert record.idx == len(self.candidates), "candidates are added in index order"
        self.candidates.append(record)
        if not record.screened_out:
            self.front.add(record.idx, record.val_scores)
        if len(self.component_cursor) == record.idx:  # (a speculative plan may have set it already)
            self.component_cursor.append(self.initial_cursor(record.parents))

    def initial_cursor(self, parents: Sequence[int]) -> int:
        """Where a new candidate's round-robin starts: where its parents had got to."""
        return max((self.component_cursor[p] for p in parents), default=0)

    # ---- result and persistence ---------------------------------------------------------------

    def to_result(self, stop_reason: str, max_metric_calls: int | None, run_dir: str | None = None) -> GEPAResult:
        if self.front_type == "instance":
            keys: tuple[str, ...] = ()
            front = tuple(tuple(f) for f in self.front.to_lists())
        else:
            fronts = objective_fronts(self.candidates, self.front_type)
            keys = tuple(f.key for f in fronts)
            front = tuple(tuple(sorted(f.members)) for f in fronts)
        return GEPAResult(
            candidates=tuple(self.candidates),
            best_idx=self.best_idx,
            metric_calls=self.metric_calls,
            max_metric_calls=max_metric_calls,
            iterations=len(self.history),
            stop_reason=stop_reason,
            valset_size=self.valset_size,
            pareto_front=front,
            front_type=self.front_type,
            front_keys=keys,
            history=tuple(self.history),
            seed=self.seed,
            run_dir=run_dir,
            speculation_calls=self.speculation_calls,
            calls_saved_by_cache=self.calls_saved,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "valset_size": self.valset_size,
            "seed": self.seed,
            "fingerprint": copy.deepcopy(self.fingerprint),
            "candidates": [c.to_dict() for c in self.candidates],
            "history": [h.to_dict() for h in self.history],
            "iteration": self.iteration,
            "metric_calls": self.budget.spent,
            "reserved": self.budget.reserved,
            "rng": _rng_state_to_json(self.rng.getstate()),
            "sampler": copy.deepcopy(self.sampler),
            "component_cursor": list(self.component_cursor),
            "merges_due": self.merges_due,
            "merges_tried": self.merges_tried,
            "merge_triples": sorted(list(t) for t in self.merge_triples),
            "last_found_new": self.last_found_new,
            "last_improvement": self.last_improvement,
            "reflection_failures": self.reflection_failures,
            "idle_iterations": self.idle_iterations,
            "pending": [p.to_dict() for p in self.pending],
            "carry": self.carry.to_dict() if self.carry is not None else None,
            "speculation_calls": self.speculation_calls,
            "calls_saved": self.calls_saved,
            "cache_records": self.cache_records,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GEPAState:
        if d.get("version") != STATE_VERSION:
            raise ValueError(f"checkpoint version {d.get('version')!r} is not {STATE_VERSION}")
        rng = random.Random()
        rng.setstate(_rng_state_from_json(d["rng"]))
        return cls(
            valset_size=d["valset_size"],
            seed=d["seed"],
            candidates=[CandidateRecord.from_dict(c) for c in d["candidates"]],
            history=[IterationRecord.from_dict(h) for h in d["history"]],
            iteration=d["iteration"],
            budget=Budget(spent=d["metric_calls"], reserved=d["reserved"]),
            rng=rng,
            sampler=dict(d["sampler"]),
            component_cursor=list(d["component_cursor"]),
            merges_due=d["merges_due"],
            merges_tried=d["merges_tried"],
            merge_triples={(a, b, c) for a, b, c in d["merge_triples"]},
            last_found_new=d["last_found_new"],
            last_improvement=d["last_improvement"],
            reflection_failures=d["reflection_failures"],
            idle_iterations=d.get("idle_iterations", 0),
            pending=[ProposalSpec.from_dict(p) for p in d["pending"]],
            carry=Carry.from_dict(d.get("carry")),
            speculation_calls=d.get("speculation_calls", 0),
            calls_saved=d.get("calls_saved", 0),
            cache_records=d.get("cache_records", 0),
            fingerprint=dict(d["fingerprint"]),
        )
