"""Session persistence: the SessionStore protocol. (FileSessionStore lands with the sessions work.)"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollouts.dtypes import Endpoint, Message


class SessionStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(frozen=True)
class AgentSession:
    """A session's metadata (its messages are read separately)."""

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


@runtime_checkable
class SessionStore(Protocol):
    async def create(
        self,
        *,
        endpoint: Endpoint,
        environment_type: str | None = None,
        environment_state: Mapping[str, Any] | None = None,
        parent_id: str | None = None,
        branch_point: int | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> AgentSession: ...

    async def get(self, session_id: str) -> tuple[AgentSession, Sequence[Message]]: ...

    async def append_message(self, session_id: str, message: Message) -> None: ...

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | None = None,
        environment_state: Mapping[str, Any] | None = None,
        reward: float | Mapping[str, float] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> AgentSession: ...
