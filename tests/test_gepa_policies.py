"""Validation policies: "full" scores every accepted child on the whole validation set;
"incremental" scores it on a first stage and spends the rest only when it can still join the
front. Budget accounting stays exact under both."""

from __future__ import annotations

from typing import Any

import pytest
from _gepa_task import TagTask, rows

from rollouts.errors import ConfigurationError
from rollouts.gepa import GEPAConfig, GEPAResult, optimize
from rollouts.gepa.engine import first_stage

TRAIN = rows("abcdabcdab")
VAL = rows("abcdabcdabcd", "v")


async def _run(task: TagTask, **kw: Any) -> GEPAResult:
    kw.setdefault("max_metric_calls", 150)
    return await optimize(
        task.seed(), TRAIN, VAL, task=task.config(), reflection_endpoint=task.reflector.endpoint, **kw
    )


async def test_incremental_stops_children_that_cannot_join_the_front_after_the_first_stage() -> None:
    found = []
    for seed in range(8):
        task = TagTask(max_tags=1)
        result = await _run(task, seed=seed, val_evaluation_policy="incremental", val_first_stage=3)
        assert result.metric_calls == task.task_calls <= 150
        stage = set(
            first_stage(len(VAL), GEPAConfig(val_evaluation_policy="incremental", val_first_stage=3, seed=seed))
        )
        assert len(stage) == 3
        for h in result.history:
            if h.new_candidate is None:
                continue
            c = result.candidates[h.new_candidate]
            if "cannot join the front" in h.message:
                found.append((seed, c.idx))
                assert set(c.val_scores) == stage and not c.complete
                assert all(c.idx not in front for front in result.pareto_front)
                assert result.best_idx != c.idx
            elif "budget ran out" not in h.message:
                assert c.complete
        # a child stopped early is never picked as a parent afterwards
        stopped = {i for s, i in found if s == seed}
        assert not any(h.parents and h.parents[0] in stopped for h in result.history if h.kind == "mutation")
    assert found, "no seed produced a child that could not join the front (the test needs one)"


async def test_incremental_spends_less_on_validation_than_full_for_the_same_children() -> None:
    full = await _run(TagTask(max_tags=1), seed=1, max_iterations=12)
    inc = await _run(TagTask(max_tags=1), seed=1, max_iterations=12, val_evaluation_policy="incremental")
    val_calls = lambda r: sum(len(c.val_scores) for c in r.candidates[1:])  # noqa: E731
    assert val_calls(inc) <= val_calls(full)
    assert inc.best_score >= 0.0 and full.best_score >= 0.0


@pytest.mark.parametrize("policy", ["full", "incremental"])
@pytest.mark.parametrize("budget", [0, 5, 12, 13, 19, 27, 40, 61, 90])
async def test_budget_accounting_is_exact_under_each_policy(policy: str, budget: int) -> None:
    for seed in (0, 3):
        task = TagTask(max_tags=2)
        result = await _run(task, seed=seed, max_metric_calls=budget, val_evaluation_policy=policy)
        assert result.metric_calls == task.task_calls <= budget
        assert result.stop_reason in ("budget", "no_new_evaluations")
        assert all(h.metric_calls <= budget for h in result.history)


def test_an_unknown_policy_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="unknown val_evaluation_policy 'half'; use 'full' or 'incremental'"):
        GEPAConfig(val_evaluation_policy="half")
