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
* a write that fails (disk full, a file size limit) is cut back to where it started, so an
  append is all or none and the same append can be retried;
* `session.json` is replaced atomically: temp file, fsync, rename, fsync of the directory.

Every record is written with known secret values masked (`rollouts.redaction.redact_json`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts._unicode import json_text_utf8
from rollouts.dtypes import Message
from rollouts.redaction import redact_json
from rollouts.store._codec import dumps, message_from_dict, message_to_dict, paused_gc
from rollouts.store.base import SessionCorruptError, SessionError, SessionRecoveryWarning

MESSAGE_PREFIX = b'{"role"'
SNAPSHOT_PREFIX = b'{"environment_state"'
ENV_KEY = "environment_state"
FILE_MODE = 0o600
DIR_MODE = 0o700
_TAIL_CHUNK = 1 << 16
_CHUNK = 1 << 16  # bytes of lines parsed at a time when reading a log


def encode_message(message: Message, environment_state: Mapping[str, Any] | None = None) -> bytes:
    """The log line (with its newline) for `message`, carrying `environment_state` if given."""
    d = message_to_dict(message)
    assert ENV_KEY not in d, "Message.to_dict must not use the log's reserved key"
    if environment_state is not None:
        d[ENV_KEY] = environment_state
    line = json_text_utf8(redact_json(dumps(d)))  # known secret values masked, any text kept
    assert line.startswith(MESSAGE_PREFIX), "Message.to_dict must start with 'role'"
    return line + b"\n"


def encode_snapshot(environment_state: Mapping[str, Any]) -> bytes:
    line = json_text_utf8(redact_json(dumps({ENV_KEY: environment_state})))
    assert line.startswith(SNAPSHOT_PREFIX)
    return line + b"\n"


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _append_or_undo(fd: int, size: int, data: bytes, fsync: bool) -> None:
    """Write `data` at the end of the file (`size` bytes, the lock held) and fsync if asked;
    if any of it fails (disk full, a file size limit), the file is cut back to `size`, so a
    failed append leaves nothing behind (the caller may retry the same append)."""
    try:
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise


def _cut_torn_tail(fd: int, path: Path, size: int) -> int:
    """If the file (`size` bytes) does not end with a newline, truncate it after its last newline
    (the bytes cut were never acknowledged: a writer died in the middle of its write). Returns
    the size after."""
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return size
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
    return keep


def open_log(path: Path) -> int:
    """An `O_APPEND` descriptor on an existing log (FileNotFoundError if there is none)."""
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)


def count_message_lines(chunk: bytes) -> int:
    """How many message lines `chunk` (whole lines, starting at a line boundary) holds."""
    return chunk.count(b"\n" + MESSAGE_PREFIX) + chunk.startswith(MESSAGE_PREFIX)


@dataclass(frozen=True)
class Tail:
    """What one writer last knew of a log: its inode, its size after that writer's append (a
    line boundary) and how many message lines it held then (None: not counted). If the file
    is still that size, nobody else has written since, and the count needs no reading."""

    ino: int
    size: int
    count: int | None


class LogConflict(Exception):
    """The log does not hold the number of messages an append was conditional on (the store
    turns it into SessionConflictError)."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.count = count


def append(
    path: Path,
    data: bytes,
    *,
    fsync: bool,
    blocking: bool,
    messages: int = 0,
    expected: int | None = None,
    tail: Tail | None = None,
) -> Tail | None:
    """Append `data` (whole lines, `messages` of them message lines) in one `write()` under the
    file's lock; fsync if asked. Returns what is known of the log after the append.

    With `expected`, the append is conditional: if the log does not hold exactly `expected`
    message lines, LogConflict is raised and nothing is written (the count is read under the
    lock, so two conditional writers never both succeed at the same position). `tail` (from
    this writer's previous append) spares reading the file when nobody else wrote since.

    With `blocking=False` returns None at once, having written nothing, if another writer holds
    the lock. Raises FileNotFoundError if the log does not exist."""
    assert data.endswith(b"\n"), "appends are whole lines"
    fd = open_log(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            st = os.fstat(fd)
            count: int | None = None
            if tail is not None and tail.ino == st.st_ino and tail.size == st.st_size:
                size, count = st.st_size, tail.count  # nobody wrote since our last append
            else:
                size = _cut_torn_tail(fd, path, st.st_size)
                if tail is not None and tail.ino == st.st_ino and tail.count is not None and size >= tail.size:
                    count = tail.count + count_message_lines(os.pread(fd, size - tail.size, tail.size))
            if expected is not None:
                if count is None:
                    count = count_message_lines(os.pread(fd, size, 0))
                if count != expected:
                    raise LogConflict(count)
            try:
                _append_or_undo(fd, size, data, fsync)
            except OSError as e:
                raise SessionError(f"cannot append to {path}: {e.strerror or e}") from e
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return Tail(st.st_ino, size + len(data), None if count is None else count + messages)


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
    payload = json_text_utf8(redact_json(json.dumps(data, ensure_ascii=False, indent=2))) + b"\n"
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
        size = _cut_torn_tail(self.fd, self.path, os.fstat(self.fd).st_size)
        _append_or_undo(self.fd, size, data, fsync=True)

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
    """What one log holds, up to a number of messages: the messages, the latest environment
    state at or before that point, and how many of the log's messages precede that state
    (None: the log holds no state)."""

    messages: list[Message]
    environment_state: dict[str, Any] | None
    environment_at: int | None


def _complete_lines(path: Path) -> bytes:
    """The log's complete lines (the bytes up to its last newline). An incomplete last line,
    left by an interrupted write, is ignored with a SessionRecoveryWarning."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        warnings.warn(
            SessionRecoveryWarning(
                f"{path}: ignored an incomplete last line ({len(data) - end} bytes) left by an interrupted write"
            ),
            stacklevel=3,
        )
        return data[:end]
    return data


def _prefix(body: bytes, limit: int) -> bytes:
    """The lines of `body` up to its `limit`-th message line, with the snapshots that follow it."""
    pos = count = 0
    while pos < len(body):
        if body.startswith(MESSAGE_PREFIX, pos):
            if count == limit:
                break
            count += 1
        pos = body.index(b"\n", pos) + 1
    return body[:pos]


def _corrupt(path: Path, lineno: int, why: str) -> SessionCorruptError:
    return SessionCorruptError(
        f"{path}:{lineno}: {why}; the file is damaged beyond an interrupted write. Restore it from a "
        "backup, or cut the file before this line to keep the messages above it"
    )


def _bad_line(path: Path, chunk: bytes, first: int) -> SessionCorruptError:
    """The error naming the first line of `chunk` (numbered from `first`) that is not valid JSON."""
    lines = chunk[:-1].split(b"\n")
    for i, line in enumerate(lines, first):
        try:
            json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _corrupt(path, i, f"not valid JSON ({e})")
    return _corrupt(path, first, f"the {len(lines)} lines from here are not valid JSON together")


def _record_chunks(path: Path, body: bytes) -> Iterator[tuple[int, list[Any]]]:
    """Every line of `body` (complete lines) parsed, about `_CHUNK` bytes of lines at a time:
    (the number of the chunk's first line, its records). Each chunk is one `json.loads` of a
    JSON array (several times faster than line by line; a line never holds a raw newline), and
    is small enough to stay in the CPU's cache while its records become objects, where one
    array of the whole log would be parsed, then read again from memory. On an error, the
    first bad line is named."""
    start, lineno, size = 0, 1, len(body)
    while start < size:
        end = body.index(b"\n", min(start + _CHUNK, size - 1)) + 1  # the end of a line
        chunk = body[start:end]
        lines = chunk.count(b"\n")
        try:
            records = json.loads(b"[" + chunk[:-1].replace(b"\n", b",") + b"]")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise _bad_line(path, chunk, lineno) from None
        if len(records) != lines:  # a line holding several values, e.g. `1, 2`
            raise _bad_line(path, chunk, lineno)
        yield lineno, records
        start, lineno = end, lineno + lines


def read_log(path: Path, limit: int | None = None) -> LogContents:
    """The first `limit` messages of the log (all if None) and the environment state there."""
    body = _complete_lines(path)
    if limit is not None:
        body = _prefix(body, limit)
    messages: list[Message] = []
    env: dict[str, Any] | None = None
    env_at: int | None = None
    with paused_gc():
        for first, records in _record_chunks(path, body):
            for i, record in enumerate(records, first):
                if type(record) is not dict:
                    raise _corrupt(path, i, "not a JSON object")
                if "role" in record:
                    state = record.pop(ENV_KEY, None)
                    try:
                        messages.append(message_from_dict(record))
                    except (KeyError, TypeError, ValueError) as e:
                        raise _corrupt(path, i, f"not a valid message ({e})") from None
                elif ENV_KEY in record and len(record) == 1:
                    state = record[ENV_KEY]
                else:
                    raise _corrupt(path, i, "not a message or an environment snapshot")
                if state is not None:
                    if type(state) is not dict:
                        raise _corrupt(path, i, "an environment state that is not a JSON object")
                    env, env_at = state, len(messages)  # positions only grow along the file
    return LogContents(messages, env, env_at)


def latest_environment(path: Path) -> dict[str, Any] | None:
    """The last environment state in the log (None if it has none), parsing only that line."""
    lines = _complete_lines(path).split(b"\n")[:-1]
    needle = f'"{ENV_KEY}":'.encode()
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        if needle not in line:
            continue
        try:
            state = json.loads(line).get(ENV_KEY)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise _corrupt(path, i + 1, f"not a valid log line ({e})") from None
        if isinstance(state, dict):
            return state
    return None


def count_messages(path: Path) -> int:
    """How many complete message lines the log holds (no JSON parsing)."""
    return count_message_lines(_complete_lines(path))
