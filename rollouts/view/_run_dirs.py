"""The eval sets and training runs `FilesCatalog` found: small files (an index, a log) read
whole in a worker thread and cached until they change (rollouts.view._set_files,
rollouts.view._training_files)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from rollouts.view._set_files import read_eval_set
from rollouts.view._training_files import CHECKPOINTS, LOG_FILE, read_training_run
from rollouts.view.catalog import EvalSetDetail, EvalSetRow, NotFound, TrainingRunDetail, TrainingRunRow


@dataclass
class _Source:
    item_id: str
    path: Path
    cache_key: Any = None
    cached: Any = None


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RunDirs:
    """Eval set and training run directories, by id. `run_id_of(directory)` is the catalog's id
    of the eval run there (or None); `generation()` changes when the catalog finds new runs (so
    links to them appear)."""

    def __init__(self, run_id_of: Callable[[Path], str | None], generation: Callable[[], int]) -> None:
        self._run_id_of = run_id_of
        self._generation = generation
        self._sets: dict[str, _Source] = {}
        self._training: dict[str, _Source] = {}

    def add_set(self, set_id: str, path: Path) -> None:
        self._sets.setdefault(set_id, _Source(set_id, path))

    def add_training(self, run_id: str, path: Path) -> None:
        self._training.setdefault(run_id, _Source(run_id, path))

    def _set(self, src: _Source) -> EvalSetDetail:
        key = _stat_key(src.path / "index.json"), self._generation()
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_eval_set(src.path, src.item_id, self._run_id_of), key
        assert isinstance(src.cached, EvalSetDetail)
        return src.cached

    def _run(self, src: _Source) -> TrainingRunDetail:
        key = _stat_key(src.path / LOG_FILE), _stat_key(src.path / CHECKPOINTS), self._generation()
        if key != src.cache_key or src.cached is None:
            src.cached, src.cache_key = read_training_run(src.path, src.item_id, self._run_id_of), key
        assert isinstance(src.cached, TrainingRunDetail)
        return src.cached

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        srcs = list(self._sets.values())

        def rows() -> list[EvalSetRow]:
            out = []
            for s in srcs:
                try:
                    out.append(self._set(s).row)
                except NotFound:
                    out.append(EvalSetRow(s.item_id, s.path.name, str(s.path)))
            return out

        return await trio.to_thread.run_sync(rows)

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        src = self._sets.get(set_id)
        if src is None:
            raise NotFound(f"no eval set {set_id!r}")
        return await trio.to_thread.run_sync(self._set, src)

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        srcs = list(self._training.values())

        def rows() -> list[TrainingRunRow]:
            out = []
            for s in srcs:
                try:
                    out.append(self._run(s).row)
                except NotFound:
                    out.append(TrainingRunRow(s.item_id, s.path.name, str(s.path)))
            return out

        return await trio.to_thread.run_sync(rows)

    def training_path(self, run_id: str) -> Path:
        """The directory of training run `run_id` (NotFound if there is none)."""
        src = self._training.get(run_id)
        if src is None:
            raise NotFound(f"no training run {run_id!r}")
        return src.path

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        src = self._training.get(run_id)
        if src is None:
            raise NotFound(f"no training run {run_id!r}")
        return await trio.to_thread.run_sync(self._run, src)
