"""Issue 13 item 14 (GEPA parts) and issue 14 item 6: a resumed run with a budget below what was
spent, a stop file left behind, the Budget arithmetic, the typed carry, and optimize()'s settings
taken from GEPAConfig (one source of truth)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from _gepa_task import TagTask, rows

from rollouts.errors import ConfigurationError
from rollouts.gepa import GEPAConfig, GEPAEvent, GEPAResult, optimize
from rollouts.gepa.budget import Budget
from rollouts.gepa.optimize import search_config
from rollouts.gepa.state import Carry, GEPAState
from rollouts.gepa.stoppers import FileStopper, MaxIterationsStopper

TRAIN = rows("abcdabcdab")
VAL = rows("abcdabcd", "v")


async def _run(task: TagTask, **kw: Any) -> GEPAResult:
    kw.setdefault("max_metric_calls", 60)
    return await optimize(
        task.seed(), TRAIN, VAL, task=task.config(), reflection_endpoint=task.reflector.endpoint, **kw
    )


async def test_gepa_resumed_with_budget_below_spent_is_a_clear_error_not_36_of_10(tmp_path: Path) -> None:
    first = await _run(TagTask(), run_dir=tmp_path, max_metric_calls=40)
    spent = first.metric_calls
    assert spent > 10
    events: list[GEPAEvent] = []
    again = TagTask()
    with pytest.raises(ConfigurationError, match=rf"already spent {spent} metric calls.*budget of 10") as info:
        await _run(again, run_dir=tmp_path, max_metric_calls=10, callbacks=[events.append])
    assert f"above {spent}" in str(info.value)
    assert again.task_calls == 0 and again.reflect_calls == 0 and events == []
    # the same budget as spent is a finished run: nothing to do, no "n/m" above the limit
    done = await _run(TagTask(), run_dir=tmp_path, max_metric_calls=spent)
    assert done.metric_calls == spent == done.max_metric_calls


async def test_gepa_stale_stop_file_is_removed_at_the_start_with_a_message(tmp_path: Path) -> None:
    stop = tmp_path / "STOP"
    stop.touch()  # left behind by an earlier run
    events: list[GEPAEvent] = []
    result = await _run(TagTask(), stop_file=stop, max_metric_calls=40, callbacks=[events.append])
    assert result.stop_reason == "budget" and result.iterations > 0
    start = next(e for e in events if e.kind == "run_start")
    assert "removed the stop file" in start.message and str(stop) in start.message
    assert start.data["notes"] and not stop.exists()

    # a stop file that appears during the run still stops it
    def touch_at_first_iteration(e: GEPAEvent) -> None:
        if e.kind == "iteration_end":
            stop.touch()

    stopped = await _run(TagTask(), stop_file=stop, max_metric_calls=200, callbacks=[touch_at_first_iteration])
    assert stopped.stop_reason == "stop_file" and stopped.metric_calls < 200 and stop.exists()
    assert FileStopper(tmp_path / "absent").clear_stale() is None


def test_gepa_budget_arithmetic() -> None:
    b = Budget(limit=10)
    assert b.left == 10 and b.covers(10) and not b.covers(11)
    b.reserve(6)
    assert b.left == 4 and b.cut(9) == 4
    b.finished(3)
    assert b.shown == 3 and b.spent == 0
    b.settle(reserved=6, used=3)
    assert (b.spent, b.reserved, b.live, b.left, b.shown) == (3, 0, 0, 7, 3)
    assert Budget().left == float("inf") and Budget().cut(5) == 5
    assert Budget(limit=5, spent=6).below_spent() and not Budget(limit=6, spent=6).below_spent()
    with pytest.raises(AssertionError):
        Budget(limit=2).reserve(3)


def test_gepa_carry_is_typed_and_round_trips() -> None:
    state = GEPAState(valset_size=2)
    state.carry = Carry(parent=1, minibatch=(3, 4, 5))
    data = json.loads(json.dumps(state.to_dict()))
    assert data["carry"] == {"parent": 1, "minibatch": [3, 4, 5]}
    back = GEPAState.from_dict(data)
    assert back.carry == Carry(1, (3, 4, 5)) and back.metric_calls == 0 and back.reserved == 0
    assert Carry.from_dict(None) is None


def test_gepa_optimize_settings_come_from_gepaconfig_fields() -> None:
    cfg = search_config(None, {"max_metric_calls": 50, "seed": 3, "use_merge": None, "max_iterations": 2})
    assert cfg.max_metric_calls == 50 and cfg.seed == 3 and cfg.use_merge is False
    assert any(isinstance(s, MaxIterationsStopper) for s in cfg.stoppers)
    # any GEPAConfig field works by name (no hand-written copy of the list to fall behind)
    for f in fields(GEPAConfig):
        assert f.name in GEPAConfig.__doc__  # documented in one place
    assert search_config(None, {"skip_perfect_score": False, "max_merge_invocations": 2}).max_merge_invocations == 2
    base = GEPAConfig(seed=7, stoppers=(MaxIterationsStopper(9),))
    merged = search_config(base, {"stoppers": [MaxIterationsStopper(1)]})
    assert merged.seed == 7 and len(merged.stoppers) == 2
    with pytest.raises(TypeError, match=r"unknown setting.*minibatch_size.*reflection_minibatch_size"):
        search_config(None, {"minibatch_size": 3})


async def test_gepa_optimize_unknown_keyword_is_a_type_error() -> None:
    task = TagTask()
    with pytest.raises(TypeError, match="max_metric_call"):
        await optimize(task.seed(), TRAIN, task=task.config(), reflection_endpoint=task.reflector.endpoint,
                       max_metric_call=5)  # fmt: skip
