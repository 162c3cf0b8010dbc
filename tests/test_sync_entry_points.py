"""optimize_sync / evaluate_sync: the async entry points for code that is not async, refusing
inside a running event loop (trio or asyncio) with a message that says what to do."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import trio
from _gepa_task import TagTask, rows

from rollouts import ConfigurationError, EvalReport, GEPAResult, evaluate_sync, optimize_sync


def _optimize(task: TagTask) -> GEPAResult:
    return optimize_sync(
        task.seed(), rows("abab"), rows("ab", "v"), task=task.config(), reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=30,
    )  # fmt: skip


def test_the_sync_entry_points_run_outside_a_loop() -> None:
    task = TagTask()
    result = _optimize(task)
    assert isinstance(result, GEPAResult) and result.best_score == 1.0 and result.metric_calls == task.task_calls
    report = evaluate_sync(rows("ab"), TagTask().config())
    assert isinstance(report, EvalReport) and len(report.samples) == 2


def test_the_sync_entry_points_refuse_inside_a_trio_loop() -> None:
    async def inside() -> None:
        with pytest.raises(
            ConfigurationError, match=r"optimize_sync\(\) was called inside a running trio event loop.*await optimize\("
        ):
            _optimize(TagTask())
        with pytest.raises(ConfigurationError, match=r"evaluate_sync\(\).*running trio event loop.*await evaluate\("):
            evaluate_sync(rows("ab"), TagTask().config())

    trio.run(inside)


def test_the_sync_entry_points_refuse_inside_an_asyncio_loop() -> None:
    # (as in a Jupyter cell: asyncio runs the notebook's loop)
    errors: list[Any] = []

    async def inside() -> None:
        for call in (lambda: _optimize(TagTask()), lambda: evaluate_sync(rows("ab"), TagTask().config())):
            try:
                call()
            except ConfigurationError as e:
                errors.append(str(e))

    asyncio.run(inside())
    assert len(errors) == 2
    assert all("running asyncio event loop" in e and "a cell can `await` directly" in e for e in errors)
