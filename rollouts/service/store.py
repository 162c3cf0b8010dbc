"""The service store: one schema on SQLite (embedded) or PostgreSQL, used from trio.

    store = await Store.open("postgresql://rollouts@db:5432/rollouts")   # or a SQLite path
    tasks = await store.call(queue.claim, "worker-1", 16, 30.0)

Database drivers are synchronous (sqlite3; psycopg 3's sync API, since its async API needs
asyncio): every call runs one transaction in a worker thread (`trio.to_thread.run_sync`) under a
CapacityLimiter as large as the connection pool. The SQL lives in `accounts`, `queue` and
`jobs`, as functions of one transaction; `call(fn, *args)` runs one.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from typing import Concatenate, ParamSpec, TypeVar

import trio

from rollouts.service._db import Database, DatabaseUnavailable, Tx, default_db_url
from rollouts.service.schema import migrate

__all__ = ["DatabaseUnavailable", "Store", "default_db_url", "fail_fast"]

_log = logging.getLogger("rollouts.service.store")
_MAX_PAUSE_S = 5.0
_FAIL_FAST: ContextVar[bool] = ContextVar("rollouts_service_fail_fast", default=False)


@contextmanager
def fail_fast() -> Iterator[None]:
    """Within it (in this trio task and those it starts), a store call raises
    DatabaseUnavailable at once instead of waiting for the database: an API request answers
    503 rather than hang."""
    token = _FAIL_FAST.set(True)
    try:
        yield
    finally:
        _FAIL_FAST.reset(token)


def _unreachable(e: BaseException) -> bool:
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)


P = ParamSpec("P")
T = TypeVar("T")


class Store:
    """A database for the service (see the module docstring). Open with `Store.open(url)`."""

    def __init__(self, url: str, *, max_connections: int = 8) -> None:
        self.url = url
        self.db = Database(url, max_connections=max_connections)
        self._max = max_connections
        self._limiter: trio.CapacityLimiter | None = None

    @classmethod
    async def open(cls, url: str | None = None, *, max_connections: int = 8) -> Store:
        """The store at `url` (default: the embedded SQLite file), its schema brought up to date."""
        store = cls(url or default_db_url(), max_connections=max_connections)
        await trio.to_thread.run_sync(migrate, store.db)
        return store

    @property
    def is_postgres(self) -> bool:
        return self.db.dialect.is_postgres

    def file_stamp(self) -> tuple[tuple[int, int] | None, ...]:
        """SQLite: (mtime, size) of the database file and its WAL, which change when any
        process commits (SQLite has no notifications between processes: this is how a process
        notices another's commit without a query; an os.stat each, microseconds)."""
        path = self.db.sqlite_path
        assert path is not None, "file_stamp is SQLite's"
        out: list[tuple[int, int] | None] = []
        for name in (str(path), f"{path}-wal"):
            try:
                st = os.stat(name)
            except FileNotFoundError:
                out.append(None)
            else:
                out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    async def call(self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(tx, *args, **kwargs)` in one write transaction, in a worker thread. While the
        database is unreachable, retried after a pause that doubles from 50 ms to 5 s (for as
        long as it takes; inside `fail_fast()`, DatabaseUnavailable is raised at once)."""
        return await self._run(lambda tx: fn(tx, *args, **kwargs), True)

    async def read(self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like `call`, in a read transaction (no write lock on SQLite)."""
        return await self._run(lambda tx: fn(tx, *args, **kwargs), False)

    async def _run(self, fn: Callable[[Tx], T], write: bool) -> T:
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self._max)
        pause = 0.05
        while True:
            try:
                return await trio.to_thread.run_sync(self.db.run, fn, write, limiter=self._limiter)
            except DatabaseUnavailable as e:
                if _FAIL_FAST.get():
                    raise
                if pause == 0.05:
                    _log.warning("the database is unreachable (%s): retrying until it is back", e)
                await trio.sleep(pause)
                pause = min(pause * 2, _MAX_PAUSE_S)

    async def listen(
        self,
        channels: Sequence[str],
        on_note: Callable[[str, str], object],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """PostgreSQL: LISTEN to `channels` on a dedicated connection (a thread blocked in the
        driver) and call `on_note(channel, payload)` on the trio loop for each notification,
        until cancelled. Started once listening, so nothing notified after `start` is missed."""
        assert self.is_postgres, "LISTEN/NOTIFY is PostgreSQL's"
        token = trio.lowlevel.current_trio_token()
        stop = threading.Event()
        started = False

        def listen() -> None:
            nonlocal started
            conn = self.db.connect()
            try:
                for channel in channels:
                    conn.execute(f"LISTEN {channel}")
                if not started:
                    trio.from_thread.run_sync(task_status.started, trio_token=token)
                    started = True
                else:  # (reconnected: what was notified meanwhile is lost; look now)
                    for channel in channels:
                        trio.from_thread.run_sync(on_note, channel, "", trio_token=token)
                while not stop.is_set():
                    for note in conn.notifies(timeout=0.5, stop_after=1):
                        try:
                            trio.from_thread.run_sync(on_note, note.channel, note.payload, trio_token=token)
                        except trio.RunFinishedError:
                            return
            finally:
                with suppress(Exception):
                    conn.close()

        pause = 0.05
        try:
            while True:
                try:
                    await trio.to_thread.run_sync(listen, abandon_on_cancel=True)
                    return
                except Exception as e:  # (the connection broke, or none could be made: listen again)
                    if not _unreachable(e):
                        raise
                    _log.warning("LISTEN lost its connection (%s): listening again", str(e).strip()[:200])
                    await trio.sleep(pause)
                    pause = min(pause * 2, _MAX_PAUSE_S)
        finally:
            stop.set()  # the abandoned thread ends within its 0.5 s wait

    def call_sync(self, fn: Callable[Concatenate[Tx, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` in one transaction, in this thread (for the CLI's one-shot commands)."""
        return self.db.run(lambda tx: fn(tx, *args, **kwargs))

    def migrate_sync(self) -> int:
        return migrate(self.db)

    def close(self) -> None:
        self.db.close()

    def __repr__(self) -> str:
        return f"Store({self.db.dialect.name})"  # (never the URL: it may hold a password)
