"""The eval runs the files catalog found: each output directory's samples.jsonl indexed in
SQLite (rollouts.view._index.EvalIndex), so a page of samples, a sort or a comparison of two
runs is a query, and a sample is read from its byte range; report.json (small) is read whole."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from rollouts.eval.sample import Sample
from rollouts.view._discovery import dir_id
from rollouts.view._file_state import stat_key, unfinished
from rollouts.view._index import EvalIndex, index_file
from rollouts.view._indexing import Indexer, Step
from rollouts.view._sql import SAMPLE_COLS, files_columns, sample_row
from rollouts.view.catalog import (
    CompareRow,
    Comparison,
    EvalRunDetail,
    EvalRunRow,
    NotFound,
    Page,
    SampleQuery,
    SampleRow,
    clamp_page,
)
from rollouts.view.sql import compile_compare, compile_samples

SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.json"
_SHARING_CACHE_MAX = 100_000


@dataclass
class _Run:
    run_id: str
    path: Path
    index: EvalIndex
    listed: bool = True  # False: a training step's samples (linked from the run, not in the runs list)
    stats_key: Any = None
    stats: dict[str, Any] = field(default_factory=dict)


class EvalRuns:
    """Eval run directories by id, their indexes in `cache_dir`, kept up to date by `indexer`."""

    def __init__(self, cache_dir: Path, indexer: Indexer) -> None:
        self._cache_dir = cache_dir
        self._indexer = indexer
        self._runs: dict[str, _Run] = {}
        # (run, other run) -> (the two samples files' stat keys, whether they share a sample id)
        self._sharing: dict[tuple[str, str], tuple[Any, bool]] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def add(self, path: Path, *, listed: bool = True) -> None:
        """The run at `path` (resolved); the first `listed` given for it stays."""
        rid = dir_id(path)
        if rid not in self._runs:
            index = EvalIndex(index_file(self._cache_dir, "eval", path), path / SAMPLES_FILE)
            self._runs[rid] = _Run(rid, path, index, listed)

    def id_of(self, path: Path) -> str | None:
        """The id of the eval run at `path` (resolved), if there is one."""
        rid = dir_id(path)
        return rid if rid in self._runs else None

    def steps(self) -> list[Step]:
        return [(r.index.update, 100, 1000) for r in self._runs.values()]

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise NotFound(f"no eval run {run_id!r}")
        return run

    def files(self, run_id: str) -> list[Path]:
        """The files of run `run_id`: a change to them is a change to its page."""
        run = self._run(run_id)
        return [run.path / SAMPLES_FILE, run.path / REPORT_FILE]

    async def catch_up(self, run_id: str) -> None:
        """Index what was appended to the run's samples (a live page about to recompute)."""
        run = self._run(run_id)
        if not await trio.to_thread.run_sync(run.index.up_to_date):
            await trio.to_thread.run_sync(run.index.update, 20_000)

    def _row(self, run: _Run) -> EvalRunRow:
        status, report = _report(run.path)
        key = (run.index.state("stats_end"), run.index.state("end"), status)
        if key != run.stats_key:
            run.stats = run.index.stats()
            run.stats_key = key
        st = run.stats
        return EvalRunRow(
            run_id=run.run_id,
            name=str(report.get("eval_name") or run.path.name),
            location=str(run.path),
            status=status,
            n_samples=st["n"],
            n_failed=st["failed"],
            mean_reward=st["mean"],
            metrics=st["metrics"],
            started_at=str(report.get("started_at") or ""),
            duration_s=report.get("duration_s") if isinstance(report.get("duration_s"), int | float) else None,
            indexed=not run.index.pending(),
            model=_model_of(report),
            task=_task_of(report),
        )

    async def list_eval_runs(self) -> Sequence[EvalRunRow]:
        await self._indexer.catch_up()
        runs = [r for r in self._runs.values() if r.listed]
        return await trio.to_thread.run_sync(lambda: [self._row(r) for r in runs])

    async def get_eval_run(self, run_id: str) -> EvalRunDetail:
        run = self._run(run_id)
        await self._indexer.catch_up()

        def detail() -> EvalRunDetail:
            _, report = _report(run.path)
            return EvalRunDetail(self._row(run), report, tuple(run.index.metric_names()))

        return await trio.to_thread.run_sync(detail)

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]:
        run = self._run(run_id)
        offset, limit = clamp_page(query.offset, query.limit)
        sql = compile_samples(
            files_columns(), replace(query, offset=offset, limit=limit), select=SAMPLE_COLS, source="samples"
        )
        if sql.count_args or query.sort != "seq" or query.descending:
            await self._indexer.catch_up()
        else:  # the plain list in file order: wait until this page is indexed
            await self._indexer.wait_for(
                lambda: not run.index.pending() or run.index.count("samples") >= offset + limit, 50
            )

        def page() -> tuple[list[SampleRow], int]:
            with run.index.read() as db:
                total = db.execute(sql.count, sql.count_args).fetchone()[0]
                rows = db.execute(sql.page, [*sql.page_args, limit, offset]).fetchall()
            return [sample_row(r) for r in rows], total

        items, total = await trio.to_thread.run_sync(page)
        return Page(tuple(items), total, offset, limit, not run.index.pending())

    async def get_sample(self, run_id: str, sample_id: str) -> Sample:
        run = self._run(run_id)

        def read() -> Sample:
            with run.index.read() as db:
                r = db.execute("SELECT off, len FROM samples WHERE id=?", (sample_id,)).fetchone()
            if r is None and not run.index.up_to_date():
                run.index.update(5000)  # maybe appended since the last pass
                with run.index.read() as db:
                    r = db.execute("SELECT off, len FROM samples WHERE id=?", (sample_id,)).fetchone()
            if r is None:
                raise NotFound(f"no sample {sample_id!r} in run {run_id}")
            with open(run.path / SAMPLES_FILE, "rb") as f:
                f.seek(r[0])
                line = f.read(r[1])
            try:
                return Sample.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError) as e:
                raise NotFound(f"sample {sample_id!r} of run {run_id} cannot be read ({e})") from None

        return await trio.to_thread.run_sync(read)

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison:
        a, b = self._run(run_a), self._run(run_b)
        await self._indexer.catch_up()
        offset, limit = clamp_page(offset, limit)

        def compare() -> Comparison:
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
            complete = not (a.index.pending() or b.index.pending())
            page = Page(tuple(CompareRow(*r) for r in rows), shared, offset, limit, complete)
            return Comparison(self._row(a), self._row(b), page, shared, n_a - shared, n_b - shared, regressed, improved)

        return await trio.to_thread.run_sync(compare)

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        run = self._run(run_id)
        await self._indexer.catch_up()
        others = [o for o in self._runs.values() if o.run_id != run_id and o.listed]

        def shares(db: sqlite3.Connection, other: _Run) -> bool:
            db.execute("ATTACH DATABASE ? AS other", (str(other.index.db_path),))
            try:
                hit = db.execute("SELECT 1 FROM main.samples x JOIN other.samples y ON x.id = y.id LIMIT 1").fetchone()
            except sqlite3.OperationalError:  # (an index not created yet: nothing shared so far)
                hit = None
            finally:
                db.execute("DETACH DATABASE other")
            return hit is not None

        def sharing() -> list[str]:
            mine = stat_key(run.path / SAMPLES_FILE)
            keys = {o.run_id: (mine, stat_key(o.path / SAMPLES_FILE)) for o in others}
            todo = [o for o in others if self._sharing.get((run_id, o.run_id), (None, False))[0] != keys[o.run_id]]
            if todo:
                if len(self._sharing) > _SHARING_CACHE_MAX:
                    self._sharing.clear()
                with run.index.read() as db:
                    for o in todo:
                        self._sharing[run_id, o.run_id] = (keys[o.run_id], shares(db, o))
            return [o.run_id for o in others if self._sharing[run_id, o.run_id][1]]

        return await trio.to_thread.run_sync(sharing)


def _report(path: Path) -> tuple[str, Mapping[str, Any]]:
    """The run's status and report.json; without one, "running" or "interrupted"."""
    try:
        report = json.loads((path / REPORT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return unfinished(path / SAMPLES_FILE), {}
    if not isinstance(report, Mapping):
        return unfinished(path / SAMPLES_FILE), {}
    return str(report.get("status") or "completed"), report


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
