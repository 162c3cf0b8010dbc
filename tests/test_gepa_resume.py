"""Kill and resume: a GEPA run interrupted anywhere (a model call, a reflection, a callback,
cancellation) and started again with the same arguments ends with exactly the result of an
uninterrupted run, and finished rollouts are not paid for twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from _gepa_task import Kill, TagTask, rows

from rollouts.errors import ConfigurationError
from rollouts.gepa import GEPAEvent, GEPAResult, optimize
from rollouts.gepa.checkpoint import REFLECTIONS_FILE, RESULT_FILE, ROLLOUTS_FILE, STATE_FILE

TRAIN = rows("abcdeabcde")
VAL = rows("abcdeabc", "v")
SETTINGS: dict[str, Any] = {"max_metric_calls": 110, "seed": 2}


async def _run(task: TagTask, run_dir: Path | None, **kw: Any) -> GEPAResult:
    settings = {**SETTINGS, **kw}
    train, val = settings.pop("trainset", TRAIN), settings.pop("valset", VAL)
    return await optimize(
        task.seed(),
        train,
        val,
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        run_dir=run_dir,
        **settings,
    )


def _same(a: GEPAResult, b: GEPAResult) -> None:
    da, db = a.to_dict(), b.to_dict()
    da.pop("run_dir")
    db.pop("run_dir")
    assert da == db


@pytest.fixture(scope="module")
def reference() -> GEPAResult:
    """The uninterrupted run (without a run directory)."""

    async def main() -> GEPAResult:
        return await _run(TagTask(max_tags=3), None)

    result = trio.run(main)
    assert result.iterations >= 8 and len(result.candidates) >= 4  # enough happens to interrupt
    return result


async def test_a_run_with_a_run_dir_gives_the_same_result_and_writes_its_files(
    tmp_path: Path, reference: GEPAResult
) -> None:
    result = await _run(TagTask(max_tags=3), tmp_path / "run")
    _same(result, reference)
    run = tmp_path / "run"
    for name in (STATE_FILE, RESULT_FILE, ROLLOUTS_FILE, REFLECTIONS_FILE, "best_candidate.json"):
        assert (run / name).is_file(), name
    assert (run / "best_system_prompt.txt").read_text().rstrip("\n") == result.best_candidate["system_prompt"]
    assert GEPAResult.from_json((run / RESULT_FILE).read_text()) == result
    lines = (run / ROLLOUTS_FILE).read_text().splitlines()
    assert len(lines) == result.metric_calls  # every rollout, with its trajectory
    records = [json.loads(line) for line in lines]
    assert sum(r["eval"] == "seed-val" for r in records) == len(VAL)
    assert all(r["sample"]["trajectory"]["messages"] and r["sample"]["score"] for r in records)


@pytest.mark.parametrize("kill_at", [3, 9, 12, 15, 24, 31, 47, 60, 75, 93])
async def test_killed_at_a_model_call_and_resumed(tmp_path: Path, reference: GEPAResult, kill_at: int) -> None:
    run = tmp_path / "run"
    killed = TagTask(max_tags=3, kill_at=kill_at)
    with pytest.raises(Kill):
        await _run(killed, run)
    again = TagTask(max_tags=3)
    result = await _run(again, run)
    _same(result, reference)
    # Finished rollouts came from the log: only those in flight at the kill ran twice.
    assert (killed.task_calls - 1) + again.task_calls <= reference.metric_calls + len(VAL) + 3


@pytest.mark.parametrize("kill_at_reflection", [1, 3, 5])
async def test_killed_during_a_reflection_and_resumed(
    tmp_path: Path, reference: GEPAResult, kill_at_reflection: int
) -> None:
    run = tmp_path / "run"
    task = TagTask(max_tags=3)
    plain = task._reflect

    def reflect(req: Any) -> str:
        if task.reflect_calls + 1 == kill_at_reflection:
            raise Kill("killed in a reflection")
        return plain(req)

    task.reflector._fn = reflect
    with pytest.raises(Kill):
        await _run(task, run)
    again = TagTask(max_tags=3)
    _same(await _run(again, run), reference)
    assert again.reflect_calls <= reference.iterations  # earlier reflections were read back


@pytest.mark.parametrize(
    ("kind", "nth"), [("iteration_end", 1), ("iteration_end", 4), ("checkpoint", 3), ("evaluation", 7)]
)
async def test_callback_raising_ends_the_run_and_it_resumes(
    tmp_path: Path, reference: GEPAResult, kind: str, nth: int
) -> None:
    run = tmp_path / "run"
    count = 0
    fired = False

    def boom(event: GEPAEvent) -> None:
        nonlocal count, fired
        if event.kind != kind or fired:
            return
        count += 1
        # A checkpoint overtaken by a newer one is not written (nor reported): count those by iteration.
        if (event.iteration >= nth) if kind == "checkpoint" else (count == nth):
            fired = True
            raise RuntimeError(f"callback failed at {kind} #{nth}")

    with pytest.raises(RuntimeError, match="callback failed"):
        await _run(TagTask(max_tags=3), run, callbacks=[boom])
    _same(await _run(TagTask(max_tags=3), run), reference)


@pytest.mark.parametrize("after", [0, 2, 5])
async def test_cancelled_then_resumed(tmp_path: Path, reference: GEPAResult, after: int) -> None:
    run = tmp_path / "run"
    scope = trio.CancelScope()

    def cancel(event: GEPAEvent) -> None:
        if (event.kind == "iteration_end" and event.iteration == after) or (after == 0 and event.kind == "evaluation"):
            scope.cancel()

    first = await _run(TagTask(max_tags=3), run, cancel_scope=scope, callbacks=[cancel])
    assert first.stop_reason == "cancelled"
    assert first.iterations <= after
    _same(await _run(TagTask(max_tags=3), run), reference)


async def test_resuming_a_finished_run_calls_nothing(tmp_path: Path, reference: GEPAResult) -> None:
    run = tmp_path / "run"
    await _run(TagTask(max_tags=3), run)
    again = TagTask(max_tags=3)
    _same(await _run(again, run), reference)
    assert again.task_calls == 0 and again.reflect_calls == 0


async def test_resume_with_different_settings_or_data_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    await _run(TagTask(), run, max_metric_calls=30)
    with pytest.raises(ConfigurationError, match=r"different settings \(seed\)"):
        await _run(TagTask(), run, seed=9)
    with pytest.raises(ConfigurationError, match="trainset"):
        await _run(TagTask(), run, trainset=rows("abc"))
    result = await _run(TagTask(), run, max_metric_calls=60)  # a larger budget continues the run
    assert 30 < result.metric_calls <= 60


@pytest.mark.parametrize("kill_at", [10, 30, 50])
async def test_kill_and_resume_with_proposals_in_flight_and_merge(tmp_path: Path, kill_at: int) -> None:
    settings = {"proposals_in_flight": 2, "use_merge": True, "max_metric_calls": 90}
    whole = await _run(TagTask(two_components=True), None, **settings)
    run = tmp_path / "run"
    with pytest.raises(Kill):
        await _run(TagTask(two_components=True, kill_at=kill_at), run, **settings)
    _same(await _run(TagTask(two_components=True), run, **settings), whole)
