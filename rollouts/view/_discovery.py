"""Finding what rollouts wrote under the viewer's paths (blocking, bounded).

A directory is, first match wins: an eval run (samples.jsonl), a training run (log.jsonl; its
steps' sample directories are eval runs not listed on their own), an eval set (index.json; its
task x model run directories are where the index says, inside the set), a GEPA run (state.json
or result.json), a session store (directories named by session id), or else a directory whose
subdirectories are looked at, two levels down at most and a few thousand entries each.

A directory's id is `<directory name>-<hash of its path>`: the catalog looks ids up, never
joins them to a path, so no id can reach a file outside what was given.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rollouts.store.base import is_session_id
from rollouts.view._gepa_files import is_gepa_dir
from rollouts.view._set_files import pair_dirs, read_index
from rollouts.view._training_files import LOG_FILE, is_training_dir, step_dirs

SCAN_DEPTH = 2
SCAN_MAX_ENTRIES = 5000
_STORE_PEEK = 200  # entries of a directory looked at to tell a session store

Kind = Literal["eval", "training", "set", "gepa", "sessions"]


@dataclass(frozen=True)
class Found:
    """A directory of `kind` at `path` (resolved); `listed` is False for a training step's
    samples (linked from its run, not shown in the runs list)."""

    kind: Kind
    path: Path
    listed: bool = True


def dir_id(path: Path) -> str:
    """The id under which the directory at `path` (resolved) is shown."""
    name = re.sub(r"[^0-9A-Za-z_.-]+", "_", path.name or "root").strip("._") or "run"
    return f"{name[:40]}-{hashlib.sha1(str(path).encode()).hexdigest()[:6]}"


def find_runs(path: Path, depth: int = SCAN_DEPTH, *, listed: bool = True) -> Iterator[Found]:
    """Everything rollouts wrote at or under `path` (see the module docstring)."""
    if not path.is_dir():
        return
    if (path / "samples.jsonl").is_file():
        yield Found("eval", path, listed)
        return
    if (path / LOG_FILE).is_file() and is_training_dir(path):
        yield Found("training", path)
        for d in step_dirs(path):
            yield from find_runs(d, 0, listed=False)
        return
    index = read_index(path) if (path / "index.json").is_file() else None
    if index is not None:
        yield Found("set", path)
        for d in pair_dirs(path, index):
            yield from find_runs(d, 0)
        return
    if is_gepa_dir(path):
        yield Found("gepa", path)
        return
    if _is_session_store(path):
        yield Found("sessions", path)
        return
    if depth <= 0:
        return
    try:
        with os.scandir(path) as it:
            entries = [e for _, e in zip(range(SCAN_MAX_ENTRIES), it, strict=False)]
    except OSError:
        return
    for e in sorted(entries, key=lambda e: e.name):
        if e.is_dir() and not e.name.startswith("."):
            yield from find_runs(Path(e.path), depth - 1)


def _is_session_store(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            for n, e in enumerate(it):
                if n > _STORE_PEEK:
                    return False
                if is_session_id(e.name) and e.is_dir() and (Path(e.path) / "session.json").is_file():
                    return True
    except OSError:
        return False
    return False
