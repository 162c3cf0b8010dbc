"""The worker: claims tasks from the database and runs them, `concurrency` at a time.

    store = await Store.open(url)
    await Worker(store, concurrency=32).run()                   # the API's batches
    await Worker(store, run_task=my_runner, on_recorded=tell).run()   # any tasks of the queue

`run_task(task, deadline)` runs one claimed task and returns its `TaskOutcome` (`deadline`: the
batch deadline on trio's clock); the default, `BatchTasks`, runs the API's batches. The Worker
owns everything else: claiming, leases, recording, stopping. `on_recorded(n)` is called after
each transaction that recorded `n` outcomes; `wake()` says new tasks were queued (a process
that knows, where the database cannot notify).

Any number of workers, on any machines that reach the database, share one queue. A worker
* claims up to its free slots at once (one transaction), under a lease of `lease_s`;
* renews its leases every `lease_s / 3` (one UPDATE for all its tasks) and stops any task it
  no longer holds: cancelled batches, batches past their deadline, leases lost to a pause;
* runs each task with a time limit of `timeout_per_task_ms`, cut to the batch deadline;
* records outcomes idempotently (see rollouts.service.queue.finish), those that finish within
  `record_delay_s` of each other in one transaction (at once when the worker has nothing
  else running) (the slot is free for the next task at
  once; an outcome counts as recorded only once that transaction commits);
* sweeps expired leases back into the queue every `lease_s / 2` (any worker or server may);
* when the queue is empty, waits for a PostgreSQL NOTIFY (new batch, requeued tasks) or, on
  SQLite, for a change of the database files (an os.stat every 20 ms, every 100 ms once idle
  for 2 s: another process committed), with a claim at least every `max_poll_s` (a backoff
  from 20 ms).

A worker killed with SIGKILL loses nothing: its tasks' leases expire and another worker
reruns them. Stopping a worker (cancelling `run`) puts its running tasks straight back.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rollouts.providers import client_scope
from rollouts.service import queue
from rollouts.service.accounts import new_id
from rollouts.service.batch_tasks import BatchTasks
from rollouts.service.execution import TaskOutcome, warm_up
from rollouts.service.queue import ClaimedTask
from rollouts.service.store import Store

__all__ = ["OnRecorded", "TaskRunner", "Worker"]

_log = logging.getLogger("rollouts.service.worker")

TaskRunner = Callable[[ClaimedTask, float], Awaitable[TaskOutcome]]
"""Runs one claimed task: `(task, deadline)` -> its outcome (`deadline`: the batch deadline on
trio's clock). Never raises for a problem of the task; cancellation means the task is not this
worker's any more (or the worker is stopping)."""
OnRecorded = Callable[[int], None]
"""Called after each transaction that recorded outcomes, with their number."""


def _finish_all(tx: Any, batch: list[tuple[ClaimedTask, TaskOutcome]]) -> int:
    """Record outcomes in one statement (each idempotently); how many were recorded."""
    return queue.finish_many(
        tx,
        [queue.Outcome(t.batch_id, t.task_id, o.status, o.result, o.error, o.execution_time_ms) for t, o in batch],
    )


class Worker:
    """Runs tasks from the store's queue (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        run_task: TaskRunner | None = None,
        on_recorded: OnRecorded | None = None,
        concurrency: int = 16,
        worker_id: str | None = None,
        lease_s: float = 30.0,
        max_attempts: int = 3,
        max_poll_s: float = 1.0,
        claim_batch: int = 32,
        record_delay_s: float = 0.05,
        record_batch: int = 256,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.store = store
        self.run_task: TaskRunner = run_task if run_task is not None else BatchTasks(store)
        self.on_recorded = on_recorded
        self.concurrency = concurrency
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{new_id('w')}"
        self.lease_s = lease_s
        self.max_attempts = max_attempts
        self.max_poll_s = max_poll_s
        self.claim_batch = claim_batch
        self.record_delay_s = record_delay_s
        self.record_batch = record_batch
        self.completed = 0  # outcomes this worker recorded
        self._outcomes: list[tuple[ClaimedTask, TaskOutcome]] = []  # finished, not yet written
        self._outcome_ready = trio.Event()
        self._batch_full = trio.Event()
        self._running: dict[tuple[str, str], trio.CancelScope] = {}
        self._unsettled: list[tuple[str, str]] = []
        self._strays: set[tuple[str, str]] = set()  # leased to this worker, not running (see _put_back_strays)
        self._idle = trio.Event()
        self._idle.set()
        self._wake = trio.Event()
        self._drained = False
        self._capped = False  # the last claim left tasks queued for their batch's parallelism
        self._beat_now = trio.Event()

    # ---- the loops ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Work until cancelled (then running tasks are put back in the queue). Started (for
        `nursery.start`) once it is warmed up (see execution.warm_up) and listening."""
        warm_up()
        try:
            async with client_scope(), trio.open_nursery() as nursery:
                nursery.start_soon(self._heartbeat_loop)
                nursery.start_soon(self._sweep_loop)
                nursery.start_soon(self._record_loop)
                if self.store.is_postgres:
                    await nursery.start(self._listen)  # (listening before the first claim: no NOTIFY missed)
                task_status.started()
                await self._claim_loop(nursery)
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self._write_outcomes()  # finished before the stop: recorded, not rerun
                finally:
                    keys = list(self._running) + self._unsettled + [(t.batch_id, t.task_id) for t, _ in self._outcomes]
                    if keys:
                        await self.store.call(queue.release, self.worker_id, keys)

    @property
    def running(self) -> int:
        """Tasks running now."""
        return len(self._running)

    async def wait_idle(self) -> None:
        """Return when no task is running and every finished one is recorded (at once if so)."""
        while self._running or self._outcomes:
            await self._idle.wait()

    def wake(self) -> None:
        """New or requeued tasks (a NOTIFY, a sweep, or a process that queued them): claim at once."""
        self._drained = False
        self._wake.set()

    def _slot_freed(self) -> None:
        """A task ended: claim again, unless the last claim found the queue empty (then new
        work announces itself, or the poll timer finds it)."""
        if not self._drained:
            self._wake.set()

    async def _sleep_until_woken(self, at_most_s: float) -> None:
        with trio.move_on_after(at_most_s):
            await self._wake.wait()
        self._wake = trio.Event()

    async def _sleep_until_changed(self, at_most_s: float, every_s: float = 0.02) -> None:
        """SQLite has no NOTIFY: sleep until woken, until the database files change (another
        process committed: new tasks may be queued; an os.stat of the file and its WAL every
        `every_s`, no query), or `at_most_s`."""
        before = self.store.file_stamp()
        with trio.move_on_after(at_most_s):
            while not self._wake.is_set():
                with trio.move_on_after(every_s):
                    await self._wake.wait()
                if self.store.file_stamp() != before:
                    break
        self._wake = trio.Event()

    async def _claim_loop(self, nursery: trio.Nursery) -> None:
        idle_poll = 0.02
        idle_since: float | None = None  # when the queue was last found empty (None: work since)
        # Claim several tasks per transaction: wait for this many free slots while tasks run.
        # (a quarter of the slots: each claim is a transaction, and workers sharing a machine
        # have few slots each -- claiming every slot or two cost more than the tasks' rows)
        min_claim = max(1, min(self.claim_batch, self.concurrency // 4))
        while True:
            free = self.concurrency - len(self._running)
            if free < (min_claim if self._running else 1):
                await self._sleep_until_woken(self.max_poll_s)
                continue
            want = min(free, self.claim_batch)
            got = await self.store.call(queue.claim_tasks, self.worker_id, want, self.lease_s)
            claimed = got.tasks
            self._capped = got.capped
            self._drained = len(claimed) < want and not got.capped
            if claimed and self._idle.is_set():
                self._idle = trio.Event()
            for task in claimed:
                scope = trio.CancelScope()
                self._running[(task.batch_id, task.task_id)] = scope
                nursery.start_soon(self._run_one, task, scope, trio.current_time())
            if claimed:
                idle_poll = 0.02
                idle_since = None
                if not self._drained:
                    continue
            # the queue is empty: a NOTIFY (PostgreSQL), a sweep or the poll timer wakes us;
            # on SQLite also a commit by any process (the database files change)
            if self.store.is_postgres:
                await self._sleep_until_woken(self.max_poll_s)
            else:
                now = trio.current_time()
                idle_since = now if idle_since is None else idle_since
                # (the files are looked at every 20 ms, every 100 ms once idle for 2 s: an idle
                # worker's wake-ups cost ~25 ms of CPU a second at 20 ms, ~5 at 100 ms)
                await self._sleep_until_changed(idle_poll, 0.02 if now - idle_since < 2.0 else 0.1)
            idle_poll = min(idle_poll * 2, self.max_poll_s)

    async def _record_loop(self) -> None:
        """Write finished outcomes: those that finish within `record_delay_s` of the first, up to
        `record_batch`, in one transaction (what is left when the worker stops is written by `run`)."""
        while True:
            await self._outcome_ready.wait()
            if len(self._outcomes) < self.record_batch:
                with trio.move_on_after(self.record_delay_s):
                    await self._batch_full.wait()
            self._outcome_ready = trio.Event()
            self._batch_full = trio.Event()
            await self._write_outcomes()

    def _outcome(self, task: ClaimedTask, outcome: TaskOutcome) -> None:
        self._outcomes.append((task, outcome))
        self._outcome_ready.set()
        if len(self._outcomes) >= self.record_batch or self._capped or len(self._running) <= 1:
            # (capped: queued tasks wait for a batch's running ones to end in the database;
            # nothing else running: no other outcome is coming soon)
            self._batch_full.set()

    async def _write_outcomes(self) -> None:
        while self._outcomes:
            batch = self._outcomes[: self.record_batch]
            self.completed += await self.store.call(_finish_all, batch)  # (raises: still in _outcomes)
            del self._outcomes[: len(batch)]
            self._slot_freed()  # (a batch at its parallelism has free slots now)
            if self.on_recorded is not None:
                self.on_recorded(len(batch))
        if not self._running:
            self._idle.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            with trio.move_on_after(self.lease_s / 3):
                await self._beat_now.wait()
            self._beat_now = trio.Event()
            before = set(self._running)
            if not before:
                continue
            held = await self.store.call(queue.heartbeat, self.worker_id, self.lease_s)
            for key in before - held:
                scope = self._running.get(key)
                if scope is not None:
                    _log.info("task %s/%s is no longer ours (cancelled, deadline or lease lost): stopping it", *key)
                    scope.cancel()
            await self._put_back_strays(held)

    async def _put_back_strays(self, held: set[tuple[str, str]]) -> None:
        """Tasks leased to this worker that it is not running at two heartbeats in a row (a
        claim that committed while its answer was lost to a database outage) go back to the
        queue; renewed, they would never run. (Two in a row: a claim that commits during a
        heartbeat is running by the next.)"""
        known = set(self._running) | set(self._unsettled) | {(t.batch_id, t.task_id) for t, _ in self._outcomes}
        strays = held - known
        again = strays & self._strays
        self._strays = strays - again
        if again:
            _log.warning("%d tasks leased to this worker were not running on it: putting them back", len(again))
            await self.store.call(queue.release, self.worker_id, sorted(again))

    async def _sweep_loop(self) -> None:
        while True:
            changed = await self.store.call(queue.sweep, self.max_attempts)
            if changed.get("requeued"):
                self.wake()
            await trio.sleep(max(self.lease_s / 2, 0.05))

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Wake the claim loop on new work, and renew leases at once on a cancellation (so the
        cancelled tasks stop now), on NOTIFY (a thread blocks on a dedicated connection).
        Started once it listens: work queued before that is found by the first claim."""

        def react(channel: str, payload: str) -> None:
            if channel == queue.CANCEL_CHANNEL:
                self._beat_now.set()
            else:
                self.wake()

        await self.store.listen((queue.NOTIFY_CHANNEL, queue.CANCEL_CHANNEL), react, task_status=task_status)

    # ---- one task -------------------------------------------------------------------------------

    async def _run_one(self, task: ClaimedTask, scope: trio.CancelScope, claimed_at: float) -> None:
        key = (task.batch_id, task.task_id)
        settled = False  # handed to the record loop, or given up because it is not ours any more
        try:
            with scope:
                outcome = await self.run_task(task, claimed_at + task.deadline_in_s)
            settled = True
            if not scope.cancelled_caught:  # (cancelled: not ours any more, whoever has it records it)
                self._outcome(task, outcome)
        finally:
            self._running.pop(key, None)
            if not settled:
                self._unsettled.append(key)  # the worker is stopping: put it back in the queue
            if not self._running and not self._outcomes:
                self._idle.set()
            self._slot_freed()
