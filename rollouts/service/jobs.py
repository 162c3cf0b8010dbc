"""GEPA jobs in the database: the SQL, as functions of one transaction.

A job is run by one server at a time, under a lease like a task's; a server that dies leaves
the lease to expire and another (or the same, restarted) takes the job over and resumes it
from its checkpoint (the engine state, kept in the `checkpoint` column).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rollouts.service import queue
from rollouts.service._db import Tx
from rollouts.service.accounts import new_id

__all__ = [
    "batch_key_prefix",
    "cancel_job",
    "claim_job",
    "create_job",
    "finish_job",
    "get_job",
    "renew_job",
    "save_progress",
    "settle_cancelled",
    "timeouts",
]

_COLS = (
    "id, agent_id, base_version, status, metric_calls, max_metric_calls, best_score, best_prompt, candidates, "
    "lineage, created_version, error, message, created_at, completed_at"
)


def _job(row: Sequence[Any]) -> dict[str, Any]:
    keys = [c.strip() for c in _COLS.split(",")]
    d = dict(zip(keys, row, strict=True))
    d["job_id"] = d.pop("id")
    d["lineage"] = json.loads(d["lineage"]) if d["lineage"] else []
    return d


def create_job(
    tx: Tx, workspace_id: str, agent_id: str, base_version: int, config: Mapping[str, Any], max_metric_calls: int,
    promote: bool,
) -> dict[str, Any]:  # fmt: skip
    jid = new_id("job")
    tx.execute(
        f"INSERT INTO gepa_jobs (id, workspace_id, agent_id, base_version, config, status, max_metric_calls, promote, "
        f"created_at) VALUES (?, ?, ?, ?, ?, 'queued', ?, ?, {tx.dialect.now})",
        (jid, workspace_id, agent_id, base_version, json.dumps(dict(config)), max_metric_calls, int(promote)),
    )
    job = get_job(tx, workspace_id, jid)
    assert job is not None
    return job


def batch_key_prefix(job_id: str) -> str:
    """The idempotency keys of a job's evaluation batches start with this."""
    return f"gepa:{job_id}"


def _job_batches(tx: Tx, workspace_id: str, job_id: str, where: str = "") -> list[str]:
    """The ids of the job's evaluation batches (their keys start with its prefix: a range of the
    (workspace_id, idempotency_key) index)."""
    prefix = batch_key_prefix(job_id) + ":"
    rows = tx.execute(
        f"SELECT id FROM batches WHERE workspace_id = ? AND idempotency_key >= ? AND idempotency_key < ?{where}",
        (workspace_id, prefix, prefix[:-1] + ";"),
    )
    return [str(r[0]) for r in rows]


def timeouts(tx: Tx, workspace_id: str, job_id: str) -> int:
    """How many of the job's evaluated tasks timed out (each scored 0)."""
    ids = _job_batches(tx, workspace_id, job_id)
    if not ids:
        return 0
    marks = ", ".join("?" * len(ids))
    row = tx.one(f"SELECT COUNT(*) FROM tasks WHERE batch_id IN ({marks}) AND status = 'timeout'", ids)
    return int(row[0]) if row is not None else 0


def get_job(tx: Tx, workspace_id: str, job_id: str) -> dict[str, Any] | None:
    row = tx.one(f"SELECT {_COLS} FROM gepa_jobs WHERE id = ? AND workspace_id = ?", (job_id, workspace_id))
    if row is None:
        return None
    job = _job(row)
    job["timeouts"] = timeouts(tx, workspace_id, job_id)
    return job


def cancel_job(tx: Tx, workspace_id: str, job_id: str) -> bool:
    """Stop the job: a queued one, or a running one whose server is gone (its lease expired),
    is cancelled at once; a running one is asked to stop (its server does at its next lease
    renewal). Its evaluation batches are cancelled too. False if unknown."""
    now = tx.dialect.now
    tx.execute("UPDATE gepa_jobs SET cancel_requested = 1 WHERE id = ? AND workspace_id = ?", (job_id, workspace_id))
    if tx.rowcount != 1:
        return False
    tx.execute(
        f"UPDATE gepa_jobs SET status = 'cancelled', completed_at = {now}, lease_owner = NULL, "
        f"lease_expires_at = NULL WHERE id = ? AND (status = 'queued' OR (status = 'running' AND "
        f"(lease_expires_at IS NULL OR lease_expires_at < {now})))",
        (job_id,),
    )
    for batch_id in _job_batches(tx, workspace_id, job_id, " AND cancelled_at IS NULL"):
        queue.cancel_batch(tx, workspace_id, batch_id)
    return True


def settle_cancelled(tx: Tx) -> int:
    """Cancel the jobs asked to stop whose server is gone (the lease expired): nobody else
    claims them. How many."""
    now = tx.dialect.now
    tx.execute(
        f"UPDATE gepa_jobs SET status = 'cancelled', completed_at = {now}, lease_owner = NULL, "
        f"lease_expires_at = NULL WHERE status = 'running' AND cancel_requested = 1 AND lease_expires_at < {now}"
    )
    return tx.rowcount


def claim_job(tx: Tx, owner: str, lease_s: float, running: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Take the oldest job that is queued, or running with an expired lease (its server died).
    Never one `owner` runs itself, even if its renewal came late: with `running` (the ids of the
    jobs it runs), none of those; without, none leased to `owner`. (`running` lets a server take
    back a job leased to it that it is not running: a claim whose answer a database outage lost.)"""
    now = tx.dialect.now
    if running is None:
        mine, params = "AND (lease_owner IS NULL OR lease_owner <> ?) ", [owner]
    else:
        mine = f"AND id NOT IN ({', '.join('?' * len(running))}) " if running else ""
        params = list(running)
    row = tx.one(
        f"SELECT id FROM gepa_jobs WHERE status IN ('queued', 'running') AND cancel_requested = 0 "
        f"AND (lease_expires_at IS NULL OR lease_expires_at < {now}) "
        f"{mine}ORDER BY created_at LIMIT 1{tx.dialect.skip_locked}",
        params,
    )
    if row is None:
        return None
    tx.execute(
        f"UPDATE gepa_jobs SET status = 'running', lease_owner = ?, lease_expires_at = {now} + ? WHERE id = ?",
        (owner, float(lease_s), row[0]),
    )
    full = tx.one(
        "SELECT id, workspace_id, agent_id, base_version, config, checkpoint, promote FROM gepa_jobs WHERE id = ?",
        (row[0],),
    )
    assert full is not None
    return {
        "job_id": full[0],
        "workspace_id": full[1],
        "agent_id": full[2],
        "base_version": int(full[3]),
        "config": json.loads(full[4]),
        "checkpoint": full[5],
        "promote": bool(full[6]),
    }


def renew_job(tx: Tx, owner: str, job_id: str, lease_s: float) -> str:
    """Extend the lease: "ok", "cancel" (cancellation asked for) or "lost" (not ours any more)."""
    tx.execute(
        f"UPDATE gepa_jobs SET lease_expires_at = {tx.dialect.now} + ? WHERE id = ? AND lease_owner = ? "
        "AND status = 'running'",
        (float(lease_s), job_id, owner),
    )
    if tx.rowcount != 1:
        return "lost"
    row = tx.one("SELECT cancel_requested FROM gepa_jobs WHERE id = ?", (job_id,))
    return "cancel" if row is not None and row[0] else "ok"


def save_progress(
    tx: Tx, job_id: str, owner: str, *, metric_calls: int, best_score: float, candidates: int,
    checkpoint: str | None = None,
) -> None:  # fmt: skip
    sets = "metric_calls = ?, best_score = ?, candidates = ?"
    params: list[Any] = [metric_calls, best_score, candidates]
    if checkpoint is not None:
        sets += ", checkpoint = ?"
        params.append(checkpoint)
    tx.execute(f"UPDATE gepa_jobs SET {sets} WHERE id = ? AND lease_owner = ?", (*params, job_id, owner))


def finish_job(
    tx: Tx, job_id: str, owner: str, *, status: str, error: str | None = None, created_version: int | None = None,
    lineage: Sequence[Mapping[str, Any]] | None = None, metric_calls: int | None = None,
    best_score: float | None = None, best_prompt: str | None = None, candidates: int | None = None,
    message: str | None = None,
) -> None:  # fmt: skip
    assert status in ("completed", "failed", "cancelled")
    tx.execute(
        f"UPDATE gepa_jobs SET status = ?, error = ?, message = ?, created_version = ?, lineage = ?, "
        f"metric_calls = COALESCE(?, metric_calls), best_score = COALESCE(?, best_score), "
        f"best_prompt = COALESCE(?, best_prompt), candidates = COALESCE(?, candidates), "
        f"completed_at = {tx.dialect.now}, lease_owner = NULL, lease_expires_at = NULL "
        "WHERE id = ? AND lease_owner = ?",
        (
            status,
            error,
            message,
            created_version,
            json.dumps(list(lineage or [])),
            metric_calls,
            best_score,
            best_prompt,
            candidates,
            job_id,
            owner,
        ),
    )
