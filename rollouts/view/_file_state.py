"""What a file's metadata tells the viewer: whether it changed, and whether it is still written.

Small files (an eval set's index, a training log, GEPA state) are cached until `stat_key`
changes; a run whose final file is missing counts as still going while its files were written
in the last STALE_AFTER_S seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

STALE_AFTER_S = 600.0  # a file written this recently may still grow (a step, a minibatch can take minutes)


def stat_key(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, modification time) of `path`, None when it cannot be read: equal keys mean
    an unchanged file (a rewrite through a rename changes the inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def written_recently(mtime: float) -> bool:
    """Whether a file modified at `mtime` (epoch seconds) may still be written to."""
    return time.time() - mtime < STALE_AFTER_S


def unfinished(path: Path) -> Literal["running", "interrupted"]:
    """A run without its final file: "running" while `path` was written to in the last
    STALE_AFTER_S seconds, else "interrupted" (killed, or stopped without finishing)."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return "interrupted"
    return "running" if written_recently(mtime) else "interrupted"
