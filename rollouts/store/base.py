"""What a session store is: `AgentSession` (a session's metadata), `SessionStatus`, the
`SessionStore` protocol, session ids and the errors a store raises."""

from __future__ import annotations

import builtins
import enum
import re
import secrets
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

from rollouts.dtypes import Endpoint, Message
from rollouts.errors import RolloutsError


class SessionStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"
    MAX_TURNS = "max_turns"  # stopped by a limit before the agent finished
    BUDGET_EXCEEDED = "budget_exceeded"
    NO_TOOL_CALLED = "no_tool_called"  # offered tools, the model ended with a text answer (without tools: completed)


class SessionError(RolloutsError):
    """A session cannot be read, written or branched as asked."""


class SessionNotFoundError(SessionError):
    """No session has this id in the store."""


class SessionConflictError(SessionError):
    """A conditional append found the session grown (or shrunk) since the caller read it: another
    process or task continued the same session. Nothing was written."""


class SessionCorruptError(SessionError):
    """A session's files are damaged beyond what crash recovery repairs (the message names the file)."""


class SessionRecoveryWarning(UserWarning):
    """A store repaired or skipped damage a crash left behind (an incomplete last line)."""


@dataclass(frozen=True)
class AgentSession:
    """A session's metadata (its messages are read separately).

    A branch (`parent_id` set) holds the first `branch_point` messages of its parent, read through
    the parent chain, followed by its own. `environment_state` is the environment's latest
    serialized state; `endpoint` never carries an API key.
    """

    session_id: str
    endpoint: Endpoint
    parent_id: str | None = None
    branch_point: int | None = None
    environment_type: str | None = None
    environment_state: Mapping[str, Any] | None = None
    status: SessionStatus = SessionStatus.PENDING
    reward: float | Mapping[str, float] | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    created_at: str = ""
    updated_at: str = ""

    def __post_init__(self) -> None:
        assert (self.parent_id is None) == (self.branch_point is None), (
            "a branch needs both parent_id and branch_point, a root session neither"
        )
        assert self.branch_point is None or self.branch_point >= 0, "branch_point must be >= 0"
        if not isinstance(self.status, SessionStatus):
            object.__setattr__(self, "status", SessionStatus(self.status))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; the endpoint is written without secrets."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["endpoint"] = self.endpoint.to_dict(exclude_secrets=True)
        d["status"] = self.status.value
        d["environment_state"] = dict(self.environment_state) if self.environment_state is not None else None
        d["reward"] = dict(self.reward) if isinstance(self.reward, Mapping) else self.reward
        d["tags"] = dict(self.tags)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentSession:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["endpoint"] = Endpoint.from_dict(data["endpoint"])
        kwargs["status"] = SessionStatus(data.get("status", SessionStatus.PENDING))
        kwargs["tags"] = dict(data.get("tags") or {})
        return cls(**kwargs)

    def with_updates(
        self,
        *,
        status: SessionStatus | None = None,
        environment_state: Mapping[str, Any] | None = None,
        reward: float | Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
        updated_at: str | None = None,
    ) -> AgentSession:
        """A copy with the given fields changed (None leaves a field alone; tags are merged)."""
        changes: dict[str, Any] = {}
        if status is not None:
            changes["status"] = SessionStatus(status)
        if environment_state is not None:
            changes["environment_state"] = environment_state
        if reward is not None:
            changes["reward"] = reward
        if tags is not None:
            changes["tags"] = {**self.tags, **tags}
        if updated_at is not None:
            changes["updated_at"] = updated_at
        return replace(self, **changes)


@runtime_checkable
class SessionStore(Protocol):
    """Where sessions live. Every message is appended as it happens; nothing is rewritten.

    `get` returns a session's metadata and its full history (a branch's parent prefix included).
    `append_message` may attach the environment's state after that message, so a resume or a
    branch at any point restores the environment exactly as it was there. With `expected_count`
    an append is conditional on the session holding that many messages (SessionConflictError
    otherwise, nothing written): two processes continuing one session cannot interleave turns.
    `append_messages` writes several at once (all or none).

    The agent loop uses `create`, `append_message(s)`, `message_count`, `get` and `update`; the rest
    serves people and tools (`rollouts sessions`, `resume_session`).
    """

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
    ) -> AgentSession: ...

    async def get(self, session_id: str) -> tuple[AgentSession, Sequence[Message]]: ...

    async def append_message(
        self,
        session_id: str,
        message: Message,
        *,
        environment_state: Mapping[str, Any] | None = None,
        expected_count: int | None = None,
    ) -> None: ...

    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        *,
        environment_state: Mapping[str, Any] | None = None,
        expected_count: int | None = None,
    ) -> None: ...

    async def message_count(self, session_id: str) -> int: ...

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        environment_state: Mapping[str, Any] | None = None,
        reward: float | Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> AgentSession: ...

    async def list(
        self,
        *,
        tags: Mapping[str, str] | None = None,
        status: SessionStatus | Collection[SessionStatus] | None = None,
        limit: int | None = None,
    ) -> builtins.list[AgentSession]: ...

    async def list_children(self, session_id: str) -> builtins.list[AgentSession]: ...

    async def branch(
        self, session_id: str, at_message_index: int, *, tags: Mapping[str, str] | None = None
    ) -> AgentSession: ...


# --------------------------------------------------------------------------------------------
# session ids
# --------------------------------------------------------------------------------------------

_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_.-]{0,127}$")
_id_lock = threading.Lock()
_last_us = 0


def new_session_id() -> str:
    """`20260115-093012-123456-a1b2c3`: UTC creation time to the microsecond, then 24 random bits.

    Ids sort by creation time (strictly increasing within a process, even when the clock steps
    back); the random suffix keeps ids made by different processes in the same microsecond
    apart, and the store creates each session directory exclusively, so a clash is retried."""
    global _last_us
    with _id_lock:
        us = max(time.time_ns() // 1000, _last_us + 1)
        _last_us = us
    secs, micros = divmod(us, 1_000_000)
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(secs))}-{micros:06d}-{secrets.token_hex(3)}"


def is_session_id(name: str) -> bool:
    """Whether `name` can name a session (letters, digits, `-`, `_`, `.`; never a path)."""
    return isinstance(name, str) and _ID.match(name) is not None and ".." not in name


def check_session_id(session_id: str) -> str:
    """`session_id` if it can name a session, else SessionNotFoundError."""
    if not is_session_id(session_id):
        raise SessionNotFoundError(
            f"{session_id!r} is not a session id (ids look like 20260115-093012-123456-a1b2c3; "
            "`rollouts sessions list` shows them)"
        )
    return session_id
