"""Events you can attribute: under speculation every event names its iteration, falls between that
iteration's start and end, and a dropped speculative iteration says so."""

from __future__ import annotations

import re
from typing import Any

import pytest
from _gepa_task import TagTask, rows

from rollouts.gepa import GEPAConfig, GEPAEvent, optimize

TRAIN = rows("abcdabcdab")
VAL = rows("abcdabcd", "v")


async def _events(task: TagTask, **kw: Any) -> tuple[list[GEPAEvent], Any]:
    events: list[GEPAEvent] = []
    result = await optimize(
        task.seed(),
        TRAIN,
        VAL,
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=100,
        seed=0,
        callbacks=[events.append],
        **kw,
    )
    return events, result


def _eval_iteration(eval_id: str) -> int:
    m = re.match(r"it(\d{4})-", eval_id)
    return int(m.group(1)) if m else 0  # ("seed-val")


@pytest.mark.parametrize("speculative", [True, False])
async def test_event_order_under_speculation_names_every_iteration(speculative: bool) -> None:
    events, result = await _events(TagTask(max_tags=1), config=GEPAConfig(speculative=speculative))
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    open_it: int | None = 0  # the seed's evaluation is "iteration 0" until seed_evaluated
    ended: list[int] = []
    for e in events:
        if e.kind == "seed_evaluated":
            assert open_it == 0 and e.iteration == 0
            open_it = None
        elif e.kind == "iteration_start":
            assert open_it is None, f"iteration {e.iteration} started while {open_it} is open"
            assert e.iteration == (ended[-1] + 1 if ended else 1), "iterations start in order"
            open_it = e.iteration
        elif e.kind in ("iteration_end", "iteration_dropped"):
            assert open_it == e.iteration
            open_it = None
            if e.kind == "iteration_end":
                ended.append(e.iteration)
        elif e.kind == "evaluation":
            assert e.iteration == open_it or (e.iteration == open_it == 0), (e.iteration, open_it, e.message)
            # (an accepted child's validation evaluation belongs to the iteration that made it)
            assert _eval_iteration(e.data["eval_id"]) == e.iteration
        elif e.kind in ("reflection", "new_best"):
            assert e.iteration == open_it, (e.kind, e.iteration, open_it)
    assert ended == list(range(1, result.iterations + 1))
    dropped = [e for e in events if e.kind == "iteration_dropped"]
    notes = [h for h in result.history if "was dropped" in h.message]
    assert len(dropped) == len(notes)
    if speculative:
        assert dropped, "this run drops speculative iterations (the test needs some)"
        starts = [e for e in events if e.kind == "iteration_start" and e.data.get("speculative")]
        assert starts and all("started early" in e.message for e in starts)
        for d in dropped:
            assert d.data["reason"].startswith(("the selection chose", "stopping"))
            assert d.data["calls"] >= 0 and f"iteration {d.iteration} started early" in d.message
            # the same iteration number starts again on the chosen parent (unless the run stops)
            after = events[events.index(d) + 1 :]
            restart = next((e for e in after if e.kind == "iteration_start"), None)
            assert restart is None or restart.iteration == d.iteration or d.data["reason"].startswith("stopping")
    else:
        assert not any(e.data.get("speculative") for e in events if e.kind == "iteration_start")


async def test_reflection_events_of_a_dropped_speculation_lie_inside_its_brackets() -> None:
    events, _ = await _events(TagTask(max_tags=1))
    for d in (e for e in events if e.kind == "iteration_dropped"):
        i = events.index(d)
        start = max(j for j in range(i) if events[j].kind == "iteration_start")
        inside = events[start + 1 : i]
        assert events[start].iteration == d.iteration and events[start].data.get("speculative")
        assert all(e.iteration == d.iteration for e in inside if e.kind in ("evaluation", "reflection"))
        assert any(e.kind == "evaluation" for e in inside)  # its parent's minibatch evaluation
