"""A service batch as the viewer's eval run: its tasks are the samples (score, status, turns,
tokens, cost, execution time, trajectory). Each function is a read of one transaction, scoped to
a workspace (another workspace's batch is NotFound, as a missing one), run by `store.read`;
filters, sorts and pages compile to SQL through `sample_columns` (rollouts.service._task_sql)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from rollouts.dtypes import Trajectory
from rollouts.eval.sample import Sample, Score
from rollouts.service import queue
from rollouts.service._db import Tx
from rollouts.service._task_sql import metric, reward, sample_columns
from rollouts.view.catalog import (
    CompareRow,
    Comparison,
    EvalRunDetail,
    EvalRunRow,
    NotFound,
    Page,
    SampleQuery,
    SampleRow,
    clamp_page,
)
from rollouts.view.sql import compile_compare, compile_samples

RUNS_LIMIT = 200  # the runs lists show the newest 200 batches / jobs
_PREVIEW = 160


def run_status(status: str) -> str:
    """A batch's status as the viewer knows it ("running" while tasks are pending)."""
    return "running" if status in queue.PENDING else status


def _sample_status(task_status: str) -> str:
    if task_status == "completed":
        return "completed"
    return "pending" if task_status in queue.PENDING else "failed"


def _input_preview(raw: str) -> str:
    try:
        inp = json.loads(raw)
    except ValueError:
        return ""
    text = inp.get("user_message")
    if text is None:
        msgs = inp.get("messages") or []
        text = next((str(m.get("content")) for m in reversed(msgs) if m.get("role") == "user"), "")
    return str(text)[:_PREVIEW]


def _response_preview(result: dict[str, Any]) -> str:
    traj = result.get("trajectory") or {}
    for m in reversed(traj.get("messages") or []):
        if m.get("role") == "assistant":
            content = m.get("content")
            if isinstance(content, str):
                return content[:_PREVIEW]
            if isinstance(content, list):
                texts = [str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text"]
                return " ".join(texts)[:_PREVIEW]
    return ""


def _metrics(result: dict[str, Any]) -> dict[str, float]:
    score = result.get("score") or {}
    return {
        str(m["name"]): float(m["value"])
        for m in score.get("metrics") or []
        if isinstance(m, dict) and isinstance(m.get("value"), int | float)
    }


@dataclass(frozen=True)
class _BatchRun:
    """A batch with its tasks counted, as the runs list reads it (`_RUN_SELECT`'s columns, by name)."""

    batch_id: str
    agent_id: str
    agent_version: int
    task_count: int
    cancelled_at: float | None
    created_at: float
    agent_name: str
    completed: int | None  # (the SUMs are NULL for a batch without tasks)
    failed: int | None  # failed, timed out or cancelled
    pending: int | None  # queued or running
    queued: int | None
    mean_reward: float | None
    last_finished_at: float | None


_RUN_SELECT = (
    "SELECT b.id AS batch_id, b.agent_id, b.agent_version, b.task_count, b.cancelled_at, b.created_at, "
    "a.name AS agent_name, "
    "SUM(CASE WHEN t.status = 'completed' THEN 1 ELSE 0 END) AS completed, "
    f"SUM(CASE WHEN t.status {queue.status_in(('failed', 'timeout', 'cancelled'))} THEN 1 ELSE 0 END) AS failed, "
    f"SUM(CASE WHEN t.status {queue.status_in(queue.PENDING)} THEN 1 ELSE 0 END) AS pending, "
    "SUM(CASE WHEN t.status = 'queued' THEN 1 ELSE 0 END) AS queued, "
    "AVG({reward}) AS mean_reward, MAX(t.finished_at) AS last_finished_at "
    # the newest batches first (the batches_workspace index), then their tasks (tasks_batch_status_seq)
    "FROM (SELECT * FROM batches WHERE workspace_id = ? {where} ORDER BY created_at DESC, id LIMIT ?) b "
    "JOIN agents a ON a.id = b.agent_id LEFT JOIN tasks t ON t.batch_id = b.id "
    "GROUP BY b.id, b.agent_id, b.agent_version, b.task_count, b.cancelled_at, b.created_at, a.name "
    "ORDER BY b.created_at DESC, b.id"
)


def runs_version(tx: Tx, ws: str) -> str:
    """A token that changes when any of the newest batches of `ws` changes (a task starts or
    finishes, a batch is created or cancelled): the batches list recomputes only then."""
    r = tx.one(
        "SELECT COUNT(*), COUNT(b.cancelled_at), MAX(b.created_at), "
        "SUM(CASE WHEN t.status <> 'queued' THEN 1 ELSE 0 END), MAX(t.finished_at) "
        "FROM (SELECT id, cancelled_at, created_at FROM batches WHERE workspace_id = ? "
        "ORDER BY created_at DESC, id LIMIT ?) b LEFT JOIN tasks t ON t.batch_id = b.id",
        (ws, RUNS_LIMIT),
    )
    return ":".join(str(x) for x in (r or ()))


def _run_row(r: _BatchRun) -> EvalRunRow:
    done, failed, pending, queued = (int(x or 0) for x in (r.completed, r.failed, r.pending, r.queued))
    counts = {"completed": done, "failed": failed, "queued": queued, "running": pending - queued}
    status = run_status(queue.batch_status(counts, int(r.task_count), r.cancelled_at is not None))
    from rollouts.service.routing import iso

    last = r.last_finished_at
    return EvalRunRow(
        run_id=str(r.batch_id),
        name=f"{r.agent_name} v{r.agent_version}",
        location=f"batch of agent {r.agent_id}",
        status=status,
        n_samples=done + failed,
        n_failed=failed,
        mean_reward=float(r.mean_reward) if r.mean_reward is not None else None,
        started_at=iso(r.created_at) or "",
        duration_s=(float(last) - float(r.created_at)) if last is not None and not pending else None,
    )


def batch_runs(tx: Tx, ws: str, batch_id: str | None = None) -> list[EvalRunRow]:
    where, params = ("AND id = ?", [ws, batch_id]) if batch_id is not None else ("", [ws])
    sql = _RUN_SELECT.format(reward=reward(tx.dialect), where=where)
    return [_run_row(r) for r in queue.read_rows(_BatchRun, tx.execute(sql, [*params, RUNS_LIMIT]))]


def batch_run(tx: Tx, ws: str, batch_id: str) -> EvalRunRow:
    rows = batch_runs(tx, ws, batch_id)
    if not rows:
        raise NotFound(f"no batch {batch_id}")
    return rows[0]


def batch_detail(tx: Tx, ws: str, batch_id: str) -> EvalRunDetail:
    row = batch_run(tx, ws, batch_id)
    b = tx.one(
        "SELECT agent_id, agent_version, config, task_count, parallelism, timeout_per_task_ms, system_prompt "
        "FROM batches WHERE id = ? AND workspace_id = ?",
        (batch_id, ws),
    )
    assert b is not None
    first = tx.one(
        "SELECT result FROM tasks WHERE batch_id = ? AND status = 'completed' AND result IS NOT NULL ORDER BY seq LIMIT 1",
        (batch_id,),
    )
    names = tuple(_metrics(json.loads(first[0]))) if first is not None else ()
    metrics: dict[str, float] = {}
    for name in names:
        got = tx.one(
            f"SELECT AVG({metric(tx.dialect, 't.result')}) FROM tasks t WHERE t.batch_id = ?", (name, batch_id)
        )
        if got is not None and got[0] is not None:
            metrics[name] = float(got[0])
    report = {
        "agent_id": b[0],
        "agent_version": b[1],
        "config": json.loads(b[2]),
        "task_count": b[3],
        "parallelism": b[4],
        "timeout_per_task_ms": b[5],
        "system_prompt": b[6],
    }
    return EvalRunDetail(replace(row, metrics=metrics), report, names)


@dataclass(frozen=True)
class _TaskRow:
    """A task as the samples table and a sample's page read it (the columns, by name)."""

    task_id: str
    seq: int
    status: queue.TaskStatus
    input: str  # JSON text
    result: str | None  # JSON text
    error: str | None
    execution_time_ms: int | None
    attempts: int


def batch_samples(tx: Tx, ws: str, batch_id: str, q: SampleQuery) -> Page[SampleRow]:
    if tx.one("SELECT 1 FROM batches WHERE id = ? AND workspace_id = ?", (batch_id, ws)) is None:
        raise NotFound(f"no batch {batch_id}")
    offset, limit = clamp_page(q.offset, q.limit)
    sql = compile_samples(
        sample_columns(tx.dialect),
        q,
        select=queue.columns(_TaskRow, "t."),
        source="tasks t",
        scope=["t.batch_id = ?"],
        scope_args=[batch_id],
    )
    total_row = tx.one(sql.count, sql.count_args)
    total = int(total_row[0]) if total_row else 0
    rows = tx.execute(sql.page, [*sql.page_args, limit, offset])
    items = []
    for t in queue.read_rows(_TaskRow, rows):
        result = json.loads(t.result) if t.result else {}
        usage = result.get("usage") or {}
        score = result.get("score") or {}
        items.append(
            SampleRow(
                sample_id=str(t.task_id),
                seq=int(t.seq),
                status=str(t.status),
                reward=float(score["reward"]) if isinstance(score.get("reward"), int | float) else None,
                metrics=_metrics(result),
                turns=int(result.get("turns") or 0),
                tokens=int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0),
                cost_usd=float(usage.get("cost_usd") or 0.0),
                duration_s=(t.execution_time_ms or 0) / 1000.0,
                error=t.error,
                input_preview=_input_preview(t.input),
                response_preview=_response_preview(result),
            )
        )
    return Page(tuple(items), total, offset, limit)


def batch_sample(tx: Tx, ws: str, batch_id: str, task_id: str) -> Sample:
    """Task `task_id` of the batch as a Sample (its input's context merged into the input)."""
    row = tx.one(
        f"SELECT {queue.columns(_TaskRow, 't.')} FROM tasks t "
        "JOIN batches b ON b.id = t.batch_id WHERE t.batch_id = ? AND t.task_id = ? AND b.workspace_id = ?",
        (batch_id, task_id, ws),
    )
    if row is None:
        raise NotFound(f"no task {task_id} in batch {batch_id}")
    (t,) = queue.read_rows(_TaskRow, [row])
    result = json.loads(t.result) if t.result else {}
    inp = json.loads(t.input)
    traj = result.get("trajectory")
    score = result.get("score")
    return Sample(
        id=str(task_id),
        input={**(inp.get("context") or {}), **{k: v for k, v in inp.items() if k != "context"}},
        trajectory=Trajectory.from_dict(traj) if traj else None,
        score=Score.from_dict(score) if score else None,
        status=_sample_status(t.status),  # type: ignore[arg-type]
        error=t.error,
        stop_reason=result.get("stop_reason"),
        metadata={
            "task_status": t.status,
            "turns": result.get("turns"),
            "usage": result.get("usage"),
            "execution_time_ms": t.execution_time_ms,
            "attempts": t.attempts,
        },
    )


def compare_batches(tx: Tx, ws: str, a: str, b: str, offset: int, limit: int) -> Comparison:
    row_a, row_b = batch_run(tx, ws, a), batch_run(tx, ws, b)
    offset, limit = clamp_page(offset, limit)
    sql = compile_compare(
        sample_columns(tx.dialect, "x"),
        sample_columns(tx.dialect, "y"),
        join="FROM tasks x JOIN tasks y ON y.task_id = x.task_id AND y.batch_id = ? WHERE x.batch_id = ?",
        join_args=[b, a],
    )
    counts = tx.one(sql.counts, sql.args)
    assert counts is not None
    shared = int(counts[0] or 0)
    n_a = tx.one("SELECT COUNT(*) FROM tasks WHERE batch_id = ?", (a,))
    n_b = tx.one("SELECT COUNT(*) FROM tasks WHERE batch_id = ?", (b,))
    rows = tx.execute(sql.rows, [*sql.args, limit, offset])
    items = tuple(
        CompareRow(str(t), float(x) if x is not None else None, float(y) if y is not None else None, str(sa), str(sb))
        for t, x, y, sa, sb in rows
    )
    return Comparison(
        row_a,
        row_b,
        Page(items, shared, offset, limit),
        shared=shared,
        only_a=int(n_a[0] if n_a else 0) - shared,
        only_b=int(n_b[0] if n_b else 0) - shared,
        regressed=int(counts[1] or 0),
        improved=int(counts[2] or 0),
    )


def batches_sharing_tasks(tx: Tx, ws: str, batch_id: str) -> list[str]:
    batch_run(tx, ws, batch_id)  # NotFound for another workspace's batch
    found = []
    for other in batch_runs(tx, ws):
        if other.run_id != batch_id and tx.one(
            "SELECT 1 FROM tasks x JOIN tasks y ON y.task_id = x.task_id AND y.batch_id = ? WHERE x.batch_id = ? LIMIT 1",
            (other.run_id, batch_id),
        ):
            found.append(other.run_id)
    return found


def batch_version(tx: Tx, ws: str, batch_id: str) -> str:
    """A token that changes when a task of the batch starts or finishes, or the batch is cancelled."""
    r = tx.one(
        "SELECT b.cancelled_at, COUNT(t.task_id), SUM(CASE WHEN t.status = 'running' THEN 1 ELSE 0 END), "
        "MAX(t.finished_at) FROM batches b LEFT JOIN tasks t ON t.batch_id = b.id "
        "AND t.status NOT IN ('queued') WHERE b.id = ? AND b.workspace_id = ? GROUP BY b.cancelled_at",
        (batch_id, ws),
    )
    if r is None:
        raise NotFound(f"no batch {batch_id}")
    return ":".join(str(x) for x in r)
