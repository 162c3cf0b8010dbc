"""Fronts over objectives (GEPAConfig.frontier_type) on a two-objective task: per instance,
per objective, hybrid and cartesian each keep and pick what their definition says."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from _gepa_task import TagTask, rows

from rollouts import Metric, Sample, Score
from rollouts.errors import ConfigurationError
from rollouts.gepa import (
    CandidateRecord,
    EvaluationBatch,
    GEPAResult,
    ParetoCandidateSelector,
    objective_fronts,
    optimize,
)
from rollouts.gepa.state import GEPAState

# Two objectives, "acc" (the score) and "short", on 3 validation instances:
#   #0 acc 1,0,0  short 0,0,0       (best acc on instance 0, with #2)
#   #1 acc 0,1,0  short 1,1,1       (the only short one)
#   #2 acc 1,1,0  short .5,.5,.5    (best acc everywhere, best mean acc)
_ACC = {0: (1.0, 0.0, 0.0), 1: (0.0, 1.0, 0.0), 2: (1.0, 1.0, 0.0)}
_SHORT = {0: (0.0, 0.0, 0.0), 1: (1.0, 1.0, 1.0), 2: (0.5, 0.5, 0.5)}


def _candidates() -> list[CandidateRecord]:
    return [
        CandidateRecord(
            idx=i,
            components={"system_prompt": f"p{i}"},
            val_scores=dict(enumerate(_ACC[i])),
            val_objectives={k: {"acc": _ACC[i][k], "short": _SHORT[i][k]} for k in range(3)},
            valset_size=3,
        )
        for i in range(3)
    ]


def _fronts(kind: str) -> dict[str, set[int]]:
    return {f.key: set(f.members) for f in objective_fronts(_candidates(), kind)}


def test_each_front_type_keeps_what_its_definition_says() -> None:
    instance = {"instance:0": {0, 2}, "instance:1": {1, 2}, "instance:2": {0, 1, 2}}
    objective = {"objective:acc": {2}, "objective:short": {1}}  # best mean acc 2/3; best mean short 1
    assert _fronts("instance") == instance
    assert _fronts("objective") == objective
    assert _fronts("hybrid") == {**instance, **objective}
    assert _fronts("cartesian") == {
        "cartesian:0:acc": {0, 2}, "cartesian:0:short": {1},
        "cartesian:1:acc": {1, 2}, "cartesian:1:short": {1},
        "cartesian:2:acc": {0, 1, 2}, "cartesian:2:short": {1},
    }  # fmt: skip
    # keys in order: instances by number, then objectives
    assert [f.key for f in objective_fronts(_candidates(), "hybrid")][:3] == ["instance:0", "instance:1", "instance:2"]


@pytest.mark.parametrize(
    ("kind", "picked"),
    [("instance", {2}), ("objective", {1, 2}), ("hybrid", {1, 2}), ("cartesian", {1, 2})],
)
def test_the_pareto_selection_picks_from_the_chosen_fronts(kind: str, picked: set[int]) -> None:
    # Per instance, #2 dominates #0 and #1 (it is on every front they are on); per objective the
    # short #1 is the best on "short", so it is kept; #0 is on no objective front at all.
    state = GEPAState(valset_size=3, candidates=_candidates(), front_type=kind)
    rng = random.Random(0)
    seen = {ParetoCandidateSelector().select(state, rng) for _ in range(200)}
    assert seen == picked


def test_an_incomplete_candidate_is_on_no_objective_front() -> None:
    cands = _candidates()
    partial = CandidateRecord(
        idx=3, components={"system_prompt": "p3"}, val_scores={0: 1.0},
        val_objectives={0: {"acc": 1.0, "short": 1.0}}, valset_size=3,
    )  # fmt: skip
    fronts = {f.key: set(f.members) for f in objective_fronts([*cands, partial], "objective")}
    assert fronts == {"objective:acc": {2}, "objective:short": {1}}  # (a mean over 1 of 3 rows is not comparable)


# ---- end to end on the tags task, with a second objective ------------------------------------


class TwoObjectives(TagTask):
    """The tags task, scored on "correct" (the reward) and "short" (weight 0: an objective only):
    1.0 when the instructions are under 60 characters."""

    def score(self, sample: Sample) -> Score:
        base = super().score(sample)
        assert sample.trajectory is not None
        system = next((m.text for m in sample.trajectory.messages if m.role == "system"), "")
        return Score((*base.metrics, Metric("short", float(len(system) < 60), 0.0)))


@pytest.mark.parametrize("kind", ["instance", "objective", "hybrid", "cartesian"])
async def test_a_run_follows_the_chosen_front(kind: str) -> None:
    task = TwoObjectives(max_tags=2)
    result = await optimize(
        task.seed(), rows("abcdabcd"), rows("abcd", "v"), task=task.config(),
        reflection_endpoint=task.reflector.endpoint, max_metric_calls=80, seed=2, frontier_type=kind,
    )  # fmt: skip
    assert result.front_type == kind and result.metric_calls == task.task_calls <= 80
    expected = {c.idx: c for c in result.candidates}
    fronts = objective_fronts(list(expected.values()), kind)
    if kind == "instance":
        assert result.front_keys == () and len(result.pareto_front) == 4
    else:
        assert result.front_keys == tuple(f.key for f in fronts)
        assert result.pareto_front == tuple(tuple(sorted(f.members)) for f in fronts)
        prefix = {"objective": ("objective:",), "hybrid": ("instance:", "objective:"), "cartesian": ("cartesian:",)}
        assert all(k.startswith(prefix[kind]) for k in result.front_keys)
        assert {"objective:correct", "objective:short"} <= set(result.front_keys) or kind == "cartesian"
    assert GEPAResult.from_json(result.to_json()) == result
    assert result.best_score > result.seed_score


class _NoObjectives:
    async def evaluate(
        self, batch: Sequence[Mapping[str, Any]], candidate: Any, capture_traces: bool = False, *, eval_id: Any = None
    ) -> EvaluationBatch:
        return EvaluationBatch(outputs=[""] * len(batch), scores=[0.0] * len(batch), trajectories=[None] * len(batch))

    def make_reflective_dataset(self, candidate: Any, eval_batch: Any, components: Any) -> Any:
        return {c: [] for c in components}

    async def propose_new_texts(self, candidate: Any, dataset: Any, components: Any) -> dict[str, str]:
        return {c: candidate[c] + "!" for c in components}


async def test_an_objective_front_without_objective_scores_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="frontier_type 'objective' needs per-objective scores"):
        await optimize("x", rows("ab"), adapter=_NoObjectives(), max_metric_calls=10, frontier_type="objective")
    with pytest.raises(ConfigurationError, match="unknown frontier_type 'pareto'"):
        await optimize("x", rows("ab"), adapter=_NoObjectives(), max_metric_calls=10, frontier_type="pareto")
