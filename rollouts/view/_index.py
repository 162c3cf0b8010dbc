"""SQLite indexes of files that rollouts writes, rebuilt incrementally (blocking; run in threads).

One index file per source in the cache directory. An index remembers how far it has read
(inode, byte offset of the end of the last complete line); `update(budget)` reads only what was
appended since, at most `budget` lines (or sessions) per call, committing every few hundred so
that readers (other connections, WAL mode) see progress while a big file is being indexed.
A file that shrank or was replaced is indexed again from the start.

    EvalIndex      samples.jsonl: one row per sample id (the last record wins), its byte range,
                   the figures the table shows and sorts by, and text to search.
    SessionIndex   a FileSessionStore root: one row per session (metadata, message count,
                   tokens, cost, errors, text to search), newest first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rollouts.store.base import is_session_id
from rollouts.view.sql import ascii_lower

TEXT_CAP = 4000  # characters of input / response kept for search in an eval index
PREVIEW_CAP = 300  # characters of input / response kept for the table
SESSION_TEXT_CAP = 100_000  # characters of message text kept for search per session
_COMMIT_EVERY = 500
_READ_CHUNK = 1 << 20


def index_file(cache_dir: Path, kind: str, path: Path) -> Path:
    """Where the `kind` index of the files at `path` is kept under `cache_dir`."""
    return cache_dir / f"{kind}-{hashlib.sha1(str(path).encode()).hexdigest()[:16]}.sqlite"


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    return db


class _Index:
    """An SQLite file with a key/value `state` table; one writer at a time (a lock), readers
    open their own connections."""

    SCHEMA = ""
    VERSION = 1

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._lock = threading.Lock()
        db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.closing(_connect(db_path)) as db:
            db.execute("CREATE TABLE IF NOT EXISTS state(k TEXT PRIMARY KEY, v)")
            row = db.execute("SELECT v FROM state WHERE k='version'").fetchone()
            if row is None or row[0] != self.VERSION:
                self._drop_all(db)
            db.executescript(self.SCHEMA)
            db.execute("INSERT OR REPLACE INTO state VALUES('version', ?)", (self.VERSION,))
            db.commit()

    def _drop_all(self, db: sqlite3.Connection) -> None:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name!='state'")]
        for t in tables:
            db.execute(f'DROP TABLE IF EXISTS "{t}"')
        db.execute("DELETE FROM state")

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read connection (closed after)."""
        # (not mode=ro: a read-only connection cannot recreate the -shm file a WAL database
        # needs when the last writer has just closed and removed it)
        db = sqlite3.connect(self.db_path, timeout=30, check_same_thread=False)
        try:
            yield db
        finally:
            db.close()

    @staticmethod
    def _get(db: sqlite3.Connection, key: str, default: Any = None) -> Any:
        row = db.execute("SELECT v FROM state WHERE k=?", (key,)).fetchone()
        return default if row is None else row[0]

    @staticmethod
    def _set(db: sqlite3.Connection, key: str, value: Any) -> None:
        db.execute("INSERT OR REPLACE INTO state VALUES(?, ?)", (key, value))

    def state(self, key: str, default: Any = None) -> Any:
        with self.read() as db:
            return self._get(db, key, default)

    def count(self, table: str) -> int:
        """Rows of `table` indexed so far (0 before it is created)."""
        with self.read() as db, contextlib.suppress(sqlite3.Error):
            return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
        return 0


# --------------------------------------------------------------------------------------------
# samples.jsonl
# --------------------------------------------------------------------------------------------


def _flat_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def sample_fields(d: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of one sample record (a `Sample.to_dict()`), read without building objects."""
    score = d.get("score") or None
    metrics: dict[str, float] = {}
    reward: float | None = None
    if isinstance(score, Mapping):
        for m in score.get("metrics") or ():
            if isinstance(m, Mapping) and isinstance(m.get("value"), int | float):
                metrics[str(m.get("name"))] = float(m["value"])
        r = score.get("reward")
        reward = float(r) if isinstance(r, int | float) else None
    traj = d.get("trajectory") or {}
    turns = tokens = 0
    cost = duration = 0.0
    response = ""
    for m in traj.get("messages") or ():
        if m.get("role") == "assistant":
            turns += 1
            c = m.get("content")
            if isinstance(c, str):
                response = c
            elif isinstance(c, list):
                response = "".join(b.get("text", "") for b in c if isinstance(b, Mapping) and b.get("type") == "text")
        u = m.get("usage")
        if isinstance(u, Mapping):
            tokens += sum(
                int(u.get(k) or 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
            )
            cost += float(u.get("cost_usd") or 0.0)
    for c in traj.get("completions") or ():
        if isinstance(c, Mapping):
            duration += float(c.get("duration_s") or 0.0)
    meta = d.get("metadata") or {}
    status = str(d.get("status") or "pending")
    return {
        "id": str(d["id"]),
        "status": status,
        "failed": int(status != "completed"),
        "reward": reward,
        "turns": turns,
        "tokens": tokens,
        "cost": cost,
        "duration": duration,
        "error": d.get("error"),
        "input_text": _flat_text(d.get("input") or {})[:TEXT_CAP],
        "response_text": response[:TEXT_CAP],
        "metrics": json.dumps(metrics),
        "metadata": json.dumps({str(k): _flat_text(v) for k, v in meta.items()} if isinstance(meta, Mapping) else {}),
    }


class EvalIndex(_Index):
    """The index of one samples.jsonl."""

    VERSION = 4
    SCHEMA = """
    CREATE TABLE IF NOT EXISTS samples(
        id TEXT PRIMARY KEY, seq INTEGER, off INTEGER, len INTEGER, status TEXT, failed INTEGER,
        reward REAL, turns INTEGER, tokens INTEGER, cost REAL, duration REAL, error TEXT,
        input_text TEXT, response_text TEXT, metrics TEXT, metadata TEXT, search TEXT);
    CREATE INDEX IF NOT EXISTS samples_seq ON samples(seq);
    CREATE INDEX IF NOT EXISTS samples_reward ON samples(reward, seq);
    CREATE INDEX IF NOT EXISTS samples_status ON samples(status, seq);
    CREATE INDEX IF NOT EXISTS samples_turns ON samples(turns, seq);
    CREATE INDEX IF NOT EXISTS samples_tokens ON samples(tokens, seq);
    CREATE INDEX IF NOT EXISTS samples_cost ON samples(cost, seq);
    CREATE INDEX IF NOT EXISTS samples_duration ON samples(duration, seq);
    CREATE TABLE IF NOT EXISTS metric_names(name TEXT PRIMARY KEY);
    """
    _COLUMNS = (
        "id, seq, off, len, status, failed, reward, turns, tokens, cost, duration, error, "
        "input_text, response_text, metrics, metadata, search"
    )

    def __init__(self, db_path: Path, samples_path: Path) -> None:
        super().__init__(db_path)
        self.samples_path = samples_path

    def pending(self) -> bool:
        """Whether the index has not caught up with its file yet."""
        return not self.up_to_date()

    def up_to_date(self) -> bool:
        """Whether everything in the file (complete lines) is indexed."""
        try:
            st = os.stat(self.samples_path)
        except FileNotFoundError:
            return True
        with self.read() as db:
            return bool(self._get(db, "ino") == st.st_ino and self._get(db, "end", 0) >= st.st_size)

    def update(self, budget: int = 5000) -> bool:
        """Index up to `budget` new lines; True when lines remain to index."""
        with self._lock, contextlib.closing(_connect(self.db_path)) as db:
            try:
                st = os.stat(self.samples_path)
            except FileNotFoundError:
                return False
            end = self._get(db, "end", 0)
            if self._get(db, "ino") != st.st_ino or st.st_size < end:
                db.execute("DELETE FROM samples")
                db.execute("DELETE FROM metric_names")
                end = 0
                self._set(db, "ino", st.st_ino)
                self._set(db, "lines", 0)
                self._set(db, "end", 0)
                self._set(db, "stats", None)
                db.commit()
            if st.st_size == end:
                return False
            seq = self._get(db, "lines", 0)
            names: set[str] = {r[0] for r in db.execute("SELECT name FROM metric_names")}
            rows: list[tuple[Any, ...]] = []
            done = 0
            with open(self.samples_path, "rb") as f:
                f.seek(end)
                buf = b""
                pos = end
                while done < budget:
                    chunk = f.read(_READ_CHUNK)
                    if not chunk:
                        break
                    buf += chunk
                    start = 0
                    while done < budget:
                        nl = buf.find(b"\n", start)
                        if nl < 0:
                            break
                        line = buf[start : nl + 1]
                        off = pos + start
                        start = nl + 1
                        if line.strip():
                            row = self._row(line, off, seq)
                            if row is not None:
                                rows.append(row)
                                seq += 1
                                new = set(json.loads(row[14])) - names
                                if new:
                                    names |= new
                                    db.executemany("INSERT OR IGNORE INTO metric_names VALUES(?)", [(n,) for n in new])
                        done += 1
                        if len(rows) >= _COMMIT_EVERY:
                            self._flush(db, rows, pos + start, seq)
                    pos += start
                    buf = buf[start:]
            self._flush(db, rows, pos, seq)
            more = pos < st.st_size and done >= budget
            batches = self._get(db, "batches", 0) + 1
            self._set(db, "batches", batches)
            if not more or batches % 20 == 0:  # at the end of what is written, and now and then
                self._set(db, "stats", json.dumps(self._compute_stats(db)))
                self._set(db, "stats_end", pos)
            db.commit()
            return more

    @staticmethod
    def _compute_stats(db: sqlite3.Connection) -> dict[str, Any]:
        n, failed, mean = db.execute(
            "SELECT count(*), coalesce(sum(failed),0), avg(CASE WHEN failed=0 THEN reward END) FROM samples"
        ).fetchone()
        # (every name, quotes included: the key is data here, never part of a JSON path)
        rows = db.execute("SELECT m.key, avg(m.value) FROM samples, json_each(samples.metrics) m GROUP BY m.key")
        metrics = {str(name): float(v) for name, v in rows if v is not None}
        return {"n": n, "failed": failed, "mean": mean, "metrics": metrics}

    def stats(self) -> dict[str, Any]:
        """Sample count, failed count, mean reward and metric means. Computed by the indexer
        when it reaches the end of the file (and every 20 steps of a long first pass); a small
        index that has none yet is summed on the spot."""
        with self.read() as db:
            raw = self._get(db, "stats")
            if raw is not None:
                stats: dict[str, Any] = json.loads(raw)
                return stats
            n = db.execute("SELECT count(*) FROM samples").fetchone()[0]
            if n <= 20_000:
                return self._compute_stats(db)
            return {"n": n, "failed": 0, "mean": None, "metrics": {}}

    def _row(self, line: bytes, off: int, seq: int) -> tuple[Any, ...] | None:
        try:
            d = json.loads(line)
            f = sample_fields(d)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a bad line: the sample page shows the file's own error when opened
        return (
            f["id"], seq, off, len(line), f["status"], f["failed"], f["reward"], f["turns"], f["tokens"],
            f["cost"], f["duration"], f["error"], f["input_text"][:PREVIEW_CAP], f["response_text"][:PREVIEW_CAP],
            f["metrics"], f["metadata"], ascii_lower(f["input_text"] + "\n" + f["response_text"]),
        )  # fmt: skip

    def _flush(self, db: sqlite3.Connection, rows: list[tuple[Any, ...]], end: int, seq: int) -> None:
        cols = self._COLUMNS
        keep_seq = ", ".join(f"{c}=excluded.{c}" for c in cols.split(", ") if c not in ("id", "seq"))
        db.executemany(
            f"INSERT INTO samples({cols}) VALUES({','.join('?' * 17)}) ON CONFLICT(id) DO UPDATE SET {keep_seq}",
            rows,
        )
        rows.clear()
        self._set(db, "end", end)
        self._set(db, "lines", seq)
        db.commit()

    def metric_names(self) -> list[str]:
        with self.read() as db:
            return [r[0] for r in db.execute("SELECT name FROM metric_names ORDER BY name")]


# --------------------------------------------------------------------------------------------
# a FileSessionStore root
# --------------------------------------------------------------------------------------------


def _message_text(m: Mapping[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    parts = []
    for b in c or ():
        if not isinstance(b, Mapping):
            continue
        if b.get("type") == "text":
            parts.append(str(b.get("text", "")))
        elif b.get("type") == "thinking":
            parts.append(str(b.get("thinking") or ""))
        elif b.get("type") == "tool_call":
            parts.append(f"{b.get('name')} {json.dumps(b.get('arguments'), ensure_ascii=False, default=str)}")
    return "\n".join(parts)


class SessionIndex(_Index):
    """The index of one FileSessionStore root (`root/<session id>/session.json, messages.jsonl`)."""

    VERSION = 5
    SCHEMA = """
    CREATE TABLE IF NOT EXISTS sessions(
        id TEXT PRIMARY KEY, parent_id TEXT, branch_point INTEGER, status TEXT, model TEXT,
        provider TEXT, tags TEXT, created_at TEXT, updated_at TEXT, n_own INTEGER, tokens INTEGER,
        cost REAL, errors INTEGER, preview TEXT, text TEXT,
        meta_mtime INTEGER, log_ino INTEGER, log_end INTEGER);
    CREATE INDEX IF NOT EXISTS sessions_parent ON sessions(parent_id);
    CREATE INDEX IF NOT EXISTS sessions_status ON sessions(status);
    """

    def __init__(self, db_path: Path, root: Path) -> None:
        super().__init__(db_path)
        self.root = root

    def pending(self) -> bool:
        """Whether the index has not been through every session yet."""
        return not self.state("ready")

    def update(self, budget: int = 500) -> bool:
        """Bring up to `budget` changed sessions up to date (newest first) and drop deleted
        ones; True when changed sessions remain."""
        with self._lock, contextlib.closing(_connect(self.db_path)) as db:
            try:
                names = sorted((e.name for e in os.scandir(self.root) if is_session_id(e.name)), reverse=True)
            except FileNotFoundError:
                names = []
            known = {
                r[0]: (r[1], r[2], r[3]) for r in db.execute("SELECT id, meta_mtime, log_ino, log_end FROM sessions")
            }
            gone = set(known) - set(names)
            if gone:
                db.executemany("DELETE FROM sessions WHERE id=?", [(g,) for g in gone])
            changed = 0
            for name in names:
                if changed >= budget:
                    db.commit()
                    return True
                if self._refresh(db, name, known.get(name)):
                    changed += 1
                    if changed % _COMMIT_EVERY == 0:
                        db.commit()
            self._set(db, "ready", 1)
            db.commit()
            return False

    def index_one(self, session_id: str) -> None:
        """Bring one session up to date (a page about to show it)."""
        assert is_session_id(session_id)
        with self._lock, contextlib.closing(_connect(self.db_path)) as db:
            r = db.execute("SELECT meta_mtime, log_ino, log_end FROM sessions WHERE id=?", (session_id,)).fetchone()
            if self._refresh(db, session_id, r):
                db.commit()

    def _refresh(self, db: sqlite3.Connection, name: str, have: tuple[Any, ...] | None) -> bool:
        d = self.root / name
        try:
            meta_st = os.stat(d / "session.json")
            log_st = os.stat(d / "messages.jsonl")
        except (FileNotFoundError, NotADirectoryError):
            return False  # being created, or damaged: not listed
        if (
            have is not None
            and have[0] == meta_st.st_mtime_ns
            and have[1] == log_st.st_ino
            and have[2] == log_st.st_size
        ):
            return False
        self._index_session(db, name, meta_st.st_mtime_ns, log_st, have)
        return True

    def _index_session(
        self, db: sqlite3.Connection, name: str, meta_mtime: int, log_st: os.stat_result, have: tuple[Any, ...] | None
    ) -> None:
        d = self.root / name
        try:
            meta = json.loads((d / "session.json").read_bytes())
            endpoint = meta.get("endpoint") or {}
        except (OSError, ValueError, AttributeError):
            return
        prev = None
        if have is not None and have[1] == log_st.st_ino and have[2] <= log_st.st_size:
            prev = db.execute(
                "SELECT n_own, tokens, cost, errors, preview, text, log_end FROM sessions WHERE id=?", (name,)
            ).fetchone()
        n_own, tokens, cost, errors, preview, text, start = prev if prev else (0, 0, 0.0, 0, "", "", 0)
        parts = [text] if text else []
        size = len(text)
        end = start
        try:
            with open(d / "messages.jsonl", "rb") as f:
                f.seek(start)
                for line in f:
                    if not line.endswith(b"\n"):
                        break  # a torn or still-being-written last line
                    end += len(line)
                    if not line.startswith(b'{"role"'):
                        continue
                    try:
                        m = json.loads(line)
                    except ValueError:
                        continue
                    n_own += 1
                    u = m.get("usage")
                    if isinstance(u, Mapping):
                        tokens += sum(
                            int(u.get(k) or 0)
                            for k in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
                        )
                        cost += float(u.get("cost_usd") or 0.0)
                    details = m.get("details")
                    if isinstance(details, Mapping) and details.get("is_error"):
                        errors += 1
                    t = _message_text(m)
                    # (a user message: a branch's own history starts mid-conversation, with a tool
                    # result or a reply; without a user message of its own it shows its parent's)
                    if not preview and t and m.get("role") == "user":
                        preview = t[:200]
                    if size < SESSION_TEXT_CAP and t:
                        parts.append(t[: SESSION_TEXT_CAP - size].lower())
                        size += len(parts[-1]) + 1
        except OSError:
            return
        db.execute(
            "INSERT OR REPLACE INTO sessions VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                name, meta.get("parent_id"), meta.get("branch_point"), str(meta.get("status") or "pending"),
                str(endpoint.get("model") or ""), str(endpoint.get("provider") or ""),
                json.dumps(meta.get("tags") or {}), str(meta.get("created_at") or ""), str(meta.get("updated_at") or ""),
                n_own, tokens, cost, errors, preview, "\n".join(parts), meta_mtime, log_st.st_ino, end,
            ),
        )  # fmt: skip
