"""Batches and the task queue on the database: the SQL, as functions of one transaction.

Semantics:
* **claim**: a worker takes queued tasks under a lease (`lease_owner`, `lease_expires_at` on the
  database clock). PostgreSQL: `SELECT ... FOR UPDATE OF t SKIP LOCKED`, so workers never wait
  for each other; SQLite: the claim runs in a `BEGIN IMMEDIATE` transaction (the write lock).
  A batch's `parallelism` bounds its running tasks (exactly on SQLite; on PostgreSQL two workers
  claiming at the same instant may each see the same free slots).
* **heartbeat**: extends the leases a worker holds and tells it which tasks it still holds; a
  task no longer held (cancelled, batch deadline, lease lost) is stopped by the worker.
* **finish**: records the result only while the task is queued or running, so a task finished
  twice (a worker thought dead that comes back) is recorded once, and a late result never
  overwrites a cancellation or timeout.
* **sweep**: expired leases go back to the queue (after `max_attempts` the task fails), and the
  tasks of batches past their deadline are marked `timeout`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypeVar

from rollouts.service._db import Tx
from rollouts.service.accounts import new_id

__all__ = [
    "CANCEL_CHANNEL",
    "FINISHED",
    "NOTIFY_CHANNEL",
    "OUTCOMES",
    "PENDING",
    "PROGRESS_CHANNEL",
    "BatchSpec",
    "Claim",
    "ClaimedTask",
    "FinishedTask",
    "Outcome",
    "TaskStatus",
    "batch_finished",
    "batch_spec",
    "batch_status",
    "cancel_batch",
    "claim",
    "claim_tasks",
    "create_batch",
    "create_local_batch",
    "enqueue",
    "finish",
    "finish_many",
    "get_batch",
    "heartbeat",
    "release",
    "requeue_lost",
    "status_in",
    "sweep",
    "take_finished",
]

NOTIFY_CHANNEL = "rollouts_tasks"  # new or requeued tasks
PROGRESS_CHANNEL = "rollouts_progress"  # the batch (the payload) has no task queued or running left
CANCEL_CHANNEL = "rollouts_cancel"  # a batch was cancelled: workers check their leases now
_SWEEP_LOCK = 4242016

TaskStatus = Literal["queued", "running", "completed", "failed", "timeout", "cancelled"]
"""A task row's status: queued -> running -> one of the finished ones (a lost worker's task
goes back to queued)."""
PENDING: Final[tuple[TaskStatus, ...]] = ("queued", "running")  # not finished yet
FINISHED: Final[tuple[TaskStatus, ...]] = ("completed", "failed", "timeout", "cancelled")
OUTCOMES: Final[tuple[TaskStatus, ...]] = ("completed", "failed", "timeout")  # what a worker records


def status_in(statuses: Sequence[TaskStatus]) -> str:
    """`IN ('a', 'b')` for SQL over the status column (the statuses are this module's constants)."""
    assert all(s in _ALL_STATUSES for s in statuses), statuses
    return "IN (" + ", ".join(f"'{s}'" for s in statuses) + ")"


_ALL_STATUSES = frozenset(("queued", "running", *FINISHED))
_PENDING = status_in(PENDING)
_OUTCOMES = status_in(OUTCOMES)

_Row = TypeVar("_Row")


def columns(cls: type[Any], prefix: str = "") -> str:
    """The SELECT list reading a row into the frozen dataclass `cls`: its fields, by name, in order."""
    return ", ".join(f"{prefix}{f.name}" for f in fields(cls))


def read_rows(cls: type[_Row], rows: Sequence[Sequence[Any]]) -> list[_Row]:
    """Rows selected with `columns(cls)` as `cls` instances."""
    return [cls(*row) for row in rows]


@dataclass(frozen=True)
class ClaimedTask:
    batch_id: str
    task_id: str
    input: Mapping[str, Any]
    attempts: int
    deadline_in_s: float  # seconds left before the batch deadline, on the database clock


@dataclass(frozen=True)
class BatchSpec:
    """What a worker needs to run a batch's tasks (immutable once the batch exists)."""

    batch_id: str
    workspace_id: str
    agent_id: str
    agent_version: int
    system_prompt: str
    config: Mapping[str, Any]
    timeout_per_task_ms: int
    endpoint: Mapping[str, Any]
    environment: str | None
    max_turns: int


def create_batch(
    tx: Tx,
    *,
    workspace_id: str,
    agent_id: str,
    agent_version: int,
    system_prompt: str,
    tasks: Sequence[tuple[str, Mapping[str, Any]]],
    config: Mapping[str, Any],
    parallelism: int,
    timeout_per_task_ms: int,
    deadline_s: float,
    idempotency_key: str | None = None,
    request_digest: str | None = None,
) -> tuple[dict[str, Any] | None, bool]:
    """(the batch summary, created). With an `idempotency_key` already used in the workspace,
    the existing batch is returned instead (created False) -- or None when both requests give
    a `request_digest` and they differ (the key was reused for another request)."""
    now = tx.dialect.now
    if idempotency_key is not None:
        existing = _batch_with_key(tx, workspace_id, idempotency_key, request_digest)
        if existing is not None:
            return (_summary(tx, existing) if existing else None), False
    bid = new_id("b")
    # (ON CONFLICT: on PostgreSQL a concurrent request with the same key may have won meanwhile)
    tx.execute(
        f"INSERT INTO batches (id, workspace_id, agent_id, agent_version, system_prompt, config, task_count, "
        f"parallelism, timeout_per_task_ms, idempotency_key, request_digest, deadline_at, created_at) "
        f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {now} + ?, {now}) "
        "ON CONFLICT (workspace_id, idempotency_key) DO NOTHING",
        (
            bid,
            workspace_id,
            agent_id,
            agent_version,
            system_prompt,
            json.dumps(dict(config), sort_keys=True),
            len(tasks),
            parallelism,
            timeout_per_task_ms,
            idempotency_key,
            request_digest,
            float(deadline_s),
        ),
    )
    if tx.rowcount == 0:
        assert idempotency_key is not None
        existing = _batch_with_key(tx, workspace_id, idempotency_key, request_digest)
        assert existing is not None
        return (_summary(tx, existing) if existing else None), False
    queued_at = tx.one(f"SELECT {now}")
    assert queued_at is not None
    if tx.dialect.is_postgres:
        # one statement with arrays, in binary (a statement per task cost the server twice the CPU)
        tx.execute(
            "INSERT INTO tasks (batch_id, task_id, seq, input, status, queued_at) "
            "SELECT ?, t.task_id, t.seq, t.input, 'queued', ? FROM unnest(%b::text[], %b::int[], %b::text[]) AS t(task_id, seq, input)",
            (
                bid,
                queued_at[0],
                [tid for tid, _ in tasks],
                list(range(len(tasks))),
                [json.dumps(dict(inp)) for _, inp in tasks],
            ),
        )
    else:
        tx.many(
            "INSERT INTO tasks (batch_id, task_id, seq, input, status, queued_at) VALUES (?, ?, ?, ?, 'queued', ?)",
            [(bid, tid, n, json.dumps(dict(inp)), queued_at[0]) for n, (tid, inp) in enumerate(tasks)],
        )
    if tx.dialect.is_postgres:
        tx.execute(f"SELECT pg_notify('{NOTIFY_CHANNEL}', ?)", (bid,))
    return _summary(tx, bid), True


def _batch_with_key(tx: Tx, workspace_id: str, key: str, digest: str | None) -> str | None:
    """The id of the workspace's batch with `key`; "" when its request's digest is not `digest`
    (both known); None when there is none."""
    row = tx.one(
        "SELECT id, request_digest FROM batches WHERE workspace_id = ? AND idempotency_key = ?", (workspace_id, key)
    )
    if row is None:
        return None
    if digest is not None and row[1] is not None and row[1] != digest:
        return ""
    return str(row[0])


def _summary(tx: Tx, batch_id: str) -> dict[str, Any]:
    row = tx.one("SELECT id, task_count, created_at FROM batches WHERE id = ?", (batch_id,))
    assert row is not None
    return {"batch_id": row[0], "task_count": int(row[1]), "status": "queued", "created_at": row[2]}


def batch_status(counts: Mapping[str, int], total: int, cancelled: bool) -> str:
    """queued | running | completed | partial | failed | cancelled, from the tasks' statuses."""
    if cancelled:
        return "cancelled"
    pending = sum(counts.get(s, 0) for s in PENDING)
    if pending:
        return "queued" if counts.get("queued", 0) == total else "running"
    done = counts.get("completed", 0)
    if done == total:
        return "completed"
    return "partial" if done else "failed"


@dataclass(frozen=True)
class _TaskResult:
    """A finished task as `get_batch` reports it (the columns, by name)."""

    task_id: str
    status: TaskStatus
    result: str | None
    error: str | None
    execution_time_ms: int | None
    attempts: int
    finished_at: float | None


def get_batch(tx: Tx, workspace_id: str, batch_id: str, offset: int = 0, limit: int = 100) -> dict[str, Any] | None:
    """Status, progress and the finished results among tasks [offset, offset + limit) (in the
    order they were given), or None (unknown, or another workspace's)."""
    row = tx.one(
        "SELECT id, agent_id, agent_version, task_count, cancelled_at, deadline_at, created_at "
        "FROM batches WHERE id = ? AND workspace_id = ?",
        (batch_id, workspace_id),
    )
    if row is None:
        return None
    total = int(row[3])
    counts = {
        str(s): int(n)
        for s, n in tx.execute("SELECT status, COUNT(*) FROM tasks WHERE batch_id = ? GROUP BY status", (batch_id,))
    }
    pending = sum(counts.get(s, 0) for s in PENDING)
    status = batch_status(counts, total, row[4] is not None)
    results = []
    page = tx.execute(
        f"SELECT {columns(_TaskResult)} FROM tasks WHERE batch_id = ? AND seq >= ? AND seq < ? ORDER BY seq",
        (batch_id, offset, offset + limit),
    )
    for t in read_rows(_TaskResult, page):
        if t.status not in FINISHED:
            continue
        data = json.loads(t.result) if t.result else {}
        results.append(
            {
                "task_id": t.task_id,
                "status": t.status,
                "trajectory": data.get("trajectory"),
                "score": data.get("score"),
                "stop_reason": data.get("stop_reason"),
                "error": t.error,
                "execution_time_ms": t.execution_time_ms,
                "attempts": t.attempts,
                "finished_at": t.finished_at,
            }
        )
    completed_at = None
    if not pending:
        last = tx.one("SELECT MAX(finished_at) FROM tasks WHERE batch_id = ?", (batch_id,))
        completed_at = row[4] if row[4] is not None else (last[0] if last else None)
    return {
        "batch_id": row[0],
        "agent_id": row[1],
        "agent_version": row[2],
        "status": status,
        "progress": {
            "total": total,
            "completed": counts.get("completed", 0),
            "failed": counts.get("failed", 0),
            "timeout": counts.get("timeout", 0),
            "cancelled": counts.get("cancelled", 0),
            "pending": pending,
        },
        "results": results,
        "next_offset": offset + limit if offset + limit < total else None,
        "created_at": row[6],
        "deadline_at": row[5],
        "completed_at": completed_at,
    }


def cancel_batch(tx: Tx, workspace_id: str, batch_id: str) -> bool:
    """Cancel what is queued or running (workers stop it at their next heartbeat); False if the
    batch does not exist in this workspace."""
    row = tx.one("SELECT cancelled_at FROM batches WHERE id = ? AND workspace_id = ?", (batch_id, workspace_id))
    if row is None:
        return False
    now = tx.dialect.now
    tx.execute(f"UPDATE batches SET cancelled_at = {now} WHERE id = ? AND cancelled_at IS NULL", (batch_id,))
    tx.execute(
        f"UPDATE tasks SET status = 'cancelled', error = 'the batch was cancelled', finished_at = {now}, "
        f"lease_owner = NULL WHERE batch_id = ? AND status {_PENDING}",
        (batch_id,),
    )
    if tx.dialect.is_postgres:
        tx.execute(f"SELECT pg_notify('{CANCEL_CHANNEL}', ?)", (batch_id,))
    return True


def batch_spec(tx: Tx, batch_id: str) -> BatchSpec | None:
    row = tx.one(
        "SELECT b.id, b.workspace_id, b.agent_id, b.agent_version, b.system_prompt, b.config, b.timeout_per_task_ms, "
        "v.endpoint, v.environment, v.max_turns FROM batches b "
        "JOIN agent_versions v ON v.agent_id = b.agent_id AND v.version = b.agent_version WHERE b.id = ?",
        (batch_id,),
    )
    if row is None:
        return None
    return BatchSpec(
        batch_id=row[0],
        workspace_id=row[1],
        agent_id=row[2],
        agent_version=int(row[3]),
        system_prompt=row[4],
        config=json.loads(row[5]),
        timeout_per_task_ms=int(row[6]),
        endpoint=json.loads(row[7]),
        environment=row[8],
        max_turns=int(row[9]),
    )


def claim(tx: Tx, worker_id: str, limit: int, lease_s: float) -> list[ClaimedTask]:
    """Take up to `limit` queued tasks (oldest first) under a lease of `lease_s` seconds."""
    return claim_tasks(tx, worker_id, limit, lease_s).tasks


@dataclass(frozen=True)
class Claim:
    """What a claim took, and whether queued tasks were left because their batches were at
    their `parallelism` (then a task of those batches ending frees a slot worth claiming)."""

    tasks: list[ClaimedTask]
    capped: bool


def batch_finished(tx: Tx, batch_id: str) -> bool:
    """Whether the batch has nothing queued or running (one probe of an index: cheap enough to
    ask whenever the database changes)."""
    return tx.one(f"SELECT 1 FROM tasks WHERE batch_id = ? AND status {_PENDING} LIMIT 1", (batch_id,)) is None


def claim_tasks(tx: Tx, worker_id: str, limit: int, lease_s: float) -> Claim:
    """`claim`, also saying whether batches at their parallelism still have queued tasks."""
    assert limit > 0 and lease_s > 0
    now = tx.dialect.now
    # batches with queued work and free slots: the live batches (before their deadline), each
    # probed on the index on tasks(batch_id, status, seq) -- not a DISTINCT over every queued task,
    # which made each claim cost as much as the queue is long
    # (a batch whose parallelism is at least its task count can never be at it: its running
    # tasks are not counted -- NULL -- which spared a count of up to `parallelism` rows per claim)
    open_batches = tx.execute(
        f"SELECT b.id, b.parallelism, b.deadline_at - {now}, CASE WHEN b.parallelism >= b.task_count THEN NULL ELSE "
        "(SELECT COUNT(*) FROM tasks r WHERE r.batch_id = b.id AND r.status = 'running') END FROM batches b "
        f"WHERE b.cancelled_at IS NULL AND b.deadline_at > {now} "
        "AND EXISTS (SELECT 1 FROM tasks q WHERE q.batch_id = b.id AND q.status = 'queued') "
        "ORDER BY b.created_at LIMIT 64"
    )
    claimed: list[ClaimedTask] = []
    capped = len(open_batches) == 64  # (more batches may have queued work)
    for bid, parallelism, left_s, running in open_batches:
        if running is None:  # (never at its parallelism)
            want = limit - len(claimed)
        else:
            free = int(parallelism) - int(running)
            want = min(limit - len(claimed), free)
            if want <= 0:
                capped = capped or free <= 0
                continue
        rows = tx.execute(
            # (a materialized CTE: as a plain IN-subquery PostgreSQL may rescan it and take more)
            f"WITH c AS MATERIALIZED (SELECT task_id FROM tasks WHERE batch_id = ? AND status = 'queued' "
            f"ORDER BY seq LIMIT ?{tx.dialect.skip_locked}) "
            f"UPDATE tasks SET status = 'running', lease_owner = ?, lease_expires_at = {now} + ?, "
            f"attempts = attempts + 1, started_at = COALESCE(started_at, {now}) "
            "WHERE batch_id = ? AND task_id IN (SELECT task_id FROM c) RETURNING task_id, input, attempts",
            (bid, want, worker_id, float(lease_s), bid),
        )
        claimed += [ClaimedTask(bid, tid, json.loads(inp), int(att), float(left_s)) for tid, inp, att in rows]
        if running is not None and len(rows) == want and free == want:
            capped = True  # took its last free slots: it may have more queued
        if len(claimed) >= limit:
            break
    return Claim(claimed, capped)


def heartbeat(tx: Tx, worker_id: str, lease_s: float) -> set[tuple[str, str]]:
    """Extend this worker's leases; the (batch_id, task_id) it still holds."""
    rows = tx.execute(
        f"UPDATE tasks SET lease_expires_at = {tx.dialect.now} + ? WHERE lease_owner = ? AND status = 'running' "
        "RETURNING batch_id, task_id",
        (float(lease_s), worker_id),
    )
    return {(str(b), str(t)) for b, t in rows}


def finish(
    tx: Tx,
    batch_id: str,
    task_id: str,
    *,
    status: str,
    result: Mapping[str, Any] | None,
    error: str | None,
    execution_time_ms: int,
) -> bool:
    """Record a task's outcome; False when it was already finished (then nothing changes).

    The result's reward, tokens, turns and cost are also kept in columns of their own, which
    the web UI sorts and filters by (rollouts.service.catalog)."""
    assert status in OUTCOMES, status
    tx.execute(
        f"UPDATE tasks SET status = ?, result = ?, error = ?, execution_time_ms = ?, finished_at = {tx.dialect.now}, "
        "lease_owner = NULL, lease_expires_at = NULL, reward = ?, tokens = ?, turns = ?, cost_usd = ? "
        f"WHERE batch_id = ? AND task_id = ? AND status {_PENDING}",
        (
            status,
            json.dumps(dict(result)) if result is not None else None,
            error,
            int(execution_time_ms),
            *result_figures(result),
            batch_id,
            task_id,
        ),
    )
    recorded = tx.rowcount == 1
    if recorded and tx.dialect.is_postgres:
        _notify_if_done(tx, batch_id)
    return recorded


@dataclass(frozen=True)
class Outcome:
    """A task's outcome, for `finish_many`."""

    batch_id: str
    task_id: str
    status: str
    result: Mapping[str, Any] | None
    error: str | None
    execution_time_ms: int


def finish_many(tx: Tx, outcomes: Sequence[Outcome]) -> int:
    """`finish` for many tasks in one statement (a worker records what finished together);
    how many were recorded (those already finished are left as they are)."""
    if not outcomes:
        return 0
    d = tx.dialect
    cols = "batch_id, task_id, status, result, error, execution_time_ms, reward, tokens, turns, cost_usd"
    rows_in: list[tuple[Any, ...]] = []
    for o in outcomes:
        assert o.status in OUTCOMES, o.status
        result = json.dumps(dict(o.result)) if o.result is not None else None
        rows_in.append(
            (o.batch_id, o.task_id, o.status, result, o.error, int(o.execution_time_ms), *result_figures(o.result))
        )
    params: list[Any]
    if d.is_postgres:
        # the outcomes as arrays: one statement text whatever their number, so the server plans
        # it once per connection (a VALUES list of N rows is a new statement for each N); sent
        # in binary (%b), which costs the worker less than the text form of an array of JSON
        # texts (every quote escaped) and less than a VALUES list's N x 10 parameters
        values = "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::bigint[], %b::float8[], %b::bigint[], %b::int[], %b::float8[])"  # fmt: skip
        params = [list(column) for column in zip(*rows_in, strict=True)]
    else:
        row = (
            f"(CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS {d.bigint}), "
            f"CAST(? AS {d.float_type}), CAST(? AS {d.bigint}), CAST(? AS INTEGER), CAST(? AS {d.float_type}))"
        )
        values = f"VALUES {', '.join([row] * len(outcomes))}"
        params = [value for r in rows_in for value in r]
    rows = tx.execute(
        f"WITH v({cols}) AS ({values}) "
        "UPDATE tasks SET status = v.status, result = v.result, error = v.error, "
        f"execution_time_ms = v.execution_time_ms, finished_at = {d.now}, lease_owner = NULL, lease_expires_at = NULL, "
        "reward = v.reward, tokens = v.tokens, turns = v.turns, cost_usd = v.cost_usd FROM v "
        f"WHERE tasks.batch_id = v.batch_id AND tasks.task_id = v.task_id AND tasks.status {_PENDING} "
        "RETURNING tasks.task_id",
        params,
    )
    if rows and d.is_postgres:
        for batch_id in sorted({o.batch_id for o in outcomes}):
            _notify_if_done(tx, batch_id)
    return len(rows)


def _notify_if_done(tx: Tx, batch_id: str) -> None:
    """NOTIFY PROGRESS_CHANNEL (at commit) when the batch has nothing queued or running left, as
    this transaction sees it: its event streams report `done` at once. (Two workers finishing
    a batch's last tasks at the same instant may each still see the other's: then the
    streams' poll finds it.)"""
    tx.execute(
        f"SELECT pg_notify('{PROGRESS_CHANNEL}', ?) WHERE NOT EXISTS "
        f"(SELECT 1 FROM tasks WHERE batch_id = ? AND status {_PENDING})",
        (batch_id, batch_id),
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def result_figures(result: Mapping[str, Any] | None) -> tuple[float | None, int | None, int | None, float | None]:
    """(reward, tokens, turns, cost_usd) of a task's result (None where it has none)."""
    if not result:
        return None, None, None, None
    score = result.get("score") if isinstance(result.get("score"), Mapping) else {}
    usage = result.get("usage") if isinstance(result.get("usage"), Mapping) else {}
    assert isinstance(score, Mapping) and isinstance(usage, Mapping)
    tokens = [_number(usage.get(k)) for k in ("input_tokens", "output_tokens")]
    turns = _number(result.get("turns"))
    return (
        _number(score.get("reward")),
        int(sum(t for t in tokens if t is not None)) if any(t is not None for t in tokens) else None,
        int(turns) if turns is not None else None,
        _number(usage.get("cost_usd")),
    )


def sweep(tx: Tx, max_attempts: int = 3) -> dict[str, int]:
    """Mark tasks of batches past their deadline `timeout`, fail tasks whose worker was lost
    `max_attempts` times, and put other tasks with expired leases back in the queue."""
    if tx.dialect.is_postgres:
        got = tx.one(f"SELECT pg_try_advisory_xact_lock({_SWEEP_LOCK})")
        if not got or not got[0]:
            return {}  # another process is sweeping right now
    now = tx.dialect.now
    tx.execute(
        f"UPDATE tasks SET status = 'timeout', error = 'the batch deadline passed before the task finished', "
        f"finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL "
        f"WHERE status {_PENDING} AND batch_id IN "
        f"(SELECT id FROM batches WHERE deadline_at <= {now} AND cancelled_at IS NULL)"
    )
    timed_out = tx.rowcount
    tx.execute(
        f"UPDATE tasks SET status = 'failed', error = 'the worker running it stopped (crashed or was killed) ' || attempts || ' times: the task may crash its worker', "
        f"finished_at = {now}, lease_owner = NULL, lease_expires_at = NULL "
        f"WHERE status = 'running' AND lease_expires_at < {now} AND attempts >= ?",
        (max_attempts,),
    )
    failed = tx.rowcount
    tx.execute(
        f"UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL "
        f"WHERE status = 'running' AND lease_expires_at < {now}"
    )
    requeued = tx.rowcount
    if requeued and tx.dialect.is_postgres:
        tx.execute(f"SELECT pg_notify('{NOTIFY_CHANNEL}', 'requeued')")
    return {"timeout": timed_out, "failed": failed, "requeued": requeued}


def release(tx: Tx, worker_id: str, keys: Sequence[tuple[str, str]]) -> None:
    """Put tasks `worker_id` is running back in the queue, this attempt not counted (the worker
    is stopping; its tasks did not fail)."""
    for batch_id, task_id in keys:
        tx.execute(
            "UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, attempts = attempts - 1 "
            "WHERE batch_id = ? AND task_id = ? AND lease_owner = ? AND status = 'running'",
            (batch_id, task_id, worker_id),
        )


def requeue_lost(tx: Tx, worker_id: str, how: str, max_attempts: int) -> None:
    """Put the tasks of a worker known to be dead (its process exited: `how`) back in the queue
    at once, without waiting for their leases; a task whose worker died `max_attempts` times fails."""
    tx.execute(
        f"UPDATE tasks SET status = 'failed', error = 'the worker process running it died ' || attempts || "
        f"' times (last: ' || ? || ')', finished_at = {tx.dialect.now}, lease_owner = NULL, lease_expires_at = NULL "
        "WHERE lease_owner = ? AND status = 'running' AND attempts >= ?",
        (how, worker_id, max_attempts),
    )
    tx.execute(
        "UPDATE tasks SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL "
        "WHERE lease_owner = ? AND status = 'running'",
        (worker_id,),
    )


# ---- local batches: one process's queue (evaluate's worker pool) ------------------------------------

_LOCAL_FAR_S = 10 * 365 * 86400.0  # a local batch has no deadline (each task has its own time limit)


def create_local_batch(tx: Tx, batch_id: str, max_turns: int) -> None:
    """A batch that is not the API's: its own workspace, agent and version (all named
    `batch_id`), no deadline, no parallelism bound; its tasks are added by `enqueue` as they
    come and taken out by `take_finished`."""
    now = tx.dialect.now
    tx.execute(f"INSERT INTO workspaces (id, name, created_at) VALUES (?, ?, {now})", (batch_id, batch_id))
    tx.execute(
        f"INSERT INTO agents (id, workspace_id, name, created_at) VALUES (?, ?, ?, {now})",
        (batch_id, batch_id, batch_id),
    )
    tx.execute(
        f"INSERT INTO agent_versions (agent_id, version, endpoint, max_turns, created_at) VALUES (?, 1, '{{}}', ?, {now})",
        (batch_id, max_turns),
    )
    tx.execute(
        "INSERT INTO batches (id, workspace_id, agent_id, agent_version, system_prompt, config, task_count, "
        f"parallelism, timeout_per_task_ms, deadline_at, created_at) "
        f"VALUES (?, ?, ?, 1, '', '{{}}', 0, ?, ?, {now} + ?, {now})",
        (batch_id, batch_id, batch_id, 2**31 - 1, int(_LOCAL_FAR_S * 1000), _LOCAL_FAR_S),
    )


def enqueue(tx: Tx, batch_id: str, tasks: Sequence[tuple[str, int, str]]) -> None:
    """Add tasks (task_id, seq, input as JSON text) to a local batch."""
    tx.many(
        f"INSERT INTO tasks (batch_id, task_id, seq, input, status, queued_at) VALUES (?, ?, ?, ?, 'queued', {tx.dialect.now})",
        [(batch_id, task_id, seq, input_json) for task_id, seq, input_json in tasks],
    )


@dataclass(frozen=True)
class FinishedTask:
    """A task `take_finished` took out of the queue (its columns, by name)."""

    task_id: str
    status: TaskStatus
    input: str  # JSON text
    result: str | None  # JSON text
    error: str | None


def take_finished(tx: Tx, batch_id: str) -> list[FinishedTask]:
    """The batch's finished tasks, deleted from the queue (so a late duplicate finish of one
    finds nothing, and each is taken once)."""
    rows = tx.execute(
        f"DELETE FROM tasks WHERE batch_id = ? AND status {_OUTCOMES} RETURNING {columns(FinishedTask)}",
        (batch_id,),
    )
    return read_rows(FinishedTask, rows)
