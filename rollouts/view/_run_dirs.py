"""The eval sets, training runs and GEPA runs the files catalog found: small files (an index,
a log, one record per candidate) read whole in a worker thread and cached until they change
(rollouts.view._set_files, rollouts.view._training_files, rollouts.view._gepa_files)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import trio

from rollouts.view._file_state import stat_key, unfinished
from rollouts.view._gepa_files import REFLECTIONS_FILE, RESULT_FILE, STATE_FILE, read_gepa_dir, read_reflections
from rollouts.view._set_files import read_eval_set
from rollouts.view._training_files import CHECKPOINTS, LOG_FILE, read_training_run
from rollouts.view.catalog import (
    EvalSetDetail,
    EvalSetRow,
    GepaRunDetail,
    GepaRunRow,
    NotFound,
    Reflection,
    TrainingRunDetail,
    TrainingRunRow,
)

R = TypeVar("R")


@dataclass
class _Source:
    item_id: str
    path: Path
    cache_key: Any = None
    cached: Any = None


def _get(sources: dict[str, _Source], item_id: str, what: str) -> _Source:
    src = sources.get(item_id)
    if src is None:
        raise NotFound(f"no {what} {item_id!r}")
    return src


async def _rows(
    sources: dict[str, _Source], row: Callable[[_Source], R], unreadable: Callable[[_Source], R]
) -> list[R]:
    """Every source's row, in a worker thread; `unreadable(source)` for one that cannot be read."""
    srcs = list(sources.values())

    def rows() -> list[R]:
        out = []
        for s in srcs:
            try:
                out.append(row(s))
            except NotFound:
                out.append(unreadable(s))
        return out

    return await trio.to_thread.run_sync(rows)


class RunDirs:
    """Eval set, training run and GEPA run directories, by id. `run_id_of(directory)` is the
    catalog's id of the eval run there (or None); `generation()` changes when the catalog finds
    new runs (so links to them appear)."""

    def __init__(self, run_id_of: Callable[[Path], str | None], generation: Callable[[], int]) -> None:
        self._run_id_of = run_id_of
        self._generation = generation
        self._sets: dict[str, _Source] = {}
        self._training: dict[str, _Source] = {}
        self._gepa: dict[str, _Source] = {}

    def add_set(self, set_id: str, path: Path) -> None:
        self._sets.setdefault(set_id, _Source(set_id, path))

    def add_training(self, run_id: str, path: Path) -> None:
        self._training.setdefault(run_id, _Source(run_id, path))

    def add_gepa(self, run_id: str, path: Path) -> None:
        self._gepa.setdefault(run_id, _Source(run_id, path))

    # ----------------------------------------------------------------------------------------
    # eval sets
    # ----------------------------------------------------------------------------------------

    def _set(self, src: _Source) -> EvalSetDetail:
        key = stat_key(src.path / "index.json"), self._generation()
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_eval_set(src.path, src.item_id, self._run_id_of), key
        assert isinstance(src.cached, EvalSetDetail)
        return src.cached

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        return await _rows(
            self._sets, lambda s: self._set(s).row, lambda s: EvalSetRow(s.item_id, s.path.name, str(s.path))
        )

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        return await trio.to_thread.run_sync(self._set, _get(self._sets, set_id, "eval set"))

    # ----------------------------------------------------------------------------------------
    # training runs
    # ----------------------------------------------------------------------------------------

    def _run(self, src: _Source) -> TrainingRunDetail:
        key = stat_key(src.path / LOG_FILE), stat_key(src.path / CHECKPOINTS), self._generation()
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_training_run(src.path, src.item_id, self._run_id_of), key
        assert isinstance(src.cached, TrainingRunDetail)
        return src.cached

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        return await _rows(
            self._training, lambda s: self._run(s).row, lambda s: TrainingRunRow(s.item_id, s.path.name, str(s.path))
        )

    def training_files(self, run_id: str) -> list[Path]:
        """The files of training run `run_id`: a change to them is a change to its page."""
        path = _get(self._training, run_id, "training run").path
        return [path / LOG_FILE, path / CHECKPOINTS]

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        return await trio.to_thread.run_sync(self._run, _get(self._training, run_id, "training run"))

    # ----------------------------------------------------------------------------------------
    # GEPA runs
    # ----------------------------------------------------------------------------------------

    def _gepa_run(self, src: _Source) -> GepaRunDetail:
        key = stat_key(src.path / RESULT_FILE), stat_key(src.path / STATE_FILE)
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_gepa_dir(src.path, src.item_id), key
        detail = src.cached
        assert isinstance(detail, GepaRunDetail)
        if detail.row.status == "running":  # (or stopped without a result: decided afresh each time)
            detail = replace(detail, row=replace(detail.row, status=unfinished(src.path / STATE_FILE)))
        return detail

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]:
        return await _rows(
            self._gepa,
            lambda s: self._gepa_run(s).row,
            lambda s: GepaRunRow(s.item_id, s.path.name, str(s.path), "unreadable"),
        )

    def gepa_files(self, run_id: str) -> list[Path]:
        """The files of GEPA run `run_id`: a change to them is a change to its page."""
        path = _get(self._gepa, run_id, "GEPA run").path
        return [path / STATE_FILE, path / RESULT_FILE]

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail:
        return await trio.to_thread.run_sync(self._gepa_run, _get(self._gepa, run_id, "GEPA run"))

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]:
        path = _get(self._gepa, run_id, "GEPA run").path
        return await trio.to_thread.run_sync(read_reflections, path / REFLECTIONS_FILE, int(iteration))
