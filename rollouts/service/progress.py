"""When a batch's progress may have changed, for the API's event streams (no busy polling).

On PostgreSQL, a worker NOTIFYs `queue.PROGRESS_CHANNEL` with the batch id when the outcomes
it records leave the batch with nothing queued or running, and a cancellation NOTIFYs
`queue.CANCEL_CHANNEL`; `BatchChanges.run` LISTENs to both on a dedicated connection (a thread
blocked in the driver) and wakes the streams waiting on that batch, which report `done` at once
instead of at their next poll (progress in between is polled, a few times a second). On SQLite
there is no notification between processes: `wait` returns after its timeout.

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

    def __init__(self, store: Store, remember: int = 4096) -> None:
        self.store = store
        self._waiting: dict[str, trio.Event] = {}
        self._versions: OrderedDict[str, int] = OrderedDict()  # changes seen, of the last `remember` batches
        self._remember = remember

    @property
    def notified(self) -> bool:
        """Whether changes are notified (PostgreSQL), rather than found by polling."""
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
        with trio.move_on_after(timeout_s):
            await event.wait()

    def _changed(self, batch_id: str) -> None:
        self._versions[batch_id] = self._versions.pop(batch_id, 0) + 1
        if len(self._versions) > self._remember:
            self._versions.popitem(last=False)
        event = self._waiting.pop(batch_id, None)
        if event is not None:
            event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled (started once listening; returns at once on SQLite)."""
        if not self.notified:
            task_status.started()
            return
        await self.store.listen(
            (queue.PROGRESS_CHANNEL, queue.CANCEL_CHANNEL),
            lambda channel, batch_id: self._changed(batch_id),
            task_status=task_status,
        )
