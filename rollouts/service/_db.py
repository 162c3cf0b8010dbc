"""Connections, transactions and the two SQL dialects (SQLite, PostgreSQL), with no ORM.

SQL in this package is written once, with `?` placeholders and portable syntax (`ON CONFLICT`,
`RETURNING`, both supported by SQLite >= 3.35 and PostgreSQL). `Dialect` supplies what differs:
the placeholder style, the current time as epoch seconds, the row-locking suffix of a claim
(`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite takes the database write lock with
`BEGIN IMMEDIATE` instead) and column types.

Everything here is synchronous: drivers run in worker threads (`Store` calls them through
`trio.to_thread.run_sync` under a CapacityLimiter). psycopg 3's sync API is used because its
async API needs asyncio.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DATA_DIR_ENV = "ROLLOUTS_DATA_DIR"
DEFAULT_DATA_DIR = "~/.rollouts/service"
DEFAULT_DB_FILE = "rollouts.db"


def default_db_url() -> str:
    """The embedded database: `rollouts.db` under `$ROLLOUTS_DATA_DIR` (default ~/.rollouts/service)."""
    root = Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser()
    return f"sqlite:///{root / DEFAULT_DB_FILE}"


@dataclass(frozen=True)
class Dialect:
    """What differs between the two databases."""

    name: str  # "sqlite" | "postgresql"

    @property
    def is_postgres(self) -> bool:
        return self.name == "postgresql"

    def sql(self, text: str) -> str:
        """`text` with `?` placeholders in this driver's style (no literal `?` or `%` in our SQL,
        except `%b` in PostgreSQL-only statements: a parameter psycopg sends in binary)."""
        return text.replace("?", "%s") if self.is_postgres else text

    @property
    def now(self) -> str:
        """The database's clock as epoch seconds (leases are compared on one clock for all machines)."""
        if self.is_postgres:
            return "extract(epoch from clock_timestamp())::double precision"
        return "((julianday('now') - 2440587.5) * 86400.0)"

    @property
    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED" if self.is_postgres else ""

    @property
    def float_type(self) -> str:
        return "DOUBLE PRECISION" if self.is_postgres else "REAL"

    @property
    def bigint(self) -> str:
        return "BIGINT" if self.is_postgres else "INTEGER"


class Tx:
    """One transaction: `execute` returns every row (a list of tuples); `rowcount` is that of the
    last statement."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self._conn = conn
        self.dialect = dialect
        self.rowcount = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._conn.execute(self.dialect.sql(sql), tuple(_storable(p, self.dialect.is_postgres) for p in params))
        self.rowcount = cur.rowcount
        if cur.description is None:
            return []
        return list(cur.fetchall())

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self.execute(sql, params)
        return rows[0] if rows else None

    def many(self, sql: str, seq: Sequence[Sequence[Any]]) -> None:
        if not seq:
            return
        if self.dialect.is_postgres:
            with self._conn.cursor() as cur:
                cur.executemany(self.dialect.sql(sql), [tuple(p) for p in seq])
        else:
            self._conn.executemany(sql, [tuple(p) for p in seq])


def _storable(value: Any, postgres: bool) -> Any:
    """`value`, with what no database column can hold replaced by U+FFFD: lone surrogates (not
    encodable as UTF-8) and, on PostgreSQL, NUL. Requests are refused at the door for both
    (rollouts.service.requests); this keeps text a model or a task's code produced (an error
    message, a GEPA prompt) from failing the write that records it. JSON documents are stored
    as ASCII escapes and pass unchanged."""
    if not isinstance(value, str) or (value.isascii() and not (postgres and "\x00" in value)):
        return value
    if postgres:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in value)
    return value


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def parse_db_url(url: str) -> tuple[Dialect, str]:
    """(dialect, target): a PostgreSQL conninfo URL, or a SQLite file path.

    Accepted: `postgresql://...` / `postgres://...`, `sqlite:///abs/path.db`, `sqlite:rel.db`,
    or a plain file path."""
    if url.startswith(("postgresql://", "postgres://")):
        return Dialect("postgresql"), url
    if url.startswith("sqlite:///"):
        return Dialect("sqlite"), url[len("sqlite://") :]
    if url.startswith("sqlite:"):
        return Dialect("sqlite"), url[len("sqlite:") :]
    if "://" in url:
        raise ValueError("--db must be postgresql://USER@HOST:PORT/NAME, sqlite:///PATH or a file path")
    return Dialect("sqlite"), url


class DatabaseUnavailable(Exception):
    """The database cannot be reached now (PostgreSQL restarting, the network down): the
    connection broke or none could be made. Nothing was committed unless the break came during
    the COMMIT itself. Retrying later is the answer (Store.call does, with a bounded backoff)."""


def _is_unavailable(e: BaseException, conn: Any) -> bool:
    """Whether `e` (raised using `conn`, None when connecting) means the server is out of reach
    rather than that the statement was wrong."""
    try:
        import psycopg
    except ImportError:  # (SQLite only)
        return False
    if not isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    return conn is None or bool(getattr(conn, "broken", False)) or bool(getattr(conn, "closed", False))


class Database:
    """A small connection pool over one database; `run(fn, write)` runs `fn(tx)` in a transaction.

    Connections are made on demand and kept (at most `max_connections` idle); each is used by
    one thread at a time. Thread-safe."""

    def __init__(self, url: str, max_connections: int = 8) -> None:
        self.url = url
        self.dialect, self._target = parse_db_url(url)
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._max_idle = max_connections
        self._lock = threading.Lock()
        self._closed = False
        if not self.dialect.is_postgres:
            Path(self._target).expanduser().parent.mkdir(parents=True, exist_ok=True)

    @property
    def sqlite_path(self) -> Path | None:
        return None if self.dialect.is_postgres else Path(self._target).expanduser()

    def connect(self) -> Any:
        """A new connection (autocommit; transactions are explicit)."""
        if self.dialect.is_postgres:
            import psycopg

            return psycopg.connect(self._target, autocommit=True)
        conn = sqlite3.connect(str(Path(self._target).expanduser()), isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 60000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        try:
            conn = self._idle.get_nowait()
        except queue.Empty:
            try:
                conn = self.connect()
            except Exception as e:
                if _is_unavailable(e, None):
                    raise DatabaseUnavailable(_first_line(e)) from None
                raise
        ok = False
        try:
            yield conn
            ok = True
        except Exception as e:
            if _is_unavailable(e, conn):
                self._drop_idle()  # (a restarted server broke them all: connect afresh)
                raise DatabaseUnavailable(_first_line(e)) from None
            raise
        finally:
            if ok and not self._closed and self._idle.qsize() < self._max_idle:
                self._idle.put(conn)
            else:
                with suppress(Exception):
                    conn.close()

    def _drop_idle(self) -> None:
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                return
            with suppress(Exception):
                conn.close()

    def run(self, fn: Callable[[Tx], T], write: bool = True) -> T:
        """`fn(tx)` in one transaction (committed if it returns, rolled back if it raises).
        On SQLite a write transaction starts with BEGIN IMMEDIATE (the database write lock)."""
        with self._connection() as conn:
            tx = Tx(conn, self.dialect)
            if self.dialect.is_postgres:
                with conn.transaction():
                    return fn(tx)
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                out = fn(tx)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return out

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
