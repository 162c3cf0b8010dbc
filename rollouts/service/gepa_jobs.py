"""GEPA jobs: started through the API, run by the server with the same engine as `optimize()`.

`POST /v1/agents/{id}/gepa` stores a job; `GEPAJobs.run()` (in every `rollouts service serve`)
claims jobs under a lease and runs each with `optimize(adapter=ServiceAdapter(...))`, whose
evaluations are batches on the store executed by the workers and scored there with the job's
score function. Progress (metric calls, best score, candidates) is written to the job as the
run goes, and the engine's checkpoint after every iteration. A server restarted mid-job takes
the job back when its lease expires and resumes from the checkpoint; the evaluations it repeats
find their batches again by idempotency key, so no rollout is paid for twice. On completion the
best prompt becomes a new agent version (`source: "gepa"`, parent: the version the job started
from), promoted if the request asked for it.

The reflection model, like an agent's endpoint, may use only what the operator's policy
allows (rollouts.service.policy): its key comes from a credential the operator configured,
read from the server's environment, and is sent only to that credential's addresses.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import trio

from rollouts.errors import RolloutsError
from rollouts.gepa.checkpoint import STATE_FILE
from rollouts.gepa.events import GEPAEvent
from rollouts.gepa.optimize import optimize
from rollouts.service import accounts, jobs, queue
from rollouts.service.accounts import VersionSpec, new_id
from rollouts.service.execution import default_task_timeout_ms
from rollouts.service.gepa_adapter import ServiceAdapter
from rollouts.service.policy import ServicePolicy
from rollouts.service.progress import BatchChanges
from rollouts.service.requests import (
    boolean,
    integer,
    not_found,
    number,
    parse_endpoint,
    parse_score,
    parse_tasks,
    string,
)
from rollouts.service.store import Store

__all__ = ["GEPAJobs"]

_log = logging.getLogger("rollouts.service.gepa_jobs")


def _describe(e: BaseException) -> str:
    """`Type: message` of the error, or of each error inside (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(_describe(x) for x in e.exceptions if not isinstance(x, trio.Cancelled))
    return f"{type(e).__name__}: {e}"


async def start_job(
    store: Store, ws: str, agent_id: str, body: dict[str, Any], max_tasks: int, policy: ServicePolicy | None = None
) -> dict[str, Any]:
    """Check a job request (`POST /v1/agents/{id}/gepa`'s body) and store the job, queued."""
    trainset = parse_tasks(body, "trainset", max_tasks, ids_required=False)
    valset = parse_tasks(body, "valset", max_tasks, ids_required=False) if body.get("valset") is not None else None
    score = parse_score(body, required=True, policy=policy)
    budget = integer(body, "max_metric_calls", required=True, minimum=1, maximum=10_000_000)
    reflection = parse_endpoint(body, "reflection_model", policy=policy)
    cfg = {
        "trainset": [{"task_id": t, **inp} for t, inp in trainset],
        "valset": [{"task_id": t, **inp} for t, inp in valset] if valset else None,
        "score": score,
        "max_metric_calls": budget,
        "parallelism": integer(body, "parallelism", minimum=1, maximum=100_000) or 5,
        "poll_timeout_s": number(body, "poll_timeout_s", minimum=0.001, maximum=7 * 24 * 3600.0) or 600.0,
        "timeout_per_task_ms": integer(body, "timeout_per_task_ms", minimum=1, maximum=86_400_000),
        "score_threshold": number(body, "score_threshold"),
        "reflection_model": reflection,
        "seed_prompt": string(body, "seed_prompt", max_len=200_000),
        "minibatch_size": integer(body, "minibatch_size", minimum=1, maximum=1000),
        "seed": integer(body, "seed", minimum=0),
    }
    promote = boolean(body, "promote") or False
    version = await store.read(accounts.get_version, ws, agent_id, integer(body, "agent_version", minimum=1))
    if version is None:
        raise not_found("agent (or agent version)", "agent_id")
    if cfg["timeout_per_task_ms"] is None:  # (what the agent's model needs: a local model is slow)
        cfg["timeout_per_task_ms"] = default_task_timeout_ms(version["endpoint"])
    return await store.call(jobs.create_job, ws, agent_id, version["version"], cfg, int(budget or 0), promote)


def _cancel_batches(tx: Any, ws: str, job_id: str) -> None:
    """Cancel the job's evaluation batches still running (the job ended without them)."""
    for batch_id in jobs._job_batches(tx, ws, job_id, " AND cancelled_at IS NULL"):
        queue.cancel_batch(tx, ws, batch_id)


class GEPAJobs:
    """Claims and runs GEPA jobs (see the module docstring); also serves the job routes."""

    def __init__(
        self,
        store: Store,
        *,
        data_dir: str | None = None,
        lease_s: float = 30.0,
        max_jobs: int = 2,
        poll_s: float = 1.0,
        policy: ServicePolicy | None = None,
        changes: BatchChanges | None = None,
    ) -> None:
        self.store = store
        self.changes = changes  # (running) wakes the jobs waiting on their batches
        self.policy = policy or ServicePolicy()
        self.data_dir = Path(data_dir or os.path.join(tempfile.gettempdir(), "rollouts-gepa-jobs"))
        self.lease_s = lease_s
        self.max_jobs = max_jobs
        self.poll_s = poll_s
        self.owner = f"{socket.gethostname()}-{os.getpid()}-{new_id('srv')}"
        self._wake = trio.Event()
        self._running = 0
        self._job_ids: set[str] = set()  # the jobs this runner is running

    def wake(self) -> None:
        """Look for new jobs now (a job was just stored)."""
        self._wake.set()

    # ---- the runner -----------------------------------------------------------------------------

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                await self.store.call(jobs.settle_cancelled)  # (jobs asked to stop whose server is gone)
                if self._running < self.max_jobs:
                    job = await self.store.call(jobs.claim_job, self.owner, self.lease_s, sorted(self._job_ids))
                    if job is not None:
                        self._running += 1
                        self._job_ids.add(job["job_id"])
                        nursery.start_soon(self._run_job, job)
                        continue
                with trio.move_on_after(self.poll_s):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _run_job(self, job: dict[str, Any]) -> None:
        try:
            await self._execute(job)
        except Exception as e:
            error = _describe(e)
            _log.error("GEPA job %s failed: %s", job["job_id"], error)
            with trio.CancelScope(shield=True):
                await self.store.call(jobs.finish_job, job["job_id"], self.owner, status="failed", error=error)
                await self.store.call(_cancel_batches, job["workspace_id"], job["job_id"])
        finally:
            self._running -= 1
            self._job_ids.discard(job["job_id"])
            self._wake.set()

    async def _keep_lease(self, job_id: str, scope: trio.CancelScope, cancelled: list[bool]) -> None:
        while True:
            await trio.sleep(self.lease_s / 3)
            state = await self.store.call(jobs.renew_job, self.owner, job_id, self.lease_s)
            if state != "ok":
                cancelled.append(state == "cancel")
                scope.cancel()
                return

    async def _batch_runner(self, job: dict[str, Any], scope: trio.CancelScope, cancelled: list[bool]) -> Any:
        """The adapter's `run_batch`: a batch on the store, waited for. A job asked to stop
        starts no batch and takes no cancelled batch's results (it stops at once: `scope`)."""
        cfg = job["config"]
        ws, agent_id, version = job["workspace_id"], job["agent_id"], job["base_version"]
        poll_timeout = float(cfg.get("poll_timeout_s", 600.0))

        async def stop_if_cancelled() -> None:
            row = await self.store.read(
                lambda tx: tx.one("SELECT cancel_requested FROM gepa_jobs WHERE id = ?", (job["job_id"],))
            )
            if row is not None and row[0]:
                cancelled.append(True)
                scope.cancel()
                await trio.lowlevel.checkpoint()  # (raises Cancelled: run_batch runs inside `scope`)

        async def run_batch(tasks: list[dict[str, Any]], system_prompt: str, key: str) -> list[dict[str, Any] | None]:
            await stop_if_cancelled()
            summary, _ = await self.store.call(
                queue.create_batch,
                workspace_id=ws,
                agent_id=agent_id,
                agent_version=version,
                system_prompt=system_prompt,
                tasks=[(t["task_id"], {k: v for k, v in t.items() if k != "task_id"}) for t in tasks],
                config={"score": cfg["score"], "parallelism": cfg["parallelism"], "gepa_job": job["job_id"]},
                parallelism=int(cfg["parallelism"]),
                timeout_per_task_ms=int(cfg["timeout_per_task_ms"]),
                deadline_s=poll_timeout,
                idempotency_key=key,
            )
            assert summary is not None  # (no request digest: a key is never refused)
            bid = summary["batch_id"]
            await self._wait_finished(bid)
            state = await self.store.read(queue.get_batch, ws, bid, 0, len(tasks))
            assert state is not None and state["progress"]["pending"] == 0
            if state["status"] == "cancelled":
                await stop_if_cancelled()
            by_id = {r["task_id"]: r for r in state["results"]}
            return [by_id.get(t["task_id"]) for t in tasks]

        return run_batch

    async def _wait_finished(self, batch_id: str) -> None:
        """Return once the batch has nothing queued or running. With `changes`, woken when the
        database says the batch changed (PostgreSQL: a worker's NOTIFY as it ends; SQLite: a
        commit), each time asking with one index probe (queue.batch_finished), and at least every
        `poll_s` (a NOTIFY two workers' last results can miss); without, probing at a backoff
        from 20 ms to 0.5 s."""
        delay = 0.02
        while True:
            seen = self.changes.version(batch_id) if self.changes is not None else 0
            if await self.store.read(queue.batch_finished, batch_id):
                return
            if self.changes is not None:
                await self.changes.wait(batch_id, seen, self.poll_s)
            else:
                await trio.sleep(delay)
                delay = min(delay * 2, 0.5)

    async def _execute(self, job: dict[str, Any]) -> None:
        job_id, cfg = job["job_id"], job["config"]
        ws, agent_id = job["workspace_id"], job["agent_id"]
        base = await self.store.read(accounts.get_version, ws, agent_id, job["base_version"])
        if base is None:
            raise RolloutsError(f"agent {agent_id} version {job['base_version']} no longer exists")
        # One run directory per server process: two servers never write the same files (one
        # whose lease lapsed may still be running until its next renewal tells it to stop).
        # A resumed job starts from the checkpoint in the database.
        run_dir = self.data_dir / job_id / self.owner
        run_dir.mkdir(parents=True, exist_ok=True)
        if job["checkpoint"]:
            (run_dir / STATE_FILE).write_text(job["checkpoint"], encoding="utf-8")
        reflection = self.policy.endpoint(cfg["reflection_model"])
        cancelled: list[bool] = []
        scope = trio.CancelScope()
        runner = await self._batch_runner(job, scope, cancelled)
        adapter = ServiceAdapter(runner, key_prefix=jobs.batch_key_prefix(job_id))

        async def on_event(event: GEPAEvent) -> None:
            if event.kind not in ("seed_evaluated", "iteration_end", "new_best", "checkpoint"):
                return
            checkpoint = None
            if event.kind == "checkpoint":
                checkpoint = await trio.Path(run_dir / STATE_FILE).read_text(encoding="utf-8")
            await self.store.call(
                jobs.save_progress,
                job_id,
                self.owner,
                metric_calls=event.metric_calls,
                best_score=event.best_score,
                candidates=event.candidates,
                checkpoint=checkpoint,
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_lease, job_id, scope, cancelled)
            result = await optimize(
                cfg.get("seed_prompt") if cfg.get("seed_prompt") is not None else base["system_prompt"],
                cfg["trainset"],
                cfg.get("valset") or cfg["trainset"],
                adapter=adapter,
                reflection_endpoint=reflection,
                max_metric_calls=int(cfg["max_metric_calls"]),
                reflection_minibatch_size=cfg.get("minibatch_size"),
                seed=cfg.get("seed"),
                score_threshold=cfg.get("score_threshold"),
                run_dir=run_dir,
                callbacks=[on_event],
                cancel_scope=scope,
            )
            nursery.cancel_scope.cancel()
        if cancelled and not cancelled[0]:
            return  # the lease was lost: another server has the job now
        await self._finish(job, base, result, cancelled=bool(cancelled))

    async def _finish(self, job: dict[str, Any], base: dict[str, Any], result: Any, *, cancelled: bool) -> None:
        """Record how the job ended: cancelled; failed when the reflection model failed on
        every call; completed with a new version, or with none when nothing beat the seed
        (said in `message`, as are the tasks that timed out)."""
        job_id, cfg = job["job_id"], job["config"]
        ws, agent_id = job["workspace_id"], job["agent_id"]
        best = result.best_candidate.get("system_prompt", "")
        lineage = [
            {"idx": c.idx, "parents": list(c.parents), "origin": c.origin, "val_score": c.val_score}
            for c in result.candidates
        ]
        timed_out = await self.store.read(jobs.timeouts, ws, job_id)
        notes = []
        if timed_out:
            notes.append(
                f"{timed_out} evaluated tasks timed out (timeout_per_task_ms={cfg['timeout_per_task_ms']}) and scored 0: "
                "give the job a longer timeout_per_task_ms if the model needs more time"
            )
        common: dict[str, Any] = {
            "lineage": lineage,
            "metric_calls": result.metric_calls,
            "best_score": result.best.val_score,
            "best_prompt": best,
            "candidates": len(result.candidates),
        }

        async def finish(**how: Any) -> None:
            await self.store.call(jobs.finish_job, job_id, self.owner, **how)

        if cancelled:
            await finish(status="cancelled", message="; ".join(notes) or None, **common)
            return
        failed = [h for h in result.history if h.outcome == "reflection_failed"]
        if failed and len(failed) == len(result.history) and result.best_idx == 0:
            error = f"the reflection model failed on every call ({len(failed)}): {failed[-1].message}"
            await finish(status="failed", error=error, message="; ".join(notes) or None, **common)
            return
        if result.best_idx == 0:
            notes.insert(
                0,
                f"no candidate beat the seed prompt (its score {result.seed_score:g} is the best of "
                f"{len(result.candidates)} candidates): no version was created",
            )
            await finish(status="completed", message="; ".join(notes), **common)
            return
        spec = VersionSpec(
            endpoint=base["endpoint"],
            environment=base["environment"],
            system_prompt=best,
            max_turns=base["max_turns"],
            tags=(*base["tags"], f"gepa:{job_id}"),
        )
        version = await self.store.call(
            accounts.add_version, ws, agent_id, spec, source="gepa", parent_version=base["version"]
        )
        assert version is not None
        if job["promote"]:
            await self.store.call(accounts.promote_version, ws, agent_id, version["version"])
        await finish(status="completed", created_version=version["version"], message="; ".join(notes) or None, **common)

    async def start(self, ws: str, agent_id: str, body: dict[str, Any], max_tasks: int) -> dict[str, Any]:
        """Store a job from a request body (the API's JSON, or the UI's form) and wake the runner.
        Raises ApiError naming the field for bad input, 404 for an unknown agent or version."""
        job = await start_job(self.store, ws, agent_id, body, max_tasks, self.policy)
        self._wake.set()
        return job
