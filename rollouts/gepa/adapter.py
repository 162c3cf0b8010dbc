"""The adapter protocol: how GEPA runs a candidate on data and learns from what happened.

A *candidate* maps component names to texts (`{"system_prompt": "You are ..."}`). The engine
never runs a model itself: it asks an adapter to evaluate a candidate on a batch of data
instances, to turn the results into reflective records (what the reflection model reads), and
optionally to propose new texts itself.

    class MyAdapter:
        async def evaluate(self, batch, candidate, capture_traces=False, *, eval_id=None):
            ...
            return EvaluationBatch(outputs=[...], scores=[...], trajectories=[...] or None)

        def make_reflective_dataset(self, candidate, eval_batch, components):
            return {name: [{"Inputs": ..., "Generated Outputs": ..., "Feedback": ...}] for name in components}

`RolloutsAdapter` (rollouts.gepa.rollouts_adapter) is the adapter for agents run by `evaluate()`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, runtime_checkable

Candidate: TypeAlias = dict[str, str]
"""Component name -> text."""

ReflectiveRecord: TypeAlias = Mapping[str, Any]
"""One example shown to the reflection model: e.g. {"Inputs": ..., "Generated Outputs": ..., "Feedback": ...}."""

ReflectiveDataset: TypeAlias = Mapping[str, Sequence[ReflectiveRecord]]
"""Component name -> the records to show when rewriting that component."""


@dataclass(frozen=True)
class EvaluationBatch:
    """What an adapter returns for one evaluation; every sequence is aligned with the batch.

    outputs: each instance's output (e.g. the final answer text).
    scores: each instance's score (higher is better; `perfect_score` is the maximum).
    trajectories: per-instance traces for reflection; required when `capture_traces=True`.
    objective_scores: optional per-instance `{objective name: value}` (e.g. every metric).
    feedback: optional per-instance feedback text.
    """

    outputs: Sequence[Any]
    scores: Sequence[float]
    trajectories: Sequence[Any] | None = None
    objective_scores: Sequence[Mapping[str, float]] | None = None
    feedback: Sequence[str] | None = None

    def check(self, batch_size: int, capture_traces: bool, adapter: object) -> None:
        """Raise ValueError naming the adapter when the batch does not fit the request."""
        name = type(adapter).__name__
        if len(self.scores) != batch_size or len(self.outputs) != batch_size:
            raise ValueError(
                f"{name}.evaluate returned {len(self.scores)} scores and {len(self.outputs)} outputs for a batch "
                f"of {batch_size}; return one of each per instance, in batch order"
            )
        for field_name in ("trajectories", "objective_scores", "feedback"):
            seq = getattr(self, field_name)
            if seq is not None and len(seq) != batch_size:
                raise ValueError(f"{name}.evaluate returned {len(seq)} {field_name} for a batch of {batch_size}")
        if capture_traces and self.trajectories is None:
            raise ValueError(f"{name}.evaluate was asked to capture traces (capture_traces=True) but returned none")
        for s in self.scores:
            if not isinstance(s, int | float) or s != s:
                raise ValueError(f"{name}.evaluate returned a score that is not a number: {s!r}")


@runtime_checkable
class GEPAAdapter(Protocol):
    """What the GEPA engine needs from a task. `propose_new_texts` is optional: when an adapter
    defines `async def propose_new_texts(candidate, reflective_dataset, components) -> dict`,
    it replaces the default reflection through the reflection endpoint."""

    async def evaluate(
        self,
        batch: Sequence[Mapping[str, Any]],
        candidate: Candidate,
        capture_traces: bool = False,
        *,
        eval_id: str | None = None,
    ) -> EvaluationBatch:
        """Run `candidate` on every instance of `batch` (concurrently, under the adapter's limits).

        Problems of single instances are scores (e.g. 0.0 with feedback), not exceptions.
        `eval_id` names this evaluation stably within a run (the same when a resumed run repeats
        it): an adapter that keeps rollouts may store them under it and reuse finished ones."""
        ...

    def make_reflective_dataset(
        self, candidate: Candidate, eval_batch: EvaluationBatch, components_to_update: Sequence[str]
    ) -> ReflectiveDataset:
        """The records the reflection model sees for each component to update."""
        ...
