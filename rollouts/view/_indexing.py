"""The files catalog's indexing loop: every SQLite index brought up to date in small steps.

    indexer = Indexer(discover, steps, refresh_interval=5.0)
    nursery.start_soon(indexer.run)          # for ever: a pass, then sleep until woken or due
    await indexer.wait_for(lambda: first_page_indexed(), 50)   # a page waits for its rows

Each pass takes a small first step from every source (so the first page of each is ready
soon, whatever its size), then bigger ones, and signals waiting pages after each round.
Without a running loop (a one-off use, a static bundle) a page indexes everything first.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

# (a source's update(budget) -> whether more is left, first budget, later budgets)
Step = tuple[Callable[[int], bool], int, int]


class Indexer:
    """Runs `discover()` (blocking: finds new sources) then the `steps()` of every source, in
    worker threads. `refresh_interval` is how often a pass runs unasked (seconds)."""

    def __init__(self, discover: Callable[[], None], steps: Callable[[], list[Step]], refresh_interval: float) -> None:
        self._discover = discover
        self._steps = steps
        self.refresh_interval = refresh_interval
        self._indexed = trio.Event()  # set after each indexing round (replaced by a fresh one)
        self._wake = trio.Event()
        self.running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every index up to date, for ever: each pass indexes what was appended (in
        bounded steps, so cancellation waits at most one step), then sleeps until
        `refresh_interval` passes or a page asks for fresh data."""
        self.running = True
        task_status.started()
        try:
            while True:
                await self.index_once()
                with trio.move_on_after(self.refresh_interval):
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            self.running = False

    async def index_once(self) -> None:
        """One full pass: every source brought up to date, taking small steps from each in
        turn (so the first page of every source is ready soon, whatever its size)."""
        await trio.to_thread.run_sync(self._discover)
        # a small first step puts a first page in the index quickly; bigger ones then cost less per line
        todo = self._steps()
        while todo:
            todo = [
                (update, later, later)
                for update, budget, later in todo
                if await trio.to_thread.run_sync(update, budget)
            ]
            done, self._indexed = self._indexed, trio.Event()
            done.set()

    def wake(self) -> None:
        """Ask for a pass now."""
        self._wake.set()

    async def catch_up(self) -> None:
        """Without a running loop (a one-off use, a bundle), bring the indexes up to date
        before answering."""
        if not self.running:
            await self.index_once()

    async def wait_for(self, ready: Callable[[], bool], max_passes: int = 1000) -> None:
        """Wait (at most `max_passes` indexing rounds) until `ready()` is true in a thread;
        without a running loop, index everything first."""
        if not self.running:
            await self.index_once()
            return
        for _ in range(max_passes):
            if await trio.to_thread.run_sync(ready):
                return
            event = self._indexed
            self.wake()
            await event.wait()
