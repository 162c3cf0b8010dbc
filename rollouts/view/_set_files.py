"""Eval set directories on disk (`rollouts.eval.sets`): `index.json` of kind `rollouts.eval_set`
naming each task x model pair's directory, status and comparison entry.

A pair's directory comes from the index, so it is kept only when it lies inside the set's
directory (an index is data, never a way out of the folders the viewer was given).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rollouts.eval.sets import INDEX_FILE
from rollouts.view.catalog import EvalSetCell, EvalSetDetail, EvalSetRow, NotFound

SET_KIND = "rollouts.eval_set"
PAIRS_MAX = 2000  # a set's pairs the viewer reads (tasks x models; far above any real set)
_INDEX_MAX_BYTES = 64 * 1024 * 1024


def read_index(path: Path) -> Mapping[str, Any] | None:
    """The set's index at `path/index.json`, or None when `path` is not an eval set."""
    f = path / INDEX_FILE
    try:
        if f.stat().st_size > _INDEX_MAX_BYTES:
            return None
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, Mapping) or data.get("kind") != SET_KIND:
        return None
    return data


def pair_dirs(path: Path, index: Mapping[str, Any]) -> list[Path]:
    """The pairs' directories the index names, those inside `path` only."""
    root = path.resolve()
    found = []
    pairs = index.get("pairs")
    for p in pairs[:PAIRS_MAX] if isinstance(pairs, list) else ():
        d = p.get("dir") if isinstance(p, Mapping) else None
        if not isinstance(d, str) or not d:
            continue
        target = (root / d).resolve()
        if target != root and target.is_relative_to(root):
            found.append(target)
    return found


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


def _numbers(x: Any) -> dict[str, float]:
    if not isinstance(x, Mapping):
        return {}
    return {str(k): v for k, v in ((k, _num(v)) for k, v in x.items()) if v is not None}


def _cell(task: str, model: str, c: Mapping[str, Any], run_id: str | None) -> EvalSetCell:
    ci = c.get("ci")
    lo, hi = (_num(ci[0]), _num(ci[1])) if isinstance(ci, list) and len(ci) == 2 else (None, None)
    return EvalSetCell(
        task=task,
        model=model,
        status=str(c.get("status") or "pending"),
        n=int(_num(c.get("n")) or 0),
        mean=_num(c.get("mean")),
        ci=(lo, hi) if lo is not None and hi is not None else None,
        ci_method=str(c.get("ci_method") or ""),
        metrics=_numbers(c.get("metrics")),
        samples=int(_num(c.get("samples")) or 0),
        failed=int(_num(c.get("failed")) or 0),
        epochs=_numbers(c.get("epochs")),
        error=str(c.get("error") or ""),
        run_id=run_id,
    )


def read_eval_set(path: Path, set_id: str, run_id_of: Callable[[Path], str | None]) -> EvalSetDetail:
    """The set at `path` as the viewer shows it; `run_id_of(pair directory)` is the pair's run
    id in the viewer, or None."""
    index = read_index(path)
    if index is None:
        raise NotFound(f"eval set {set_id} has no readable {INDEX_FILE}")
    root = path.resolve()
    pairs = [p for p in (index.get("pairs") or [])[:PAIRS_MAX] if isinstance(p, Mapping)]
    dirs = {(str(p.get("task")), str(p.get("model"))): p.get("dir") for p in pairs}
    comparison = index.get("comparison") if isinstance(index.get("comparison"), Mapping) else {}
    assert isinstance(comparison, Mapping)
    tasks = [str(t) for t in index.get("tasks") or []] or list(dict.fromkeys(t for t, _ in dirs))
    models = [str(m) for m in index.get("models") or []] or list(dict.fromkeys(m for _, m in dirs))
    status = {(str(p.get("task")), str(p.get("model"))): str(p.get("status") or "pending") for p in pairs}
    cells = []
    for task in tasks:
        by_model = comparison.get(task)
        for model in models:
            entry = by_model.get(model) if isinstance(by_model, Mapping) else None
            if not isinstance(entry, Mapping):
                entry = {"status": status.get((task, model), "pending")}
            d = dirs.get((task, model))
            target = (root / d).resolve() if isinstance(d, str) and d else None
            run_id = run_id_of(target) if target is not None and target.is_relative_to(root) else None
            cells.append(_cell(task, model, entry, run_id))
    states = [status.get((c.task, c.model), c.status) for c in cells]
    row = EvalSetRow(
        set_id=set_id,
        name=path.name,
        location=str(path),
        tasks=tuple(tasks),
        models=tuple(models),
        completed=states.count("completed"),
        failed=states.count("failed"),
        pending=len(states) - states.count("completed") - states.count("failed"),
        confidence=_num(index.get("confidence")) or 0.95,
    )
    return EvalSetDetail(row, tuple(cells))
