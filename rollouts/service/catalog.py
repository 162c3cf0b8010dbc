"""The viewer's `Catalog` over the service's database: batches as eval runs, GEPA jobs as GEPA runs.

    catalog = ServiceCatalog(store, workspace_id)    # the UI makes one per request (catalog_for)
    page = await catalog.list_samples(batch_id, SampleQuery(sort="reward", descending=True))

Every query is filtered by the catalog's workspace (the one the request's session names):
another workspace's batch or job is `NotFound`, as a missing one.

A batch's tasks are its samples: score (the result's reward), status, turns, tokens, cost and
execution time; filtering, sorting and paging run in SQL on both SQLite and PostgreSQL, compiled
by the viewer's one query compiler (rollouts.view._sql) from `sample_columns`, so a filter gives
the same rows here as in `rollouts view` (JSON fields of the stored result are read with each
dialect's JSON functions). A GEPA job's
candidates, lineage, Pareto front and history come from its checkpoint (the engine's state, kept
in the job row); reflections are not in the checkpoint: they are read from the job's run
directories under `gepa_dir` (the `data_dir` of the server's GEPA jobs: every run of the job on
this server, resumed ones included), so a job run by another server shows none. The service has
no sessions: the sessions list is empty (and the UI has no link to it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import trio

from rollouts.dtypes import Trajectory
from rollouts.eval.sample import Sample, Score
from rollouts.gepa.state import GEPAState
from rollouts.service import queue
from rollouts.service._db import Dialect, Tx
from rollouts.service.store import Store
from rollouts.view.catalog import (
    CompareRow,
    Comparison,
    EvalRunDetail,
    EvalRunRow,
    EvalSetDetail,
    EvalSetRow,
    GepaRunDetail,
    GepaRunRow,
    NotFound,
    Page,
    Reflection,
    SampleQuery,
    SampleRow,
    SessionDetail,
    SessionQuery,
    SessionRow,
    TrainingRunDetail,
    TrainingRunRow,
    clamp_page,
)
from rollouts.view.sql import SampleColumns, compile_compare, compile_samples

__all__ = ["ServiceCatalog", "sample_columns"]

_RUNS_LIMIT = 200  # the runs lists show the newest 200 batches / jobs
_PREVIEW = 160


# ---- SQL over JSON, per dialect ---------------------------------------------------------------------


def _jsonb(col: str) -> str:
    """The JSON text in `col` as jsonb, whatever text it holds: jsonb refuses the escapes `\\u0000`
    and lone surrogates, which a task's input or a model's reply may hold (the text column keeps
    them; here, for filtering and sorting only, they read as U+FFFD)."""
    return f"(regexp_replace({col}, '\\\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{{2}})', '\\\\ufffd', 'g'))::jsonb"


def _num(d: Dialect, col: str, *path: str) -> str:
    """A number inside the JSON text in `col` (NULL when absent)."""
    if d.is_postgres:
        return f"({_jsonb(col)} #>> '{{{','.join(path)}}}')::double precision"
    return f"json_extract({col}, '$.{'.'.join(path)}')"


def _text(d: Dialect, col: str, *path: str) -> str:
    if d.is_postgres:
        return f"({_jsonb(col)} #>> '{{{','.join(path)}}}')"
    return f"CAST(json_extract({col}, '$.{'.'.join(path)}') AS TEXT)"


def _metric(d: Dialect, col: str) -> str:
    """The value of the metric named by the next placeholder, in a result's score."""
    if d.is_postgres:
        return (
            f"(SELECT (m->>'value')::double precision FROM jsonb_array_elements({_jsonb(col)} #> '{{score,metrics}}') m "
            "WHERE m->>'name' = ? LIMIT 1)"
        )
    return (
        f"(SELECT json_extract(m.value, '$.value') FROM json_each({col}, '$.score.metrics') m "
        "WHERE json_extract(m.value, '$.name') = ? LIMIT 1)"
    )


# Reward, tokens, turns and cost are columns written with each result (migration 4); rows
# written before it have NULLs there and are read from the result's JSON (COALESCE evaluates
# the JSON only for those).


def _reward(d: Dialect, t: str = "t") -> str:
    return f"COALESCE({t}.reward, {_num(d, f'{t}.result', 'score', 'reward')})"


def _tokens(d: Dialect, t: str = "t") -> str:
    r = f"{t}.result"
    json_tokens = f"{_num(d, r, 'usage', 'input_tokens')} + COALESCE({_num(d, r, 'usage', 'output_tokens')}, 0)"
    return f"COALESCE({t}.tokens, {json_tokens})"


def _response(d: Dialect, col: str) -> str:
    """The text of the last assistant message of the result in `col` (its text blocks joined)."""
    if d.is_postgres:
        return (
            "(SELECT CASE jsonb_typeof(m.value -> 'content') WHEN 'string' THEN m.value ->> 'content' "
            "WHEN 'array' THEN (SELECT string_agg(b.value ->> 'text', '' ORDER BY b.i) "
            "FROM jsonb_array_elements(m.value -> 'content') WITH ORDINALITY AS b(value, i) "
            "WHERE b.value ->> 'type' = 'text') END "
            f"FROM jsonb_array_elements({_jsonb(col)} #> '{{trajectory,messages}}') WITH ORDINALITY AS m(value, i) "
            "WHERE m.value ->> 'role' = 'assistant' ORDER BY m.i DESC LIMIT 1)"
        )
    return (
        "(SELECT CASE json_type(m.value, '$.content') WHEN 'text' THEN json_extract(m.value, '$.content') "
        "WHEN 'array' THEN (SELECT group_concat(json_extract(b.value, '$.text'), '') "
        "FROM json_each(m.value, '$.content') b WHERE json_extract(b.value, '$.type') = 'text') END "
        f"FROM json_each({col}, '$.trajectory.messages') m "
        "WHERE json_extract(m.value, '$.role') = 'assistant' ORDER BY m.key DESC LIMIT 1)"
    )


def sample_columns(d: Dialect, t: str = "t") -> SampleColumns:
    """Where a sample's fields are in the `tasks` table (alias `t`), for the viewer's one query
    compiler (rollouts.view._sql): a batch's tasks filter and sort as a run's samples do."""
    if d.is_postgres:
        meta = f"({_jsonb(f'{t}.input')} -> 'context' ->> ?)"
    else:
        meta = f"(SELECT CAST(c.value AS TEXT) FROM json_each({t}.input, '$.context') c WHERE c.key = ?)"
    return SampleColumns(
        id=f"{t}.task_id",
        seq=f"{t}.seq",
        status=f"{t}.status",
        reward=_reward(d, t),
        # (a task without a result has 0 of each, as a sample without a trajectory has in files)
        turns=f"COALESCE({t}.turns, {_num(d, f'{t}.result', 'turns')}, 0)",
        tokens=f"COALESCE({_tokens(d, t)}, 0)",
        cost=f"COALESCE({t}.cost_usd, {_num(d, f'{t}.result', 'usage', 'cost_usd')}, 0)",
        time=f"COALESCE({t}.execution_time_ms, 0)",
        metric=_metric(d, f"{t}.result"),
        meta=meta,
        # the input's JSON, its user message decoded (non-ASCII text, quotes), the response
        search=(f"{t}.input", _text(d, f"{t}.input", "user_message"), _response(d, f"{t}.result")),
        groups={"failed": tuple(x for x in queue.FINISHED if x != "completed"), "pending": queue.PENDING},
        postgres=d.is_postgres,
    )


# ---- rows ---------------------------------------------------------------------------------------------


def _run_status(status: str) -> str:
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
        (ws, _RUNS_LIMIT),
    )
    return ":".join(str(x) for x in (r or ()))


def jobs_version(tx: Tx, ws: str) -> str:
    """A token that changes when any GEPA job of `ws` makes progress (or is created)."""
    r = tx.one(
        "SELECT COUNT(*), SUM(metric_calls), SUM(candidates), MAX(created_at), MAX(completed_at), "
        "SUM(CASE WHEN status = 'running' THEN 1 ELSE 0 END), SUM(CASE WHEN status = 'queued' THEN 1 ELSE 0 END) "
        "FROM gepa_jobs WHERE workspace_id = ?",
        (ws,),
    )
    return ":".join(str(x) for x in (r or ()))


def _run_row(r: _BatchRun) -> EvalRunRow:
    done, failed, pending, queued = (int(x or 0) for x in (r.completed, r.failed, r.pending, r.queued))
    counts = {"completed": done, "failed": failed, "queued": queued, "running": pending - queued}
    status = _run_status(queue.batch_status(counts, int(r.task_count), r.cancelled_at is not None))
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


def _runs(tx: Tx, ws: str, batch_id: str | None = None) -> list[EvalRunRow]:
    where, params = ("AND id = ?", [ws, batch_id]) if batch_id is not None else ("", [ws])
    sql = _RUN_SELECT.format(reward=_reward(tx.dialect), where=where)
    return [_run_row(r) for r in queue.read_rows(_BatchRun, tx.execute(sql, [*params, _RUNS_LIMIT]))]


def _run(tx: Tx, ws: str, batch_id: str) -> EvalRunRow:
    rows = _runs(tx, ws, batch_id)
    if not rows:
        raise NotFound(f"no batch {batch_id}")
    return rows[0]


def _eval_run(tx: Tx, ws: str, batch_id: str) -> EvalRunDetail:
    row = _run(tx, ws, batch_id)
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
            f"SELECT AVG({_metric(tx.dialect, 't.result')}) FROM tasks t WHERE t.batch_id = ?", (name, batch_id)
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
    import dataclasses

    return EvalRunDetail(dataclasses.replace(row, metrics=metrics), report, names)


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


def _samples(tx: Tx, ws: str, batch_id: str, q: SampleQuery) -> Page[SampleRow]:
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


def _sample(tx: Tx, ws: str, batch_id: str, task_id: str) -> Sample:
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


def _compare(tx: Tx, ws: str, a: str, b: str, offset: int, limit: int) -> Comparison:
    row_a, row_b = _run(tx, ws, a), _run(tx, ws, b)
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


def _sharing(tx: Tx, ws: str, batch_id: str) -> list[str]:
    _run(tx, ws, batch_id)  # NotFound for another workspace's batch
    found = []
    for other in _runs(tx, ws):
        if other.run_id != batch_id and tx.one(
            "SELECT 1 FROM tasks x JOIN tasks y ON y.task_id = x.task_id AND y.batch_id = ? WHERE x.batch_id = ? LIMIT 1",
            (other.run_id, batch_id),
        ):
            found.append(other.run_id)
    return found


# ---- GEPA jobs ------------------------------------------------------------------------------------------

_JOB_COLS = "j.id, j.agent_id, a.name, j.status, j.metric_calls, j.max_metric_calls, j.best_score, j.candidates"


def _job_row(r: Sequence[Any], iterations: int = 0, best_idx: int = 0, seed_score: float = 0.0) -> GepaRunRow:
    jid, agent_id, agent_name, status, calls, budget, best, candidates = r
    return GepaRunRow(
        run_id=str(jid),
        name=f"{agent_name} ({agent_id})",
        location="GEPA job",
        status=_run_status(str(status)),
        n_candidates=int(candidates or 0),
        best_idx=best_idx,
        best_score=float(best or 0.0),
        seed_score=seed_score,
        metric_calls=int(calls or 0),
        max_metric_calls=int(budget),
        iterations=iterations,
    )


def _jobs(tx: Tx, ws: str) -> list[GepaRunRow]:
    rows = tx.execute(
        f"SELECT {_JOB_COLS} FROM gepa_jobs j JOIN agents a ON a.id = j.agent_id WHERE j.workspace_id = ? "
        "ORDER BY j.created_at DESC, j.id LIMIT ?",
        (ws, _RUNS_LIMIT),
    )
    return [_job_row(r) for r in rows]


def _job(tx: Tx, ws: str, job_id: str) -> GepaRunDetail:
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
    import dataclasses

    row = dataclasses.replace(
        row,
        n_candidates=max(row.n_candidates, len(result.candidates)),
        best_idx=result.best_idx,
        seed_score=result.seed_score,
        iterations=result.iterations,
        metric_calls=max(row.metric_calls, result.metric_calls),
    )
    return GepaRunDetail(row, result.candidates, result.history, result.pareto_front, result.valset_size)


def _version(tx: Tx, ws: str, kind: str, item_id: str) -> str:
    if kind == "eval":
        r = tx.one(
            "SELECT b.cancelled_at, COUNT(t.task_id), SUM(CASE WHEN t.status = 'running' THEN 1 ELSE 0 END), "
            "MAX(t.finished_at) FROM batches b LEFT JOIN tasks t ON t.batch_id = b.id "
            "AND t.status NOT IN ('queued') WHERE b.id = ? AND b.workspace_id = ? GROUP BY b.cancelled_at",
            (item_id, ws),
        )
        if r is None:
            raise NotFound(f"no batch {item_id}")
        return ":".join(str(x) for x in r)
    if kind == "gepa":
        r = tx.one(
            "SELECT status, metric_calls, candidates, best_score, completed_at, LENGTH(COALESCE(checkpoint, '')) "
            "FROM gepa_jobs WHERE id = ? AND workspace_id = ?",
            (item_id, ws),
        )
        if r is None:
            raise NotFound(f"no GEPA job {item_id}")
        return ":".join(str(x) for x in r)
    raise NotFound(f"the service has no {kind} {item_id}")


def _job_reflections(job_dir: Path, iteration: int) -> list[Reflection]:
    """The reflections of `iteration` in every run directory of a job (one per server process
    that ran it: a resumed job continues in a new one), oldest first, each once."""
    from rollouts.gepa.checkpoint import REFLECTIONS_FILE
    from rollouts.view import read_reflections

    try:
        runs = sorted((d for d in job_dir.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    except FileNotFoundError:
        return []
    found: list[Reflection] = []
    for run in runs:
        found += [r for r in read_reflections(run / REFLECTIONS_FILE, iteration) if r not in found]
    return found


class ServiceCatalog:
    """The viewer's `Catalog` over a service `Store`, for one workspace: every query is scoped
    to `workspace_id` (another workspace's batch or job is NotFound, as a missing one). The UI
    makes one per request, for the workspace its session cookie names."""

    def __init__(self, store: Store, workspace_id: str, *, gepa_dir: Path | None = None) -> None:
        if not workspace_id:
            raise ValueError("a ServiceCatalog needs the workspace it reads")
        self.store = store
        self.workspace_id = workspace_id
        self.gepa_dir = gepa_dir  # where this server's GEPA jobs keep their run directories

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]:
        offset, limit = clamp_page(query.offset, query.limit)
        return Page((), 0, offset, limit)

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail:
        raise NotFound(f"the service has no session {session_id}")

    async def list_eval_runs(self) -> Sequence[EvalRunRow]:
        return await self.store.read(_runs, self.workspace_id)

    async def get_eval_run(self, run_id: str) -> EvalRunDetail:
        return await self.store.read(_eval_run, self.workspace_id, run_id)

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]:
        return await self.store.read(_samples, self.workspace_id, run_id, query)

    async def get_sample(self, run_id: str, sample_id: str) -> Sample:
        return await self.store.read(_sample, self.workspace_id, run_id, sample_id)

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison:
        return await self.store.read(_compare, self.workspace_id, run_a, run_b, offset, limit)

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        return await self.store.read(_sharing, self.workspace_id, run_id)

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        return ()  # (eval sets are directories of `rollouts eval-set`; the service keeps batches)

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        raise NotFound(f"the service has no eval set {set_id}")

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        return ()  # (training runs are directories of `rollouts train`)

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        raise NotFound(f"the service has no training run {run_id}")

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]:
        return await self.store.read(_jobs, self.workspace_id)

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail:
        return await self.store.read(_job, self.workspace_id, run_id)

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]:
        await self.get_gepa_run(run_id)  # NotFound for another workspace's job
        if self.gepa_dir is None:
            return ()
        assert "/" not in run_id and not run_id.startswith("."), run_id  # (a job id of this workspace)
        return await trio.to_thread.run_sync(_job_reflections, self.gepa_dir / run_id, iteration)

    async def runs_version(self) -> str:
        """Changes when any batch in the batches list changes (see `runs_version`)."""
        return await self.store.read(runs_version, self.workspace_id)

    async def jobs_version(self) -> str:
        """Changes when any GEPA job of the workspace changes."""
        return await self.store.read(jobs_version, self.workspace_id)

    async def version(self, kind: Literal["session", "eval", "gepa", "training"], item_id: str) -> str:
        return await self.store.read(_version, self.workspace_id, kind, item_id)
