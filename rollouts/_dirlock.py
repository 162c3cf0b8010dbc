"""One writer per directory: an OS file lock on `<directory>/.rollouts.lock`.

    lock = DirectoryLock.acquire(Path("runs/x"), "evaluate() output_dir")  # DirectoryInUseError if held
    try:
        ...  # write in the directory
    finally:
        lock.release()

The lock is `flock` on an open file: the kernel releases it when the holder closes the file or
its process dies (crash, SIGKILL), so a stale lock never needs cleaning up. The holder removes
the file when it releases the lock (a run leaves no file behind); a writer that locked a file
just removed sees it is no longer at its path and opens the new one. A second writer
(another process, or another run in this one: each acquire opens the file anew) is refused at
once with `DirectoryInUseError` naming the holder, which the lock file records while held (pid,
host, command, start time). Used by `evaluate()`'s output_dir and GEPA's run_dir.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from rollouts.dtypes import now_iso
from rollouts.errors import DirectoryInUseError

__all__ = ["LOCK_FILE", "DirectoryLock"]

LOCK_FILE = ".rollouts.lock"
_MAX_HOLDER_BYTES = 4096
_ATTEMPTS = 100  # lock files removed under us in a row (each by a run that just ended)


def _still_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the one at `path` (not removed or replaced)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _holder_text(fd: int) -> str:
    """Who holds the lock, as its file records it ('another process' if it cannot be read)."""
    try:
        raw = os.pread(fd, _MAX_HOLDER_BYTES, 0)
        info = json.loads(raw)
        command = " ".join(str(a) for a in info.get("command", []))[:200]
        return (
            f"process {info['pid']} on {info['host']} (since {info['since']}"
            + (f", running `{command}`" if command else "")
            + ")"
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another process"


class DirectoryLock:
    """An exclusive lock on a directory for one writer (see the module docstring)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path  # the lock file
        self._fd = fd

    @classmethod
    def acquire(cls, directory: Path, what: str) -> DirectoryLock:
        """Lock `directory` (created if missing) for this writer, or raise DirectoryInUseError
        naming `what` the directory is (e.g. "evaluate() output_dir") and who holds it."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / LOCK_FILE
        for _ in range(_ATTEMPTS):
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise DirectoryInUseError(
                        f"{what} {str(directory)!r} is in use by {_holder_text(fd)}: two runs writing one "
                        "directory would mix and lose results. Wait for that run to finish (or stop it), "
                        "or use another directory"
                    ) from None
                if not _still_at(fd, path):  # its holder removed it while we opened it: again
                    os.close(fd)
                    continue
                info = {"pid": os.getpid(), "host": socket.gethostname(), "since": now_iso(), "command": sys.argv}
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(info).encode("utf-8", "backslashreplace"), 0)
            except BaseException:
                os.close(fd)
                raise
            return cls(path, fd)
        raise DirectoryInUseError(f"{what} {str(directory)!r}: its lock file keeps being replaced; try again")

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        """Give the lock up (idempotent), removing the lock file first (while still holding it:
        a writer that opened the file meanwhile sees it gone and opens a new one)."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            with contextlib.suppress(OSError):
                if _still_at(fd, self.path):
                    self.path.unlink()
        finally:
            os.close(fd)  # (closing releases the flock)

    def __del__(self) -> None:  # a lock dropped without release() is not held forever
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1
