"""Sessions: every conversation kept, resumable where it stopped, branchable from any message.

    store = FileSessionStore()                      # ~/.rollouts/sessions or $ROLLOUTS_SESSIONS_DIR
    states = await run_agent(state, RunConfig(session_store=store))
    sid = states[-1].session_id
    branch = await store.branch(sid, 2)             # the first 2 messages, read through the parent
    state = await resume_session(store, branch.session_id, api_key=key)

`base` defines the protocol and metadata, `files` the file store, `_log` its on-disk format and
crash safety, `resume` the way back to an `AgentState`.
"""

from rollouts.store.base import (
    AgentSession,
    SessionConflictError,
    SessionCorruptError,
    SessionError,
    SessionNotFoundError,
    SessionRecoveryWarning,
    SessionStatus,
    SessionStore,
    new_session_id,
)
from rollouts.store.files import DEFAULT_SESSIONS_DIR, SESSIONS_DIR_ENV, FileSessionStore, default_sessions_dir
from rollouts.store.resume import pending_tool_calls, restore_environment, resume_session

__all__ = [
    "DEFAULT_SESSIONS_DIR",
    "SESSIONS_DIR_ENV",
    "AgentSession",
    "FileSessionStore",
    "SessionConflictError",
    "SessionCorruptError",
    "SessionError",
    "SessionNotFoundError",
    "SessionRecoveryWarning",
    "SessionStatus",
    "SessionStore",
    "default_sessions_dir",
    "new_session_id",
    "pending_tool_calls",
    "restore_environment",
    "resume_session",
]
