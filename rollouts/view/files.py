"""FilesCatalog: the Catalog over what rollouts writes on disk.

    catalog = FilesCatalog(["~/.rollouts/sessions", "results/", "gepa_runs/"], cache_dir=...)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(catalog.run_indexer)     # keeps the indexes up to date
        page = await catalog.list_samples(run_id, SampleQuery(sort="reward"))

Each path may be a session store root (directories named by session id), an eval output
directory (samples.jsonl, report.json), an eval set (index.json naming its task x model runs,
which are found where it says), a training run (log.jsonl; its steps' samples in steps/), a
GEPA run directory (state.json / result.json), or a directory holding such directories
(searched two levels down: rollouts.view._discovery). Sessions and samples are served from
SQLite indexes in `cache_dir` (rollouts.view._session_stores, rollouts.view._eval_runs, kept up
to date by rollouts.view._indexing), so a page never reads a whole big file: a sample is read
from its byte range, a session's transcript window through the store's own reader. Eval sets,
training logs and GEPA state are small and parsed whole, cached until they change
(rollouts.view._run_dirs).

Ids: a run id is `<directory name>-<hash of its path>`; it is looked up, never joined to a
path, so no id can reach a file outside what was given.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import trio

from rollouts.eval.sample import Sample
from rollouts.store.files import default_sessions_dir
from rollouts.view._discovery import dir_id, find_runs
from rollouts.view._eval_runs import EvalRuns
from rollouts.view._file_state import stat_key
from rollouts.view._indexing import Indexer, Step
from rollouts.view._run_dirs import RunDirs
from rollouts.view._session_stores import SessionStores
from rollouts.view.catalog import (
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
    SessionQuery,
    SessionRow,
    TrainingRunDetail,
    TrainingRunRow,
)

CACHE_DIR_ENV = "ROLLOUTS_VIEW_CACHE"


def default_cache_dir() -> Path:
    """`$ROLLOUTS_VIEW_CACHE`, else `~/.cache/rollouts/view`."""
    return Path(os.environ.get(CACHE_DIR_ENV) or "~/.cache/rollouts/view").expanduser()


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
        self._indexer = Indexer(self.discover, self._index_steps, refresh_interval)
        self._sessions = SessionStores(self.cache_dir, self._indexer)
        self._evals = EvalRuns(self.cache_dir, self._indexer)
        self._dirs = RunDirs(self._evals.id_of, lambda: len(self._evals))
        self.discover()

    def __repr__(self) -> str:
        return f"FilesCatalog({[str(p) for p in self.paths]!r}, cache_dir={str(self.cache_dir)!r})"

    @property
    def refresh_interval(self) -> float:
        return self._indexer.refresh_interval

    @refresh_interval.setter
    def refresh_interval(self, seconds: float) -> None:
        self._indexer.refresh_interval = seconds

    @staticmethod
    def run_id(path: str | os.PathLike[str]) -> str:
        """The id under which the eval or GEPA run directory at `path` is shown."""
        return dir_id(Path(path).expanduser().resolve())

    def discover(self) -> None:
        """Find the session stores, eval runs, eval sets, training runs and GEPA runs under the
        given paths (blocking, bounded: two levels, a few thousand entries)."""
        for p in self.paths:
            for found in find_runs(p):
                if found.kind == "eval":
                    self._evals.add(found.path, listed=found.listed)
                elif found.kind == "sessions":
                    self._sessions.add(found.path)
                elif found.kind == "training":
                    self._dirs.add_training(dir_id(found.path), found.path)
                elif found.kind == "set":
                    self._dirs.add_set(dir_id(found.path), found.path)
                elif found.kind == "gepa":
                    self._dirs.add_gepa(dir_id(found.path), found.path)

    # indexing (rollouts.view._indexing)

    def _index_steps(self) -> list[Step]:
        return [*self._evals.steps(), *self._sessions.steps()]

    async def run_indexer(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every index up to date, for ever: each pass indexes what was appended (in
        bounded steps, so cancellation waits at most one step), then sleeps until
        `refresh_interval` passes or a page asks for fresh data."""
        await self._indexer.run(task_status=task_status)

    async def index_once(self) -> None:
        """One full pass: every source brought up to date, taking small steps from each in
        turn (so the first page of every source is ready soon, whatever its size)."""
        await self._indexer.index_once()

    def wake(self) -> None:
        """Ask the indexer for a pass now."""
        self._indexer.wake()

    # sessions (rollouts.view._session_stores)

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]:
        return await self._sessions.list_sessions(query)

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail:
        return await self._sessions.get_session(session_id, offset=offset, limit=limit)

    # evaluations (rollouts.view._eval_runs)

    async def list_eval_runs(self) -> Sequence[EvalRunRow]:
        return await self._evals.list_eval_runs()

    async def get_eval_run(self, run_id: str) -> EvalRunDetail:
        return await self._evals.get_eval_run(run_id)

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]:
        return await self._evals.list_samples(run_id, query)

    async def get_sample(self, run_id: str, sample_id: str) -> Sample:
        return await self._evals.get_sample(run_id, sample_id)

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison:
        return await self._evals.compare_runs(run_a, run_b, offset=offset, limit=limit)

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        return await self._evals.runs_sharing_samples(run_id)

    # eval sets, training runs and GEPA runs (rollouts.view._run_dirs)

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        return await self._dirs.list_eval_sets()

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        return await self._dirs.get_eval_set(set_id)

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        return await self._dirs.list_training_runs()

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        return await self._dirs.get_training_run(run_id)

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]:
        return await self._dirs.list_gepa_runs()

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail:
        return await self._dirs.get_gepa_run(run_id)

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]:
        return await self._dirs.gepa_reflections(run_id, iteration)

    # live pages

    async def version(self, kind: Literal["session", "eval", "gepa", "training"], item_id: str) -> str:
        if kind == "eval":
            paths = self._evals.files(item_id)
        elif kind == "gepa":
            paths = self._dirs.gepa_files(item_id)
        elif kind == "training":
            paths = self._dirs.training_files(item_id)
        elif kind == "session":
            paths = await self._sessions.files(item_id)
        else:
            raise NotFound(f"unknown kind {kind!r}")
        token = repr([stat_key(p) for p in paths])
        if kind == "eval":  # (after the token: what is appended from here on changes the next one)
            await self._evals.catch_up(item_id)
        return token
