"""FileSessionStore: one directory per session, an append-only message log, atomic metadata.

    root/
      20260115-093012-123456-a1b2c3/
        session.json      metadata (AgentSession.to_dict(): the endpoint without its key)
        messages.jsonl    one message per line, appended; environment states tied to positions

A branch's directory holds only its own messages: its first `branch_point` messages are read
from its parent (and so on up the chain), never copied.
"""

from __future__ import annotations

import builtins
import os
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import trio

from rollouts.dtypes import Endpoint, Message, now_iso
from rollouts.store import _log
from rollouts.store.base import (
    AgentSession,
    SessionConflictError,
    SessionCorruptError,
    SessionError,
    SessionNotFoundError,
    SessionRecoveryWarning,
    SessionStatus,
    check_session_id,
    is_session_id,
    new_session_id,
)

SESSIONS_DIR_ENV = "ROLLOUTS_SESSIONS_DIR"
DEFAULT_SESSIONS_DIR = "~/.rollouts/sessions"
_META = "session.json"
_LOG = "messages.jsonl"
_MAX_CHAIN = 10_000
_PATH_CACHE = 4096


def default_sessions_dir() -> Path:
    """`$ROLLOUTS_SESSIONS_DIR`, else `~/.rollouts/sessions`."""
    return Path(os.environ.get(SESSIONS_DIR_ENV) or DEFAULT_SESSIONS_DIR).expanduser()


class FileSessionStore:
    """Sessions as files under `root` (default: `$ROLLOUTS_SESSIONS_DIR`, else `~/.rollouts/sessions`).

    Durability: an appended message is written with one `write()` before `append_message`
    returns, so it survives the process being killed. `fsync_every` decides when it also
    survives the machine losing power: 1 (the default) fsyncs every message; N > 1 fsyncs every
    N-th message of a session (batching), and `update()` and `aclose()` fsync what is pending;
    0 leaves message fsyncs to `update()`/`aclose()` alone.

    Trio: an append's write runs directly on the event loop: flock, write, unlock on the page
    cache cost microseconds, while a trip through `trio.to_thread.run_sync` costs 5-10x that
    (`benchmarks/store.py` measures both). Only the fsync (0.5-3 ms), once the line is written,
    runs in a worker thread (shielded), and so does whatever reads or writes whole files (get,
    update, branch, list). If another writer holds a session's lock, the append waits for it
    in a thread, never on the event loop. Appends are atomic under cancellation: either the
    message is written, or `trio.Cancelled` is raised before anything was. `append_messages`
    writes several messages in one `write()`.

    Two writers continuing one session: pass `expected_count` and an append is conditional on
    the session's length, checked under the log's lock (SessionConflictError, nothing written,
    if it grew). The agent loop always does: two runs never interleave their turns.

    Files are private to the user (directories 0700, files 0600).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None, *, fsync_every: int = 1) -> None:
        if fsync_every < 0:
            raise ValueError(f"fsync_every must be >= 0 (1: every message, N: every N-th), got {fsync_every}")
        self.root = Path(root).expanduser() if root is not None else default_sessions_dir()
        self.fsync_every = fsync_every
        self._unsynced: dict[str, int] = {}
        self._log_paths: dict[str, Path] = {}
        self._tails: dict[str, _log.Tail] = {}  # what this store last wrote to each log
        self._bases: dict[str, int] = {}  # each session's branch point (never changes)

    def __repr__(self) -> str:
        return f"FileSessionStore({str(self.root)!r}, fsync_every={self.fsync_every})"

    async def __aenter__(self) -> FileSessionStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """fsync every message appended through this store that is not yet synced."""
        pending = [sid for sid, n in self._unsynced.items() if n]
        if pending:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._sync_logs, pending)

    def _sync_logs(self, session_ids: builtins.list[str]) -> None:
        for sid in session_ids:
            try:
                _log.fsync_file(self._log_path(sid))
            except FileNotFoundError:
                pass
            self._unsynced[sid] = 0

    # ----------------------------------------------------------------------------------------
    # paths and metadata
    # ----------------------------------------------------------------------------------------

    def _dir(self, session_id: str) -> Path:
        return self.root / check_session_id(session_id)

    def _log_path(self, session_id: str) -> Path:
        path = self._log_paths.get(session_id)
        if path is None:  # building paths costs more than the append's syscalls: keep them
            if len(self._log_paths) >= _PATH_CACHE:
                self._log_paths.clear()
            path = self._log_paths[session_id] = self._dir(session_id) / _LOG
        return path

    def _not_found(self, session_id: str) -> SessionNotFoundError:
        return SessionNotFoundError(
            f"no session {session_id!r} in {self.root} (`rollouts sessions list` shows the sessions there; "
            f"set ${SESSIONS_DIR_ENV} or --sessions-dir if they live elsewhere)"
        )

    def _read_meta(self, session_id: str) -> AgentSession:
        path = self._dir(session_id) / _META
        try:
            data = _log.read_json(path)
        except FileNotFoundError:
            if self._dir(session_id).is_dir():
                raise SessionCorruptError(
                    f"{path} is missing; the directory {path.parent} is not a complete session (delete it)"
                ) from None
            raise self._not_found(session_id) from None
        try:
            session = AgentSession.from_dict(data)
        except (KeyError, TypeError, ValueError, AssertionError) as e:
            raise SessionCorruptError(f"{path} is not valid session metadata ({e}); restore it from a backup") from None
        if session.session_id != session_id:
            raise SessionCorruptError(f"{path} names session {session.session_id!r}, not {session_id!r}")
        return session

    def _read_own_log(self, session_id: str, limit: int | None = None) -> _log.LogContents:
        try:
            return _log.read_log(self._log_path(session_id), limit)
        except FileNotFoundError:
            raise SessionCorruptError(
                f"{self._log_path(session_id)} is missing; the session's messages are lost"
            ) from None

    # ----------------------------------------------------------------------------------------
    # reading a history through the parent chain (blocking)
    # ----------------------------------------------------------------------------------------

    def _history(
        self, session: AgentSession, limit: int | None = None
    ) -> tuple[builtins.list[Message], dict[str, Any] | None]:
        """The first `limit` messages of `session` (all if None), and the environment state there."""
        chain = [session]
        while chain[-1].parent_id is not None:
            if len(chain) > _MAX_CHAIN:
                raise SessionCorruptError(f"session {session.session_id}: its parent chain loops")
            parent_id = chain[-1].parent_id
            try:
                chain.append(self._read_meta(parent_id))
            except SessionNotFoundError:
                raise SessionCorruptError(
                    f"session {chain[-1].session_id} is a branch of {parent_id}, which is missing from {self.root}"
                ) from None
        # limits, root first: each session needs min(its parent's branch point, what its child needs)
        limits: builtins.list[int | None] = [limit]
        for s in chain[:-1]:
            want = limits[-1]
            assert s.branch_point is not None
            limits.append(s.branch_point if want is None else min(want, s.branch_point))
        messages: builtins.list[Message] = []
        env: dict[str, Any] | None = None
        for s, lim in zip(reversed(chain), reversed(limits), strict=True):
            base = s.branch_point or 0
            if lim is not None and lim < base:
                continue  # the history asked for ends before this branch's own messages
            if len(messages) != base:
                raise SessionCorruptError(
                    f"session {s.session_id} branches at message {base} of {s.parent_id}, "
                    f"which has only {len(messages)} messages"
                )
            own = self._read_own_log(s.session_id, None if lim is None else lim - base)
            messages.extend(own.messages)
            if own.environment_state is not None:
                env = own.environment_state
        return messages, env

    # ----------------------------------------------------------------------------------------
    # the SessionStore operations
    # ----------------------------------------------------------------------------------------

    async def create(
        self,
        *,
        endpoint: Endpoint,
        environment_type: str | None = None,
        environment_state: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        branch_point: int | None = None,
        tags: Mapping[str, str] | None = None,
        status: SessionStatus = SessionStatus.PENDING,
    ) -> AgentSession:
        """A new, empty session (a branch of `parent_id` if given, holding its first `branch_point`
        messages). Its initial environment state is recorded at position 0 of its log."""
        if (parent_id is None) != (branch_point is None):
            raise ValueError("give both parent_id and branch_point (a branch), or neither (a new session)")
        now = now_iso()
        template = AgentSession(
            session_id="-",
            endpoint=endpoint,
            parent_id=parent_id,
            branch_point=branch_point,
            environment_type=environment_type,
            environment_state=dict(environment_state) if environment_state is not None else None,
            status=SessionStatus(status),
            tags=dict(tags or {}),
            created_at=now,
            updated_at=now,
        )
        return await trio.to_thread.run_sync(self._create_sync, template)

    def _create_sync(self, template: AgentSession) -> AgentSession:
        if template.parent_id is not None:
            assert template.branch_point is not None
            self._check_branch_point(template.parent_id, template.branch_point)
        self.root.mkdir(parents=True, exist_ok=True, mode=_log.DIR_MODE)
        for _ in range(100):
            session_id = new_session_id()
            try:
                os.mkdir(self.root / session_id, _log.DIR_MODE)
                break
            except FileExistsError:
                continue
        else:
            raise SessionError(f"could not find a free session id in {self.root}")
        session = replace(template, session_id=session_id)
        directory = self.root / session_id
        log = directory / _LOG
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, _log.FILE_MODE)
        try:
            if session.environment_state is not None:
                os.write(fd, _log.encode_snapshot(session.environment_state))
            os.fsync(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        # this store knows the new log: its first conditional append needs no reading
        self._remember(session_id, _log.Tail(st.st_ino, st.st_size, 0), session.branch_point or 0)
        # session.json last: a directory without it is an incomplete creation, never a session
        _log.write_json_atomic(directory / _META, session.to_dict())
        _log.fsync_dir(self.root)
        return session

    async def get(self, session_id: str) -> tuple[AgentSession, Sequence[Message]]:
        """The session's metadata (with its latest environment state) and its full history.

        An incomplete last line left by a crash is skipped with a SessionRecoveryWarning."""
        return await trio.to_thread.run_sync(self._get_sync, session_id)

    def _get_sync(self, session_id: str) -> tuple[AgentSession, builtins.list[Message]]:
        session = self._read_meta(session_id)
        messages, env = self._history(session)
        if env is not None:
            session = session.with_updates(environment_state=env)
        return session, messages

    async def metadata(self, session_id: str) -> AgentSession:
        """The session's metadata as stored (its messages are not read)."""
        return await trio.to_thread.run_sync(self._read_meta, session_id)

    async def messages(self, session_id: str, limit: int | None = None) -> builtins.list[Message]:
        """The first `limit` messages of the session's history (all if None), e.g. for a preview."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        return await trio.to_thread.run_sync(lambda: self._history(self._read_meta(session_id), limit)[0])

    async def append_message(
        self,
        session_id: str,
        message: Message,
        *,
        environment_state: Mapping[str, Any] | None = None,
        expected_count: int | None = None,
    ) -> None:
        """Append `message` (with the environment's state after it, if given) to the session's log.

        With `expected_count` (how many messages the caller knows the session holds), the append
        is conditional: if the session has grown (or shrunk) meanwhile, e.g. another process
        continued it, SessionConflictError is raised and nothing is written. The check and the
        write happen under the log's lock, so of two writers at the same position only one wins."""
        data = _log.encode_message(message, environment_state)
        await self._append(session_id, data, 1, expected_count)

    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        environment_state: Mapping[str, Any] | None = None,
        expected_count: int | None = None,
    ) -> None:
        """Append several messages in one write (all or none), the environment's state after the
        last one going with it. `expected_count` as for `append_message`. `fsync_every` counts
        each message: the batch is fsynced (once) if it brings the messages not yet fsynced to
        `fsync_every` or more, so never more than `fsync_every - 1` acknowledged messages wait
        for an fsync, as with one message at a time."""
        if not messages:
            await trio.lowlevel.checkpoint()
            return
        last = len(messages) - 1
        data = b"".join(
            _log.encode_message(m, environment_state if i == last else None) for i, m in enumerate(messages)
        )
        await self._append(session_id, data, len(messages), expected_count)

    async def _append(self, session_id: str, data: bytes, n: int, expected_count: int | None) -> None:
        """Write on the event loop when the log's lock is free (a small write to the page cache
        costs microseconds; a thread hop costs 5-10x that), in a worker thread when it is held or
        the file must be read first; an fsync always runs in a worker thread, shielded."""
        path = self._log_path(session_id)
        unsynced = self._unsynced.get(session_id, 0) + n
        sync = self.fsync_every > 0 and unsynced >= self.fsync_every
        await trio.lowlevel.checkpoint_if_cancelled()
        tail = self._tails.get(session_id)
        base = self._bases.get(session_id) if expected_count is not None else 0

        def in_thread() -> _log.Tail | None:
            own = None if expected_count is None else expected_count - self._base_sync(session_id)
            return _log.append(path, data, fsync=False, blocking=True, messages=n, expected=own, tail=tail)

        try:
            new: _log.Tail | None = None
            if base is not None and (expected_count is None or (tail is not None and tail.count is not None)):
                own = None if expected_count is None else expected_count - base
                new = _log.append(path, data, fsync=False, blocking=False, messages=n, expected=own, tail=tail)
            if new is None:  # the lock is held elsewhere, or the log must be counted: not on the loop
                new = await trio.to_thread.run_sync(in_thread)
        except FileNotFoundError:
            if not path.parent.is_dir():
                raise self._not_found(session_id) from None
            raise SessionCorruptError(f"{path} is missing; the session's messages are lost") from None
        except _log.LogConflict as e:
            assert expected_count is not None
            actual = e.count + self._bases.get(session_id, 0)
            raise SessionConflictError(
                f"session {session_id} now holds {actual} messages, not the {expected_count} this append "
                "expected: another process or task continued it meanwhile, and nothing was written. "
                f"Resume it again (resume_session, or `rollouts run --session {session_id}`) to continue "
                "from its latest message"
            ) from None
        assert new is not None
        self._remember(session_id, new)
        if sync:  # the line is written: make it durable whatever is cancelled meanwhile
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_log.fsync_file, path)
            unsynced = 0
        self._unsynced[session_id] = unsynced
        await trio.lowlevel.cancel_shielded_checkpoint()

    def _remember(self, session_id: str, tail: _log.Tail, base: int | None = None) -> None:
        if len(self._tails) >= _PATH_CACHE:
            self._tails.clear()
        self._tails[session_id] = tail
        if base is not None:
            if len(self._bases) >= _PATH_CACHE:
                self._bases.clear()
            self._bases[session_id] = base

    def _base_sync(self, session_id: str) -> int:
        """How many messages the session reads through its parent (its branch point), cached."""
        base = self._bases.get(session_id)
        if base is None:
            base = self._read_meta(session_id).branch_point or 0
            if len(self._bases) >= _PATH_CACHE:
                self._bases.clear()
            self._bases[session_id] = base
        return base

    async def message_count(self, session_id: str) -> int:
        """How many messages `get` would return (without parsing them)."""
        return await trio.to_thread.run_sync(self._count_sync, session_id)

    def _count_sync(self, session_id: str) -> int:
        session = self._read_meta(session_id)
        try:
            own = _log.count_messages(self._log_path(session_id))
        except FileNotFoundError:
            raise SessionCorruptError(f"{self._log_path(session_id)} is missing") from None
        return (session.branch_point or 0) + own

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        environment_state: Mapping[str, Any] | None = None,
        reward: float | Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> AgentSession:
        """Change the metadata atomically (tags are merged). An environment state is also
        appended to the log at the current position. Pending message appends are fsynced."""
        return await trio.to_thread.run_sync(
            lambda: self._update_sync(session_id, status, environment_state, reward, tags)
        )

    def _update_sync(
        self,
        session_id: str,
        status: SessionStatus | None,
        environment_state: Mapping[str, Any] | None,
        reward: float | Mapping[str, float] | None,
        tags: Mapping[str, str] | None,
    ) -> AgentSession:
        path = self._log_path(session_id)
        lock = _log.LogLock(path)
        try:
            lock.acquire()
        except FileNotFoundError:
            self._read_meta(session_id)  # raises not-found or corrupt
            raise SessionCorruptError(f"{path} is missing; the session's messages are lost") from None
        try:
            if environment_state is not None:
                lock.append(_log.encode_snapshot(environment_state))
            else:
                os.fsync(lock.fd)
            self._unsynced[session_id] = 0
            session = self._read_meta(session_id).with_updates(
                status=status, environment_state=environment_state, reward=reward, tags=tags, updated_at=now_iso()
            )
            _log.write_json_atomic(self._dir(session_id) / _META, session.to_dict())
            if environment_state is None:  # report the latest state, as get() does
                latest = _log.latest_environment(path)
                if latest is not None:
                    session = session.with_updates(environment_state=latest)
        finally:
            lock.release()
        return session

    async def list(
        self,
        *,
        tags: Mapping[str, str] | None = None,
        status: SessionStatus | Collection[SessionStatus] | None = None,
        limit: int | None = None,
    ) -> builtins.list[AgentSession]:
        """Sessions newest first, keeping those whose tags include every `tags` item and whose
        status is `status` (or one of them); at most `limit`. Damaged sessions are skipped
        with a SessionRecoveryWarning."""
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        wanted: set[SessionStatus] | None = None
        if status is not None:
            wanted = {SessionStatus(status)} if isinstance(status, str) else {SessionStatus(s) for s in status}

        def keep(s: AgentSession) -> bool:
            if wanted is not None and s.status not in wanted:
                return False
            return all(s.tags.get(k) == v for k, v in (tags or {}).items())

        return await trio.to_thread.run_sync(self._scan, keep, limit, None)

    async def list_children(self, session_id: str) -> builtins.list[AgentSession]:
        """The direct branches of a session, oldest first."""
        check_session_id(session_id)
        await trio.to_thread.run_sync(self._read_meta, session_id)
        found = await trio.to_thread.run_sync(self._scan, lambda s: s.parent_id == session_id, None, session_id)
        return found[::-1]

    def _scan(
        self, keep: Callable[[AgentSession], bool], limit: int | None, after: str | None
    ) -> builtins.list[AgentSession]:
        try:
            names = sorted((e.name for e in os.scandir(self.root) if e.is_dir()), reverse=True)
        except FileNotFoundError:
            return []
        found: builtins.list[AgentSession] = []
        for name in names:
            if limit is not None and len(found) >= limit:
                break
            if after is not None and name <= after:
                break  # ids sort by creation time: a child is newer than its parent
            if not is_session_id(name) or not (self.root / name / _META).is_file():
                continue  # not a session, or one being created
            try:
                session = self._read_meta(name)
            except SessionError as e:
                warnings.warn(SessionRecoveryWarning(f"skipped a damaged session: {e}"), stacklevel=2)
                continue
            if keep(session):
                found.append(session)
        return found

    async def branch(
        self, session_id: str, at_message_index: int, *, tags: Mapping[str, str] | None = None
    ) -> AgentSession:
        """A new session holding the first `at_message_index` messages of `session_id` (read
        through the parent, not copied), with the environment as it was at that point. It has
        the parent's endpoint and environment type, and the parent's tags updated with `tags`."""
        return await trio.to_thread.run_sync(lambda: self._branch_sync(session_id, at_message_index, tags))

    def _check_branch_point(self, session_id: str, at: int) -> None:
        n = self._count_sync(session_id)
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at <= n:
            raise SessionError(
                f"cannot branch session {session_id} at message {at!r}: it has {n} messages (use 0..{n})"
            )

    def _branch_sync(self, session_id: str, at: int, tags: Mapping[str, str] | None) -> AgentSession:
        parent = self._read_meta(session_id)
        self._check_branch_point(session_id, at)
        _, env = self._history(parent, at)
        now = now_iso()
        template = AgentSession(
            session_id="-",
            endpoint=parent.endpoint,
            parent_id=session_id,
            branch_point=at,
            environment_type=parent.environment_type,
            environment_state=env,
            status=SessionStatus.PENDING,
            tags={**parent.tags, **(tags or {})},
            created_at=now,
            updated_at=now,
        )
        return self._create_sync(template)
