"""A service GEPA job as the viewer's GEPA run: candidates, lineage, Pareto front and history
from its checkpoint (the engine's state, kept in the job row), reads of one transaction scoped to
a workspace; reflections (not in the checkpoint) from the job's run directories on this server."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollouts.gepa.checkpoint import REFLECTIONS_FILE
from rollouts.gepa.state import GEPAState
from rollouts.service._batch_runs import RUNS_LIMIT, run_status
from rollouts.service._db import Tx
from rollouts.view import read_reflections
from rollouts.view.catalog import GepaRunDetail, GepaRunRow, NotFound, Reflection


def jobs_version(tx: Tx, ws: str) -> str:
    """A token that changes when any GEPA job of `ws` makes progress (or is created)."""
    r = tx.one(
        "SELECT COUNT(*), SUM(metric_calls), SUM(candidates), MAX(created_at), MAX(completed_at), "
        "SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) "
        "FROM gepa_jobs WHERE workspace_id = ?",
        (ws,),
    )
    return ":".join(str(x) for x in (r or ()))


_JOB_COLS = "j.id, j.agent_id, a.name, j.status, j.metric_calls, j.max_metric_calls, j.best_score, j.candidates"


def _job_row(r: Sequence[Any], iterations: int = 0, best_idx: int = 0, seed_score: float = 0.0) -> GepaRunRow:
    jid, agent_id, agent_name, status, calls, budget, best, candidates = r
    return GepaRunRow(
        run_id=str(jid),
        name=f"{agent_name} ({agent_id})",
        location="GEPA job",
        status=run_status(str(status)),
        n_candidates=int(candidates or 0),
        best_idx=best_idx,
        best_score=float(best or 0.0),
        seed_score=seed_score,
        metric_calls=int(calls or 0),
        max_metric_calls=int(budget),
        iterations=iterations,
    )


def job_rows(tx: Tx, ws: str) -> list[GepaRunRow]:
    rows = tx.execute(
        f"SELECT {_JOB_COLS} FROM gepa_jobs j JOIN agents a ON a.id = j.agent_id WHERE j.workspace_id = ? "
        "ORDER BY j.created_at DESC, j.id LIMIT ?",
        (ws, RUNS_LIMIT),
    )
    return [_job_row(r) for r in rows]


def job_detail(tx: Tx, ws: str, job_id: str) -> GepaRunDetail:
    r = tx.one(
        f"SELECT {_JOB_COLS}, j.checkpoint FROM gepa_jobs j JOIN agents a ON a.id = j.agent_id "
        "WHERE j.id = ? AND j.workspace_id = ?",
        (job_id, ws),
    )
    if r is None:
        raise NotFound(f"no GEPA job {job_id}")
    row = _job_row(r[:-1])
    if not r[-1]:
        return GepaRunDetail(row, (), (), (), 0)
    try:
        result = GEPAState.from_dict(json.loads(r[-1])).to_result(row.status, row.max_metric_calls)
    except (ValueError, KeyError, TypeError) as e:
        raise NotFound(f"GEPA job {job_id}: its checkpoint cannot be read ({type(e).__name__})") from None
    row = replace(
        row,
        n_candidates=max(row.n_candidates, len(result.candidates)),
        best_idx=result.best_idx,
        seed_score=result.seed_score,
        iterations=result.iterations,
        metric_calls=max(row.metric_calls, result.metric_calls),
    )
    return GepaRunDetail(row, result.candidates, result.history, result.pareto_front, result.valset_size)


def job_version(tx: Tx, ws: str, job_id: str) -> str:
    """A token that changes when the job makes progress (a metric call, a candidate, its end)."""
    r = tx.one(
        "SELECT status, metric_calls, candidates, best_score, completed_at, LENGTH(COALESCE(checkpoint, '')) "
        "FROM gepa_jobs WHERE id = ? AND workspace_id = ?",
        (job_id, ws),
    )
    if r is None:
        raise NotFound(f"no GEPA job {job_id}")
    return ":".join(str(x) for x in r)


def job_reflections(job_dir: Path, iteration: int) -> list[Reflection]:
    """The reflections of `iteration` in every run directory of a job (one per server process
    that ran it: a resumed job continues in a new one), oldest first, each once."""
    try:
        runs = sorted((d for d in job_dir.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    except FileNotFoundError:
        return []
    found: list[Reflection] = []
    for run in runs:
        found += [r for r in read_reflections(run / REFLECTIONS_FILE, iteration) if r not in found]
    return found
