"""Reading a GEPA run directory for the viewer (blocking; callers pick the thread).

state.json and result.json hold one record per candidate and are parsed whole (through
GEPAState / GEPAResult); reflections.jsonl can be large and is streamed, parsing only the
lines of the iteration asked for.
"""

from __future__ import annotations

import json
from pathlib import Path

from rollouts.gepa.checkpoint import REFLECTIONS_FILE, RESULT_FILE, STATE_FILE
from rollouts.gepa.result import GEPAResult
from rollouts.gepa.state import GEPAState
from rollouts.view.catalog import GepaRunDetail, GepaRunRow, NotFound, Reflection

__all__ = ["REFLECTIONS_FILE", "RESULT_FILE", "STATE_FILE", "is_gepa_dir", "read_gepa_dir", "read_reflections"]


def is_gepa_dir(path: Path) -> bool:
    """A checkpointed run (state.json), or a finished one (result.json + best_candidate.json)."""
    return (path / STATE_FILE).is_file() or (
        (path / RESULT_FILE).is_file() and (path / "best_candidate.json").is_file()
    )


def read_gepa_dir(path: Path, run_id: str) -> GepaRunDetail:
    """The run's candidates, history and front: from result.json when it has finished, else
    from the latest checkpoint (status "running")."""
    result: GEPAResult | None = None
    status = "running"
    try:
        if (path / RESULT_FILE).is_file():
            result = GEPAResult.from_dict(json.loads((path / RESULT_FILE).read_text(encoding="utf-8")))
            status = result.stop_reason or "finished"
        elif (path / STATE_FILE).is_file():
            state = GEPAState.from_dict(json.loads((path / STATE_FILE).read_text(encoding="utf-8")))
            if state.candidates:
                result = state.to_result("running", None, str(path))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise NotFound(f"GEPA run {run_id} cannot be read ({type(e).__name__}: {e})") from None
    if result is None:
        return GepaRunDetail(GepaRunRow(run_id, path.name, str(path), status), (), (), (), 0)
    row = GepaRunRow(
        run_id=run_id,
        name=path.name,
        location=str(path),
        status=status,
        n_candidates=len(result.candidates),
        best_idx=result.best_idx,
        best_score=result.best_score,
        seed_score=result.seed_score,
        metric_calls=result.metric_calls,
        max_metric_calls=result.max_metric_calls,
        iterations=result.iterations,
    )
    return GepaRunDetail(row, result.candidates, result.history, result.pareto_front, result.valset_size)


def read_reflections(path: Path, iteration: int) -> list[Reflection]:
    """The reflections recorded for `iteration` in a reflections.jsonl (none if it is missing)."""
    prefix = b'{"key":"' + str(int(iteration)).encode() + b":"
    found: list[Reflection] = []
    try:
        with open(path, "rb") as f:
            for line in f:  # streamed; only this iteration's lines are parsed
                if not line.startswith(prefix) or not line.endswith(b"\n"):
                    continue
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                found.append(
                    Reflection(int(d.get("iteration", iteration)), str(d.get("component", "")),
                               str(d.get("prompt", "")), str(d.get("answer", "")))
                )  # fmt: skip
    except FileNotFoundError:
        pass
    return found
