"""When a batch's progress may have changed, for the API's event streams (no busy polling).

On PostgreSQL, a worker NOTIFYs `queue.PROGRESS_CHANNEL` with the batch id when the outcomes
it records leave the batch with nothing queued or running, and a cancellation NOTIFYs
`queue.CANCEL_CHANNEL`; `BatchChanges.run` LISTENs to both on a dedicated connection (a thread
blocked in the driver) and wakes the streams waiting on that batch, which report `done` at once
instead of at their next poll (progress in between is polled, a few times a second): a change
is `precise` (that batch ended). On SQLite there is no notification between processes:
`BatchChanges.run` watches the database files while a stream waits (an os.stat every 20 ms,
no query) and wakes every waiting stream when another process commits; such a change is not
precise (something was written), so a stream checks cheaply whether its batch has ended
(`queue.batch_finished`: one index probe) before it polls. A small batch is reported done
within ~20-70 ms of its last result either way, not at the next poll (0.25 s).

    changes = BatchChanges(store)
    await nursery.start(changes.run)
    seen = changes.version(batch_id)
    ...                                            # look at the batch
    await changes.wait(batch_id, seen, 0.25)       # a change since, or the timeout
"""

from __future__ import annotations

from collections import OrderedDict

import trio

from rollouts.service import queue
from rollouts.service.store import Store

__all__ = ["BatchChanges"]


class BatchChanges:
    """Wakes whoever waits on a batch when the database says it changed (see the module docstring)."""

    def __init__(self, store: Store, remember: int = 4096, watch_every_s: float = 0.02) -> None:
        self.store = store
        self._waiting: dict[str, trio.Event] = {}
        self._waiters: dict[str, int] = {}  # streams waiting, per batch
        self._versions: OrderedDict[str, int] = OrderedDict()  # changes seen, of the last `remember` batches
        self._remember = remember
        self._watch_every_s = watch_every_s
        self._someone_waits = trio.Event()

    @property
    def precise(self) -> bool:
        """Whether a change means the batch ended or was cancelled (PostgreSQL's notifications),
        rather than that the database changed (SQLite's files)."""
        return self.store.is_postgres

    def version(self, batch_id: str) -> int:
        """How many changes of `batch_id` were notified (to pass to `wait`, read before looking)."""
        return self._versions.get(batch_id, 0)

    async def wait(self, batch_id: str, seen: int, timeout_s: float) -> None:
        """Return when `batch_id` has changed since `version` was `seen` (at once if it has
        already), or after `timeout_s`."""
        if self.version(batch_id) != seen:
            return
        event = self._waiting.get(batch_id)
        if event is None:
            event = self._waiting[batch_id] = trio.Event()
            self._someone_waits.set()
        self._waiters[batch_id] = self._waiters.get(batch_id, 0) + 1
        try:
            with trio.move_on_after(timeout_s):
                await event.wait()
        finally:
            left = self._waiters.pop(batch_id) - 1
            if left:
                self._waiters[batch_id] = left
            elif self._waiting.get(batch_id) is event:
                del self._waiting[batch_id]  # (timed out, nobody else waits: not watched for)

    def _changed(self, batch_id: str) -> None:
        self._versions[batch_id] = self._versions.pop(batch_id, 0) + 1
        if len(self._versions) > self._remember:
            self._versions.popitem(last=False)
        event = self._waiting.pop(batch_id, None)
        if event is not None:
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen (PostgreSQL) or watch the database files (SQLite) until cancelled; started
        once listening."""
        if not self.store.is_postgres:
            task_status.started()
            await self._watch_files()
            return
        await self.store.listen(
            (queue.PROGRESS_CHANNEL, queue.CANCEL_CHANNEL),
            lambda channel, batch_id: self._changed(batch_id),
            task_status=task_status,
        )

    async def _watch_files(self) -> None:
        """SQLite: while a stream waits, wake every waiting stream when the files have changed
        since the last look (kept between waits, so a commit made while no stream was waiting
        -- one was reading the batch -- still wakes the next wait)."""
        stamp = self.store.file_stamp()
        while True:
            if not self._waiting:
                await self._someone_waits.wait()
                self._someone_waits = trio.Event()
                continue
            now = self.store.file_stamp()
            if now != stamp:
                stamp = now
                for batch_id in list(self._waiting):
                    self._changed(batch_id)
            await trio.sleep(self._watch_every_s)
