"""What a GEPA run produces: every candidate with its scores and lineage, the history, the best.

    result = await optimize(...)
    print(result.best_score, result.metric_calls)
    print(result.best_candidate["system_prompt"])
    print(result.show_diff())                   # best vs seed, per component
    same = GEPAResult.from_json(result.to_json())

Everything is plain data: `to_dict()` / `from_dict()` round-trip through JSON exactly.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CandidateRecord", "GEPAResult", "IterationRecord", "Origin", "Outcome"]

Origin = Literal["seed", "mutation", "merge"]
Outcome = Literal[
    "accepted",  # the child improved on the minibatch (or the merge passed screening) and joined the pool
    "rejected",  # it did not improve
    "skipped_perfect",  # the parent was already perfect on the minibatch: nothing to learn
    "unchanged",  # the proposal equals its parent or an earlier candidate: not evaluated again
    "reflection_failed",  # the reflection call failed or its answer had no usable text
]


def _int_keys(d: Mapping[Any, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


@dataclass(frozen=True)
class CandidateRecord:
    """One candidate in the pool.

    components: component name -> text. parents: the candidates it came from (none for the
    seed, one for a mutation, two for a merge). iteration: when it was made (0: the seed).
    changed: the components that differ from its (first) parent. val_scores: validation index
    -> score; it covers every validation instance unless the budget ran out mid-evaluation
    (then `complete` is False). val_objectives: per-instance objective scores, when the
    adapter reports them. screened_out: scored only on the incremental validation policy's
    first stage, where it could not join the front: kept for the record, on no front."""

    idx: int
    components: Mapping[str, str]
    parents: tuple[int, ...] = ()
    origin: Origin = "seed"
    iteration: int = 0
    changed: tuple[str, ...] = ()
    val_scores: Mapping[int, float] = field(default_factory=dict)
    val_objectives: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    valset_size: int = 0
    screened_out: bool = False

    @property
    def val_score(self) -> float:
        """Mean score over the validation instances it was evaluated on (0.0 if none)."""
        return sum(self.val_scores.values()) / len(self.val_scores) if self.val_scores else 0.0

    @property
    def complete(self) -> bool:
        """Whether it was evaluated on the whole validation set."""
        return len(self.val_scores) == self.valset_size

    def to_dict(self) -> dict[str, Any]:
        return {
            "idx": self.idx,
            "components": dict(self.components),
            "parents": list(self.parents),
            "origin": self.origin,
            "iteration": self.iteration,
            "changed": list(self.changed),
            "val_score": self.val_score,
            "val_scores": {str(k): v for k, v in sorted(self.val_scores.items())},
            "val_objectives": {str(k): dict(v) for k, v in sorted(self.val_objectives.items())},
            "valset_size": self.valset_size,
            "screened_out": self.screened_out,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CandidateRecord:
        return cls(
            idx=d["idx"],
            components=dict(d["components"]),
            parents=tuple(d.get("parents", ())),
            origin=d.get("origin", "seed"),
            iteration=d.get("iteration", 0),
            changed=tuple(d.get("changed", ())),
            val_scores=_int_keys(d.get("val_scores", {})),
            val_objectives={k: dict(v) for k, v in _int_keys(d.get("val_objectives", {})).items()},
            valset_size=d.get("valset_size", 0),
            screened_out=d.get("screened_out", False),
        )


@dataclass(frozen=True)
class IterationRecord:
    """What one iteration did.

    kind: "mutation" (reflect on a parent) or "merge" (combine two frontier candidates).
    parents: the parent (mutation) or the two merged candidates and their common ancestor.
    instances: the training instances of the minibatch (mutation) or the validation instances
    of the screening evaluation (merge). components: the components rewritten.
    parent_scores / child_scores: scores on those instances. new_candidate: the index it got
    when accepted. metric_calls: the total used after this iteration. message: why, in words.
    proposed: for a rejected proposal, the texts it proposed (component name -> text, the
    components it changed), so what was tried is not lost."""

    iteration: int
    kind: Literal["mutation", "merge"]
    outcome: Outcome
    parents: tuple[int, ...] = ()
    instances: tuple[int, ...] = ()
    components: tuple[str, ...] = ()
    parent_scores: tuple[float, ...] = ()
    child_scores: tuple[float, ...] = ()
    new_candidate: int | None = None
    metric_calls: int = 0
    message: str = ""
    proposed: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "kind": self.kind,
            "outcome": self.outcome,
            "parents": list(self.parents),
            "instances": list(self.instances),
            "components": list(self.components),
            "parent_scores": list(self.parent_scores),
            "child_scores": list(self.child_scores),
            "new_candidate": self.new_candidate,
            "metric_calls": self.metric_calls,
            "message": self.message,
            "proposed": dict(self.proposed),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IterationRecord:
        return cls(
            iteration=d["iteration"],
            kind=d["kind"],
            outcome=d["outcome"],
            parents=tuple(d.get("parents", ())),
            instances=tuple(d.get("instances", ())),
            components=tuple(d.get("components", ())),
            parent_scores=tuple(d.get("parent_scores", ())),
            child_scores=tuple(d.get("child_scores", ())),
            new_candidate=d.get("new_candidate"),
            metric_calls=d.get("metric_calls", 0),
            message=d.get("message", ""),
            proposed=dict(d.get("proposed") or {}),
        )


def _diff(a: str, b: str, from_name: str, to_name: str) -> str:
    diff = difflib.unified_diff(
        a.splitlines(keepends=True), b.splitlines(keepends=True), fromfile=from_name, tofile=to_name
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in diff)


def best_index(candidates: Sequence[CandidateRecord]) -> int:
    """The candidate with the highest mean validation score among those evaluated on the whole
    validation set (ties: the older one); among all of them when none is complete."""
    assert candidates, "no candidates"
    pool = [c for c in candidates if c.complete] or [c for c in candidates if not c.screened_out] or list(candidates)
    return max(pool, key=lambda c: (c.val_score, -c.idx)).idx


@dataclass(frozen=True)
class GEPAResult:
    """The outcome of a GEPA run. Candidate 0 is the seed.

    best_idx: the best candidate (see `best_index`). metric_calls: evaluations of one
    instance used, never more than `max_metric_calls`. stop_reason: why the run ended
    ("budget", "max_iterations", "score_threshold", "no_improvement", "stop_file", "timeout",
    "cancelled", "reflection_failed", "no_new_evaluations", ...). pareto_front: per validation instance, the
    candidates with the best score on it; with another `front_type` ("objective", "hybrid",
    "cartesian"), per front named in `front_keys` (e.g. "objective:correct", "instance:3",
    "cartesian:3:correct"), the candidates that reach its best value. history: one record per iteration.
    speculation_calls: the part of `metric_calls` spent on iterations started early on a new
    candidate and then dropped because the selection chose another parent.
    calls_saved_by_cache: evaluations of one instance answered by the evaluation cache (a
    candidate already evaluated on that row): not made, not counted in `metric_calls`."""

    candidates: tuple[CandidateRecord, ...]
    best_idx: int
    metric_calls: int
    max_metric_calls: int | None
    iterations: int
    stop_reason: str
    valset_size: int
    pareto_front: tuple[tuple[int, ...], ...] = ()
    history: tuple[IterationRecord, ...] = ()
    seed: int = 0
    run_dir: str | None = None
    speculation_calls: int = 0
    calls_saved_by_cache: int = 0
    front_type: str = "instance"
    front_keys: tuple[str, ...] = ()

    @property
    def best(self) -> CandidateRecord:
        return self.candidates[self.best_idx]

    @property
    def best_candidate(self) -> dict[str, str]:
        """The best candidate's texts (component name -> text)."""
        return dict(self.best.components)

    @property
    def best_score(self) -> float:
        return self.best.val_score

    @property
    def seed_score(self) -> float:
        return self.candidates[0].val_score

    @property
    def val_scores(self) -> tuple[float, ...]:
        """Each candidate's mean validation score, by index."""
        return tuple(c.val_score for c in self.candidates)

    def lineage(self, idx: int | None = None) -> list[int]:
        """The chain of first parents from the seed to candidate `idx` (default: the best)."""
        i = self.best_idx if idx is None else idx
        chain = [i]
        for _ in range(len(self.candidates)):
            parents = self.candidates[chain[-1]].parents
            if not parents:
                break
            chain.append(parents[0])
        return chain[::-1]

    @property
    def rejected_proposals(self) -> tuple[IterationRecord, ...]:
        """The iterations whose proposal was evaluated and rejected (each with its `proposed`
        texts and minibatch scores): what was tried and not kept."""
        return tuple(h for h in self.history if h.outcome == "rejected")

    def show_diff(self, idx: int | None = None, *, against: int = 0) -> str:
        """A unified diff, component by component, from candidate `against` (default: the seed)
        to candidate `idx` (default: the best). Unchanged components are listed as such. When the
        two are the same (no proposal was accepted), what was tried follows: every rejected
        proposal with its minibatch scores and its diff against its parent."""
        new = self.candidates[self.best_idx if idx is None else idx]
        old = self.candidates[against]
        parts = []
        for name in sorted(set(old.components) | set(new.components)):
            a, b = old.components.get(name, ""), new.components.get(name, "")
            if a == b:
                parts.append(f"=== {name}: unchanged\n")
                continue
            parts.append(_diff(a, b, f"{name} (candidate {old.idx})", f"{name} (candidate {new.idx})"))
        if new.idx == old.idx or new.components == old.components:
            parts.append(self._tried())
        return "".join(parts)

    def _tried(self) -> str:
        tried = self.rejected_proposals
        if not tried:
            return "=== no proposal was evaluated and rejected\n"
        lines = [f"=== no proposal was accepted; {len(tried)} tried and rejected:\n"]
        for h in tried:
            parent = self.candidates[h.parents[0]].components if h.parents else {}
            scores = f"{sum(h.parent_scores):g} -> {sum(h.child_scores):g} on {len(h.instances)} rows"
            lines.append(f"--- iteration {h.iteration} ({h.kind} of {list(h.parents)}): minibatch {scores}\n")
            for name, text in sorted(h.proposed.items()):
                lines.append(
                    _diff(parent.get(name, ""), text, f"{name} (candidate {h.parents[0]})", f"{name} (proposed)")
                )
        return "".join(lines)

    def summary(self) -> str:
        """A few lines for a terminal."""
        lines = [
            f"GEPA: {len(self.candidates)} candidates in {self.iterations} iterations, "
            f"{self.metric_calls}/{self.max_metric_calls if self.max_metric_calls is not None else '-'} metric calls "
            f"({self.calls_saved_by_cache} saved by the cache), "
            f"stopped: {self.stop_reason}",
            f"seed score {self.seed_score:.4f} -> best {self.best_score:.4f} (candidate {self.best_idx}, "
            f"lineage {' -> '.join(map(str, self.lineage()))})",
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "best_idx": self.best_idx,
            "best_score": self.best_score,
            "best_candidate": self.best_candidate,
            "metric_calls": self.metric_calls,
            "max_metric_calls": self.max_metric_calls,
            "iterations": self.iterations,
            "stop_reason": self.stop_reason,
            "valset_size": self.valset_size,
            "seed": self.seed,
            "run_dir": self.run_dir,
            "speculation_calls": self.speculation_calls,
            "calls_saved_by_cache": self.calls_saved_by_cache,
            "front_type": self.front_type,
            "front_keys": list(self.front_keys),
            "candidates": [c.to_dict() for c in self.candidates],
            "pareto_front": [list(f) for f in self.pareto_front],
            "history": [h.to_dict() for h in self.history],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GEPAResult:
        return cls(
            candidates=tuple(CandidateRecord.from_dict(c) for c in d["candidates"]),
            best_idx=d["best_idx"],
            metric_calls=d["metric_calls"],
            max_metric_calls=d.get("max_metric_calls"),
            iterations=d.get("iterations", 0),
            stop_reason=d.get("stop_reason", ""),
            valset_size=d.get("valset_size", 0),
            pareto_front=tuple(tuple(f) for f in d.get("pareto_front", ())),
            history=tuple(IterationRecord.from_dict(h) for h in d.get("history", ())),
            seed=d.get("seed", 0),
            run_dir=d.get("run_dir"),
            speculation_calls=d.get("speculation_calls", 0),
            calls_saved_by_cache=d.get("calls_saved_by_cache", 0),
            front_type=d.get("front_type", "instance"),
            front_keys=tuple(d.get("front_keys", ())),
        )

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)

    @classmethod
    def from_json(cls, text: str) -> GEPAResult:
        return cls.from_dict(json.loads(text))
