"""FilesCatalog: the Catalog over what rollouts writes on disk.

    catalog = FilesCatalog(["~/.rollouts/sessions", "results/", "gepa_runs/"], cache_dir=...)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(catalog.run_indexer)     # keeps the indexes up to date
        page = await catalog.list_samples(run_id, SampleQuery(sort="reward"))

Each path may be a session store root (directories named by session id), an eval output
directory (samples.jsonl, report.json), an eval set (index.json naming its task x model runs,
which are found where it says), a training run (log.jsonl; its steps' samples in steps/), a GEPA run directory (state.json / result.json), or a
directory holding such directories (searched two levels down). Sessions and samples are served
from SQLite indexes in `cache_dir` (see rollouts.view._index), so a page never reads a whole
big file: a sample is read from its byte range, a session's transcript window through the
store's own reader. GEPA state and result files are small (one record per candidate) and are
parsed whole, cached by modification time.

Ids: a run id is `<directory name>-<hash of its path>`; it is looked up, never joined to a
path, so no id can reach a file outside what was given.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import trio

from rollouts.eval.sample import Sample
from rollouts.store.base import SessionError, is_session_id
from rollouts.store.files import FileSessionStore, default_sessions_dir
from rollouts.view._gepa_files import REFLECTIONS_FILE, is_gepa_dir, read_gepa_dir, read_reflections
from rollouts.view._index import EvalIndex, SessionIndex
from rollouts.view._run_dirs import RunDirs
from rollouts.view._set_files import pair_dirs, read_index
from rollouts.view._sql import SAMPLE_COLS, SESSION_COLS, files_columns, sample_row, session_row, session_where
from rollouts.view._training_files import LOG_FILE, is_training_dir, step_dirs
from rollouts.view.catalog import (
    CompareRow,
    Comparison,
    EvalRunDetail,
    EvalRunRow,
    EvalSetDetail,
    EvalSetRow,
    GepaRunDetail,
    GepaRunRow,
    NotFound,
    Page,
    Reflection,
    SampleQuery,
    SampleRow,
    SessionDetail,
    SessionNode,
    SessionQuery,
    SessionRow,
    TrainingRunDetail,
    TrainingRunRow,
    clamp_page,
)
from rollouts.view.sql import compile_compare, compile_samples

CACHE_DIR_ENV = "ROLLOUTS_VIEW_CACHE"
_TREE_MAX = 500
STALE_AFTER_S = 600.0
_SCAN_DEPTH = 2
_SCAN_MAX_ENTRIES = 5000
_SHARING_CACHE_MAX = 100_000


def default_cache_dir() -> Path:
    """`$ROLLOUTS_VIEW_CACHE`, else `~/.cache/rollouts/view`."""
    return Path(os.environ.get(CACHE_DIR_ENV) or "~/.cache/rollouts/view").expanduser()


def _slug(path: Path) -> str:
    name = re.sub(r"[^0-9A-Za-z_.-]+", "_", path.name or "root").strip("._") or "run"
    return f"{name[:40]}-{hashlib.sha1(str(path).encode()).hexdigest()[:6]}"


def _index_file(cache_dir: Path, kind: str, path: Path) -> Path:
    return cache_dir / f"{kind}-{hashlib.sha1(str(path).encode()).hexdigest()[:16]}.sqlite"


def _is_session_store(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            for n, e in enumerate(it):
                if n > 200:
                    return False
                if is_session_id(e.name) and e.is_dir() and (Path(e.path) / "session.json").is_file():
                    return True
    except OSError:
        return False
    return False


@dataclass
class _EvalSource:
    run_id: str
    path: Path
    index: EvalIndex
    listed: bool = True  # False: a training step's samples (linked from the run, not in the runs list)
    stats_key: Any = None
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class _GepaSource:
    run_id: str
    path: Path
    cache_key: Any = None
    cached: GepaRunDetail | None = None


@dataclass
class _StoreSource:
    path: Path
    index: SessionIndex
    store: FileSessionStore


def _unfinished(path: Path) -> str:
    """A run without its final file: "running" while `path` was written to in the last
    STALE_AFTER_S seconds, else "interrupted" (killed, or stopped without finishing)."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return "interrupted"
    return "running" if age < STALE_AFTER_S else "interrupted"


def _row_from_report_status(path: Path) -> tuple[str, Mapping[str, Any]]:
    try:
        report = json.loads((path / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return _unfinished(path / "samples.jsonl"), {}
    if not isinstance(report, Mapping):
        return _unfinished(path / "samples.jsonl"), {}
    return str(report.get("status") or "completed"), report


class FilesCatalog:
    """The Catalog over local files (see the module docstring). `refresh_interval` is how often
    the indexer looks for new data (seconds)."""

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        refresh_interval: float = 5.0,
    ) -> None:
        given = [Path(p).expanduser().resolve() for p in (paths or ())]
        if not given:
            given = [default_sessions_dir().resolve(), Path.cwd()]
        self.paths = tuple(given)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.refresh_interval = refresh_interval
        self._evals: dict[str, _EvalSource] = {}
        self._gepa: dict[str, _GepaSource] = {}
        # (run, other run) -> (the two samples files' stat keys, whether they share a sample id)
        self._sharing: dict[tuple[str, str], tuple[Any, bool]] = {}
        self._dirs = RunDirs(self._listed_run_id, lambda: len(self._evals))
        self._stores: dict[Path, _StoreSource] = {}
        self._indexed = trio.Event()  # set after each indexing pass (replaced by a fresh one)
        self._wake = trio.Event()
        self._indexer_running = False
        self.discover()

    def __repr__(self) -> str:
        return f"FilesCatalog({[str(p) for p in self.paths]!r}, cache_dir={str(self.cache_dir)!r})"

    # ----------------------------------------------------------------------------------------
    # sources
    # ----------------------------------------------------------------------------------------

    @staticmethod
    def run_id(path: str | os.PathLike[str]) -> str:
        """The id under which the eval or GEPA run directory at `path` is shown."""
        return _slug(Path(path).expanduser().resolve())

    def discover(self) -> None:
        """Find the session stores, eval runs and GEPA runs under the given paths (blocking,
        bounded: two levels, a few thousand entries)."""
        for p in self.paths:
            self._discover(p, _SCAN_DEPTH)

    def _discover(self, path: Path, depth: int, *, listed: bool = True) -> None:
        if not path.is_dir():
            return
        if (path / "samples.jsonl").is_file():
            rid = _slug(path)
            if rid not in self._evals:
                idx = EvalIndex(_index_file(self.cache_dir, "eval", path), path / "samples.jsonl")
                self._evals[rid] = _EvalSource(rid, path, idx, listed)
            return
        if (path / LOG_FILE).is_file() and is_training_dir(path):  # a training run, and its steps' samples
            rid = _slug(path)
            self._dirs.add_training(rid, path)
            for d in step_dirs(path):
                self._discover(d, 0, listed=False)
            return
        index = read_index(path) if (path / "index.json").is_file() else None
        if index is not None:  # an eval set: its pairs' run directories are where its index says
            rid = _slug(path)
            self._dirs.add_set(rid, path)
            for d in pair_dirs(path, index):
                self._discover(d, 0)
            return
        if is_gepa_dir(path):
            rid = _slug(path)
            self._gepa.setdefault(rid, _GepaSource(rid, path))
            return
        if _is_session_store(path):
            if path not in self._stores:
                sidx = SessionIndex(_index_file(self.cache_dir, "sessions", path), path)
                self._stores[path] = _StoreSource(path, sidx, FileSessionStore(path))
            return
        if depth <= 0:
            return
        try:
            with os.scandir(path) as it:
                entries = [e for _, e in zip(range(_SCAN_MAX_ENTRIES), it, strict=False)]
        except OSError:
            return
        for e in sorted(entries, key=lambda e: e.name):
            if e.is_dir() and not e.name.startswith("."):
                self._discover(Path(e.path), depth - 1)

    # ----------------------------------------------------------------------------------------
    # indexing
    # ----------------------------------------------------------------------------------------

    async def run_indexer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every index up to date, for ever: each pass indexes what was appended (in
        bounded steps, so cancellation waits at most one step), then sleeps until
        `refresh_interval` passes or a page asks for fresh data."""
        self._indexer_running = True
        task_status.started()
        try:
            while True:
                await self.index_once()
                with trio.move_on_after(self.refresh_interval):
                    await self._wake.wait()
                self._wake = trio.Event()
        finally:
            self._indexer_running = False

    async def index_once(self) -> None:
        """One full pass: every source brought up to date, taking small steps from each in
        turn (so the first page of every source is ready soon, whatever its size)."""
        await trio.to_thread.run_sync(self.discover)
        # (source's update, first step, later steps): a small first step puts a first page in
        # the index quickly; bigger ones then cost less per line
        todo: list[tuple[Callable[[int], bool], int, int]] = [(e.index.update, 100, 1000) for e in self._evals.values()]
        todo += [(s.index.update, 50, 200) for s in self._stores.values()]
        while todo:
            todo = [
                (update, later, later)
                for update, budget, later in todo
                if await trio.to_thread.run_sync(update, budget)
            ]
            self._signal()

    def _signal(self) -> None:
        done, self._indexed = self._indexed, trio.Event()
        done.set()

    def wake(self) -> None:
        """Ask the indexer for a pass now."""
        self._wake.set()

    async def _without_indexer(self) -> None:
        """Without a running indexer (a one-off use, a bundle), bring the indexes up to date
        before answering."""
        if not self._indexer_running:
            await self.index_once()

    async def _wait_for(self, ready: Any, max_passes: int = 1000) -> None:
        """Wait (at most `max_passes` indexing steps) until `ready()` is true in a thread;
        without a running indexer, index everything first."""
        if not self._indexer_running:
            await self.index_once()
            return
        for _ in range(max_passes):
            if await trio.to_thread.run_sync(ready):
                return
            event = self._indexed
            self.wake()
            await event.wait()

    # ----------------------------------------------------------------------------------------
    # sessions
    # ----------------------------------------------------------------------------------------

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]:
        offset, limit = clamp_page(query.offset, query.limit)
        stores = list(self._stores.values())
        if stores and query == SessionQuery(offset=query.offset, limit=query.limit):
            # the plain list: wait until the first page is indexed (newest sessions come first)
            await self._wait_for(
                lambda: all(s.index.state("ready") or _count(s.index) >= offset + limit for s in stores), 50
            )
        where, args = session_where(query)

        def run() -> tuple[list[SessionRow], int, bool]:
            rows: list[SessionRow] = []
            total = 0
            for s in stores:
                with s.index.read() as db:
                    total += db.execute(f"SELECT count(*) FROM sessions{where}", args).fetchone()[0]
                    got = db.execute(
                        f"SELECT {SESSION_COLS} FROM sessions s{where} ORDER BY s.id DESC LIMIT ?",
                        [*args, offset + limit],
                    ).fetchall()
                    rows.extend(session_row(r) for r in got)
            rows.sort(key=lambda r: r.session_id, reverse=True)
            return rows[offset : offset + limit], total, all(not _pending(s.index) for s in stores)

        items, total, complete = await trio.to_thread.run_sync(run)
        return Page(tuple(items), total, offset, limit, complete)

    def _find_store(self, session_id: str) -> tuple[_StoreSource, SessionRow]:
        """The store holding `session_id` and its row, brought up to date first (blocking)."""
        if not is_session_id(session_id):
            raise NotFound(f"{session_id!r} is not a session id")
        for s in self._stores.values():
            if not (s.path / session_id / "session.json").is_file():
                continue
            s.index.index_one(session_id)
            with s.index.read() as db:
                r = db.execute(f"SELECT {SESSION_COLS} FROM sessions s WHERE s.id=?", (session_id,)).fetchone()
            if r is not None:
                return s, session_row(r)
        raise NotFound(f"no session {session_id!r}")

    def _tree(self, s: _StoreSource, session_id: str) -> SessionNode:
        with s.index.read() as db:
            root = session_id
            for _ in range(_TREE_MAX):
                r = db.execute("SELECT parent_id FROM sessions WHERE id=?", (root,)).fetchone()
                if r is None or r[0] is None:
                    break
                root = r[0]
            budget = [_TREE_MAX]

            def node(sid: str) -> SessionNode:
                r = db.execute("SELECT status, branch_point, n_own FROM sessions WHERE id=?", (sid,)).fetchone()
                status, bp, n_own = r if r is not None else ("missing", None, 0)
                kids = []
                for (child,) in db.execute("SELECT id FROM sessions WHERE parent_id=? ORDER BY id", (sid,)).fetchall():
                    if budget[0] <= 0:
                        break
                    budget[0] -= 1
                    kids.append(node(child))
                return SessionNode(sid, status, bp, (bp or 0) + n_own, tuple(kids))

            return node(root)

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail:
        offset, limit = clamp_page(offset, limit)
        s, row = await trio.to_thread.run_sync(self._find_store, session_id)
        try:
            messages = await s.store.messages(session_id, offset + limit)
            n = await s.store.message_count(session_id)
        except SessionError as e:
            raise NotFound(str(e)) from None
        tree = await trio.to_thread.run_sync(self._tree, s, session_id)
        try:
            meta = await trio.to_thread.run_sync(
                lambda: json.loads((s.path / session_id / "session.json").read_text(encoding="utf-8"))
            )
        except (OSError, ValueError):
            meta = {}
        return SessionDetail(row, meta, tuple(messages[offset:]), offset, n, tree)

    # ----------------------------------------------------------------------------------------
    # evaluations
    # ----------------------------------------------------------------------------------------

    def _eval(self, run_id: str) -> _EvalSource:
        src = self._evals.get(run_id)
        if src is None:
            raise NotFound(f"no eval run {run_id!r}")
        return src

    def _eval_row(self, src: _EvalSource) -> EvalRunRow:
        status, report = _row_from_report_status(src.path)
        key = (src.index.state("stats_end"), src.index.state("end"), status)
        if key != src.stats_key:
            src.stats = src.index.stats()
            src.stats_key = key
        st = src.stats
        return EvalRunRow(
            run_id=src.run_id,
            name=str(report.get("eval_name") or src.path.name),
            location=str(src.path),
            status=status,
            n_samples=st["n"],
            n_failed=st["failed"],
            mean_reward=st["mean"],
            metrics=st["metrics"],
            started_at=str(report.get("started_at") or ""),
            duration_s=report.get("duration_s") if isinstance(report.get("duration_s"), int | float) else None,
            indexed=not _pending(src.index),
            model=_model_of(report),
            task=_task_of(report),
        )

    async def list_eval_runs(self) -> Sequence[EvalRunRow]:
        await self._without_indexer()
        srcs = [s for s in self._evals.values() if s.listed]
        return await trio.to_thread.run_sync(lambda: [self._eval_row(s) for s in srcs])

    async def get_eval_run(self, run_id: str) -> EvalRunDetail:
        src = self._eval(run_id)
        await self._without_indexer()

        def run() -> EvalRunDetail:
            _, report = _row_from_report_status(src.path)
            return EvalRunDetail(self._eval_row(src), report, tuple(src.index.metric_names()))

        return await trio.to_thread.run_sync(run)

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]:
        src = self._eval(run_id)
        offset, limit = clamp_page(query.offset, query.limit)
        sql = compile_samples(
            files_columns(), replace(query, offset=offset, limit=limit), select=SAMPLE_COLS, source="samples"
        )
        if sql.count_args or query.sort != "seq" or query.descending:
            await self._without_indexer()
        else:
            await self._wait_for(lambda: not _pending(src.index) or _count(src.index, "samples") >= offset + limit, 50)

        def run() -> tuple[list[SampleRow], int]:
            with src.index.read() as db:
                total = db.execute(sql.count, sql.count_args).fetchone()[0]
                rows = db.execute(sql.page, [*sql.page_args, limit, offset]).fetchall()
            return [sample_row(r) for r in rows], total

        items, total = await trio.to_thread.run_sync(run)
        return Page(tuple(items), total, offset, limit, not _pending(src.index))

    async def get_sample(self, run_id: str, sample_id: str) -> Sample:
        src = self._eval(run_id)

        def run() -> Sample:
            with src.index.read() as db:
                r = db.execute("SELECT off, len FROM samples WHERE id=?", (sample_id,)).fetchone()
            if r is None and not src.index.up_to_date():
                src.index.update(5000)  # maybe appended since the last pass
                with src.index.read() as db:
                    r = db.execute("SELECT off, len FROM samples WHERE id=?", (sample_id,)).fetchone()
            if r is None:
                raise NotFound(f"no sample {sample_id!r} in run {run_id}")
            with open(src.path / "samples.jsonl", "rb") as f:
                f.seek(r[0])
                line = f.read(r[1])
            try:
                return Sample.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                raise NotFound(f"sample {sample_id!r} of run {run_id} cannot be read ({e})") from None

        return await trio.to_thread.run_sync(run)

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison:
        a, b = self._eval(run_a), self._eval(run_b)
        await self._without_indexer()
        offset, limit = clamp_page(offset, limit)

        def run() -> Comparison:
            with a.index.read() as db:
                db.execute("ATTACH DATABASE ? AS other", (str(b.index.db_path),))
                sql = compile_compare(
                    files_columns("x"),
                    files_columns("y"),
                    join="FROM main.samples x JOIN other.samples y ON x.id = y.id",
                )
                shared, regressed, improved = db.execute(sql.counts, sql.args).fetchone()
                rows = db.execute(sql.rows, [*sql.args, limit, offset]).fetchall()
                n_a = db.execute("SELECT count(*) FROM main.samples").fetchone()[0]
                n_b = db.execute("SELECT count(*) FROM other.samples").fetchone()[0]
            page = Page(
                tuple(CompareRow(*r) for r in rows), shared, offset, limit, not (_pending(a.index) or _pending(b.index))
            )
            return Comparison(
                self._eval_row(a), self._eval_row(b), page, shared, n_a - shared, n_b - shared, regressed, improved
            )

        return await trio.to_thread.run_sync(run)

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        src = self._eval(run_id)
        await self._without_indexer()
        others = [o for o in self._evals.values() if o.run_id != run_id and o.listed]

        def shares(db: sqlite3.Connection, other: _EvalSource) -> bool:
            db.execute("ATTACH DATABASE ? AS other", (str(other.index.db_path),))
            try:
                hit = db.execute("SELECT 1 FROM main.samples x JOIN other.samples y ON x.id = y.id LIMIT 1").fetchone()
            except sqlite3.OperationalError:  # (an index not created yet: nothing shared so far)
                hit = None
            finally:
                db.execute("DETACH DATABASE other")
            return hit is not None

        def run() -> list[str]:
            mine = _stat_key(src.path / "samples.jsonl")
            keys = {o.run_id: (mine, _stat_key(o.path / "samples.jsonl")) for o in others}
            todo = [o for o in others if self._sharing.get((run_id, o.run_id), (None, False))[0] != keys[o.run_id]]
            if todo:
                if len(self._sharing) > _SHARING_CACHE_MAX:
                    self._sharing.clear()
                with src.index.read() as db:
                    for o in todo:
                        self._sharing[run_id, o.run_id] = (keys[o.run_id], shares(db, o))
            return [o.run_id for o in others if self._sharing[run_id, o.run_id][1]]

        return await trio.to_thread.run_sync(run)

    # ----------------------------------------------------------------------------------------
    # eval sets and training runs (rollouts.view._run_dirs)
    # ----------------------------------------------------------------------------------------

    def _listed_run_id(self, path: Path) -> str | None:
        """The id of the eval run at `path` (resolved), if the catalog has it."""
        rid = _slug(path)
        return rid if rid in self._evals else None

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        return await self._dirs.list_eval_sets()

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        return await self._dirs.get_eval_set(set_id)

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        return await self._dirs.list_training_runs()

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        return await self._dirs.get_training_run(run_id)

    # ----------------------------------------------------------------------------------------
    # GEPA
    # ----------------------------------------------------------------------------------------

    def _gepa_src(self, run_id: str) -> _GepaSource:
        src = self._gepa.get(run_id)
        if src is None:
            raise NotFound(f"no GEPA run {run_id!r}")
        return src

    def _gepa_detail(self, src: _GepaSource) -> GepaRunDetail:
        key = tuple(_stat_key(src.path / n) for n in ("result.json", "state.json"))
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_gepa_dir(src.path, src.run_id), key
        detail = src.cached
        if detail.row.status == "running":
            detail = replace(detail, row=replace(detail.row, status=_unfinished(src.path / "state.json")))
        return detail

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]:
        srcs = list(self._gepa.values())

        def run() -> list[GepaRunRow]:
            rows = []
            for s in srcs:
                try:
                    rows.append(self._gepa_detail(s).row)
                except NotFound:
                    rows.append(GepaRunRow(s.run_id, s.path.name, str(s.path), "unreadable"))
            return rows

        return await trio.to_thread.run_sync(run)

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail:
        src = self._gepa_src(run_id)
        return await trio.to_thread.run_sync(self._gepa_detail, src)

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]:
        src = self._gepa_src(run_id)

        return await trio.to_thread.run_sync(read_reflections, src.path / REFLECTIONS_FILE, int(iteration))

    # ----------------------------------------------------------------------------------------
    # live
    # ----------------------------------------------------------------------------------------

    async def version(self, kind: Literal["session", "eval", "gepa", "training"], item_id: str) -> str:
        if kind == "eval":
            src = self._eval(item_id)
            paths = [src.path / "samples.jsonl", src.path / "report.json"]
        elif kind == "gepa":
            g = self._gepa_src(item_id)
            paths = [g.path / "state.json", g.path / "result.json"]
        elif kind == "training":
            t = self._dirs.training_path(item_id)
            paths = [t / LOG_FILE, t / "checkpoints"]
        elif kind == "session":
            s, _ = await trio.to_thread.run_sync(self._find_store, item_id)
            paths = [s.path / item_id / "messages.jsonl", s.path / item_id / "session.json"]  # (indexed by _find_store)
        else:
            raise NotFound(f"unknown kind {kind!r}")
        token = repr([_stat_key(p) for p in paths])
        if kind == "eval":
            src = self._evals[item_id]
            if not await trio.to_thread.run_sync(src.index.up_to_date):
                await trio.to_thread.run_sync(src.index.update, 20_000)
        return token


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _model_of(report: Mapping[str, Any]) -> str:
    config = report.get("config")
    endpoint = config.get("endpoint") if isinstance(config, Mapping) else None
    if not isinstance(endpoint, Mapping):
        return ""
    provider, model = str(endpoint.get("provider") or ""), str(endpoint.get("model") or "")
    return f"{provider}/{model}" if provider and model else model


def _task_of(report: Mapping[str, Any]) -> str:
    config = report.get("config")
    if not isinstance(config, Mapping):
        return ""
    meta = config.get("metadata")
    for key in ("task", "dataset"):
        if isinstance(meta, Mapping) and meta.get(key):
            return str(meta[key])
    return str(config.get("score_fn") or "")


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _count(index: EvalIndex | SessionIndex, table: str = "sessions") -> int:
    with index.read() as db, contextlib.suppress(sqlite3.Error):
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    return 0


def _pending(index: EvalIndex | SessionIndex) -> bool:
    """Whether the index has not caught up with its files yet."""
    if isinstance(index, EvalIndex):
        return not index.up_to_date()
    return not index.state("ready")
