"""One session's files at the level of bytes and syscalls (blocking; callers pick the thread).

`messages.jsonl` holds one JSON object per line, written only by appending:

* a message: `Message.to_dict()` (it starts with `{"role"`), optionally with an extra top-level
  `"environment_state"` key: the environment's state right after this message;
* an environment snapshot: `{"environment_state": {...}}`, the state after the messages above it.

Tying environment states to positions in the log is what lets a resume or a branch at message N
restore the environment exactly as it was after N messages, even after a crash.

Crash safety:
* one append = one `write()` of whole lines on an `O_APPEND` descriptor, under an exclusive
  `flock` on the file, so writers in several processes (or threads) never interleave;
* before writing, an incomplete last line (left by a writer killed mid-write) is cut off, so the
  new line never glues onto it; readers ignore such a line and report it;
* `session.json` is replaced atomically: temp file, fsync, rename, fsync of the directory.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.dtypes import Message
from rollouts.store.base import SessionCorruptError, SessionError, SessionRecoveryWarning

MESSAGE_PREFIX = b'{"role"'
SNAPSHOT_PREFIX = b'{"environment_state"'
ENV_KEY = "environment_state"
FILE_MODE = 0o600
DIR_MODE = 0o700
_TAIL_CHUNK = 1 << 16


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def encode_message(message: Message, environment_state: Mapping[str, Any] | None = None) -> bytes:
    """The log line (with its newline) for `message`, carrying `environment_state` if given."""
    d = message.to_dict()
    assert ENV_KEY not in d, "Message.to_dict must not use the log's reserved key"
    if environment_state is not None:
        d[ENV_KEY] = dict(environment_state)
    line = _dumps(d)
    assert line.startswith(MESSAGE_PREFIX), "Message.to_dict must start with 'role'"
    return line + b"\n"


def encode_snapshot(environment_state: Mapping[str, Any]) -> bytes:
    return _dumps({ENV_KEY: dict(environment_state)}) + b"\n"


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _cut_torn_tail(fd: int, path: Path) -> None:
    """If the file does not end with a newline, truncate it after its last newline (the bytes cut
    were never acknowledged: a writer died in the middle of its write)."""
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    end = size
    keep = 0
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        chunk = os.pread(fd, end - start, start)
        nl = chunk.rfind(b"\n")
        if nl >= 0:
            keep = start + nl + 1
            break
        end = start
    os.ftruncate(fd, keep)
    warnings.warn(
        SessionRecoveryWarning(
            f"{path}: removed an incomplete last line ({size - keep} bytes) left by an interrupted write"
        ),
        stacklevel=2,
    )


def open_log(path: Path) -> int:
    """An `O_APPEND` descriptor on an existing log (FileNotFoundError if there is none)."""
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)


def append(path: Path, data: bytes, *, fsync: bool, blocking: bool) -> bool:
    """Append `data` (whole lines) under the file's lock; fsync if asked.

    With `blocking=False` returns False at once, having written nothing, if another writer holds
    the lock. Raises FileNotFoundError if the log does not exist."""
    assert data.endswith(b"\n"), "appends are whole lines"
    fd = open_log(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            _cut_torn_tail(fd, path)
            try:
                _write_all(fd, data)
                if fsync:
                    os.fsync(fd)
            except OSError as e:
                raise SessionError(f"cannot append to {path}: {e.strerror or e}") from e
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return True


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:  # some filesystems cannot fsync a directory; the rename is still atomic
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Replace `path` with `data` atomically: a reader sees the old or the new file, never a mix."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    payload = json.dumps(data, ensure_ascii=False, indent=2).encode("utf-8") + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any]:
    """The object in `path` (FileNotFoundError if missing, SessionCorruptError if not a JSON object)."""
    raw = path.read_bytes()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SessionCorruptError(
            f"{path} is not valid JSON ({e}); restore it from a backup, or delete the directory "
            f"{path.parent} to drop the session"
        ) from None
    if not isinstance(data, dict):
        raise SessionCorruptError(f"{path} does not hold a JSON object; restore it from a backup")
    return data


class LogLock:
    """The log's exclusive lock, held over a metadata update (blocking: use from a worker thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1

    def acquire(self) -> None:
        """Take the lock (FileNotFoundError if the log does not exist)."""
        assert self.fd < 0, "LogLock is not reentrant"
        fd = open_log(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def append(self, data: bytes) -> None:
        """Append whole lines and fsync them (the lock is held)."""
        assert self.fd >= 0 and data.endswith(b"\n")
        _cut_torn_tail(self.fd, self.path)
        _write_all(self.fd, data)
        os.fsync(self.fd)

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogContents:
    """What one log holds, up to a number of messages.

    `environment_state` is the latest state at or before that point and `environment_at` the
    number of the log's own messages it follows (None: the log has none). `torn_bytes` is the
    size of an incomplete last line that was ignored (0 if none)."""

    messages: list[Message]
    environment_state: dict[str, Any] | None
    environment_at: int | None
    torn_bytes: int


def _split(path: Path) -> tuple[list[bytes], int]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    torn = len(lines[-1])  # bytes after the last newline: an interrupted write
    lines.pop()
    if torn:
        warnings.warn(
            SessionRecoveryWarning(
                f"{path}: ignored an incomplete last line ({torn} bytes) left by an interrupted write"
            ),
            stacklevel=3,
        )
    return lines, torn


def _corrupt(path: Path, lineno: int, why: str) -> SessionCorruptError:
    return SessionCorruptError(
        f"{path}:{lineno}: {why}; the file is damaged beyond an interrupted write. Restore it from a "
        "backup, or cut the file before this line to keep the messages above it"
    )


def _parse_messages(path: Path, lines: list[bytes], linenos: list[int]) -> list[dict[str, Any]]:
    """All message lines parsed at once (one JSON array: much faster than line by line)."""
    if not lines:
        return []
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except (json.JSONDecodeError, UnicodeDecodeError):
        for line, lineno in zip(lines, linenos, strict=True):
            try:
                json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise _corrupt(path, lineno, f"not valid JSON ({e})") from None
        raise
    assert isinstance(parsed, list) and len(parsed) == len(lines)
    return parsed


def read_log(path: Path, limit: int | None = None) -> LogContents:
    """The first `limit` messages of the log (all if None) and the environment state there."""
    lines, torn = _split(path)
    message_lines: list[bytes] = []
    linenos: list[int] = []
    snapshots: list[tuple[int, bytes, int]] = []  # (messages before it, line, line number)
    for i, line in enumerate(lines):
        if line.startswith(MESSAGE_PREFIX):
            if limit is not None and len(message_lines) >= limit:
                break
            message_lines.append(line)
            linenos.append(i + 1)
        elif line.startswith(SNAPSHOT_PREFIX):
            snapshots.append((len(message_lines), line, i + 1))
        elif line.strip():
            raise _corrupt(path, i + 1, "not a message or an environment snapshot")
    dicts = _parse_messages(path, message_lines, linenos)

    # positions only grow along the file, so the latest state is the last one in file order
    env: dict[str, Any] | None = None
    env_at: int | None = None
    env_line = 0
    for idx, d in enumerate(dicts):
        state = d.pop(ENV_KEY, None)
        if state is not None:
            env, env_at, env_line = state, idx + 1, linenos[idx]
    if snapshots and snapshots[-1][2] > env_line:
        at, line, lineno = snapshots[-1]
        env, env_at = _snapshot_state(path, line, lineno), at
    try:
        messages = [Message.from_dict(d) for d in dicts]
    except (KeyError, TypeError, ValueError) as e:
        raise SessionCorruptError(
            f"{path}: a line is not a valid message ({e}); restore the file from a backup"
        ) from None
    return LogContents(messages, env, env_at, torn)


def _snapshot_state(path: Path, line: bytes, lineno: int) -> dict[str, Any]:
    try:
        state = json.loads(line)[ENV_KEY]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise _corrupt(path, lineno, f"not a valid environment snapshot ({e})") from None
    if not isinstance(state, dict):
        raise _corrupt(path, lineno, "an environment snapshot that is not a JSON object")
    return state


def latest_environment(path: Path) -> dict[str, Any] | None:
    """The last environment state in the log (None if it has none), parsing only that line."""
    lines, _ = _split(path)
    needle = f'"{ENV_KEY}":'.encode()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if needle not in line:
            continue
        if line.startswith(SNAPSHOT_PREFIX):
            return _snapshot_state(path, line, i + 1)
        try:
            state = json.loads(line).get(ENV_KEY)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _corrupt(path, i + 1, f"not valid JSON ({e})") from None
        if isinstance(state, dict):
            return state
    return None


def count_messages(path: Path) -> int:
    """How many complete message lines the log holds (no JSON parsing)."""
    lines, _ = _split(path)
    return sum(1 for line in lines if line.startswith(MESSAGE_PREFIX))
