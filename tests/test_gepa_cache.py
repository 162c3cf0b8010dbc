"""The evaluation cache: a (candidate, row, scoring fingerprint) already evaluated costs no metric
call, changes nothing else, lives in the run directory and resumes bit-exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from _gepa_task import Kill, TagTask, rows

from rollouts.gepa import GEPAResult, optimize
from rollouts.gepa.adapter import EvaluationBatch
from rollouts.gepa.cache import CACHE_FILE, EvaluationCache

TRAIN = rows("abcdeabcde")


async def _run(task: TagTask, run_dir: Path | None = None, **kw: Any) -> GEPAResult:
    kw.setdefault("max_metric_calls", 400)
    kw.setdefault("max_iterations", 14)
    return await optimize(
        task.seed(),
        kw.pop("trainset", TRAIN),
        kw.pop("valset", None),  # (the valset is the trainset: the case that repeats the most)
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        run_dir=run_dir,
        seed=kw.pop("seed", 1),
        **kw,
    )


def _without_calls(result: GEPAResult) -> dict[str, Any]:
    """The result without what the cache changes: the calls made (and saved)."""
    d = result.to_dict()
    for key in ("run_dir", "metric_calls", "calls_saved_by_cache", "speculation_calls"):
        d.pop(key)
    for h in d["history"]:
        h.pop("metric_calls")
        h["message"] = re.sub(r"\d+ calls spent", "N calls spent", h["message"])
    return d


@pytest.mark.parametrize("settings", [{}, {"speculative": False}, {"proposals_in_flight": 3}, {"use_merge": True}])
async def test_a_run_with_the_cache_equals_one_without_except_calls_spent(settings: dict[str, Any]) -> None:
    task_off = TagTask(max_tags=2)  # (made one after the other: their models share names)
    off = await _run(task_off, cache_evaluations=False, **settings)
    task_on = TagTask(max_tags=2)
    on = await _run(task_on, **settings)
    assert off.stop_reason == on.stop_reason == "max_iterations"
    assert _without_calls(on) == _without_calls(off)
    # Every evaluation of a row was either made (a real rollout, counted) or answered by the cache.
    assert on.metric_calls == task_on.task_calls and off.metric_calls == task_off.task_calls
    assert off.calls_saved_by_cache == 0
    assert on.calls_saved_by_cache > 0
    assert on.metric_calls + on.calls_saved_by_cache == off.metric_calls
    assert task_on.reflect_calls == task_off.reflect_calls


async def test_cache_hits_cost_no_metric_call_and_are_reported(tmp_path: Path) -> None:
    task = TagTask(max_tags=2)
    result = await _run(task, tmp_path / "run")
    assert result.calls_saved_by_cache > 0
    assert "saved by the cache" in result.summary()
    records = [json.loads(line) for line in (tmp_path / "run" / CACHE_FILE).read_text().splitlines()]
    assert len(records) == result.metric_calls == task.task_calls  # one record per call made
    assert len({r["key"] for r in records}) == len(records)  # no (candidate, row) evaluated twice
    assert GEPAResult.from_json(result.to_json()).calls_saved_by_cache == result.calls_saved_by_cache


@pytest.fixture(scope="module")
def reference() -> GEPAResult:
    import trio

    async def main() -> GEPAResult:
        return await _run(TagTask(max_tags=2))

    result = trio.run(main)
    assert result.calls_saved_by_cache > 10 and result.iterations == 14
    return result


@pytest.mark.parametrize("kill_at", [4, 11, 17, 26, 33, 45])
async def test_resume_with_the_cache_is_bit_exact(tmp_path: Path, reference: GEPAResult, kill_at: int) -> None:
    run = tmp_path / "run"
    killed = TagTask(max_tags=2, kill_at=kill_at)
    with pytest.raises(Kill):
        await _run(killed, run)
    again = TagTask(max_tags=2)
    resumed = await _run(again, run)
    a, b = resumed.to_dict(), reference.to_dict()
    a.pop("run_dir"), b.pop("run_dir")
    assert a == b  # calls made and saved included
    # Rows the cache or the rollout log answers are not run again: only the call in flight at the kill.
    assert (killed.task_calls - 1) + again.task_calls <= reference.metric_calls + 3


async def test_resume_with_proposals_in_flight_is_bit_exact(tmp_path: Path) -> None:
    settings = {"proposals_in_flight": 2, "use_merge": True}
    whole = await _run(TagTask(two_components=True), **settings)
    run = tmp_path / "run"
    with pytest.raises(Kill):
        await _run(TagTask(two_components=True, kill_at=25), run, **settings)
    resumed = await _run(TagTask(two_components=True), run, **settings)
    a, b = resumed.to_dict(), whole.to_dict()
    a.pop("run_dir"), b.pop("run_dir")
    assert a == b and whole.calls_saved_by_cache > 0


async def test_another_scoring_fingerprint_or_row_or_text_is_a_miss(tmp_path: Path) -> None:
    calls: list[int] = []

    async def run(todo: Any) -> EvaluationBatch:
        calls.append(len(todo))
        return EvaluationBatch(outputs=["x"] * len(todo), scores=[1.0] * len(todo))

    row, cand = {"id": "1", "q": "2+2"}, {"system_prompt": "Be exact."}
    cache = EvaluationCache(tmp_path / CACHE_FILE, scoring="score-v1")
    first = await cache.evaluate(run, [row, row], cand, capture=False, eval_id="a", iteration=0)
    assert (first.calls, first.saved) == (1, 1)  # the same row twice in one batch: run once
    again = await cache.evaluate(run, [row], cand, capture=False, eval_id="b", iteration=1)
    assert (again.calls, again.saved, again.batch.scores) == (0, 1, [1.0])
    for other_row, other_cand in (({"id": "1", "q": "2+3"}, cand), (row, {"system_prompt": "Be exact!"})):
        out = await cache.evaluate(run, [other_row], other_cand, capture=False, eval_id="c", iteration=2)
        assert (out.calls, out.saved) == (1, 0)
    # With traces asked for, an entry without a trajectory (no codec) cannot answer.
    traced = await cache.evaluate(run, [row], cand, capture=True, eval_id="d", iteration=3)
    assert traced.calls == 1
    cache.close()
    other = EvaluationCache(tmp_path / CACHE_FILE, scoring="score-v2")
    other.set_horizon(other.count)
    out = await other.evaluate(run, [row], cand, capture=False, eval_id="e", iteration=4)
    assert (out.calls, out.saved) == (1, 0)
    other.close()
