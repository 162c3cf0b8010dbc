"""Turning a stored session back into an `AgentState` that `run_agent` continues.

    store = FileSessionStore()
    state = await resume_session(store, session_id, api_key=os.environ["ANTHROPIC_API_KEY"])
    states = await run_agent(state.with_messages(Message("user", "and then?")), RunConfig(session_store=store))

The loop records only what the session does not hold yet, so nothing is appended twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rollouts.dtypes import Actor, AgentState, Endpoint, Message, ToolCall, Trajectory
from rollouts.environments.base import Environment, load_environment_class
from rollouts.store.base import AgentSession, SessionError, SessionStore


def pending_tool_calls(messages: Sequence[Message]) -> tuple[tuple[ToolCall, ...], int]:
    """The tool calls of the last assistant message and how many of them are already answered
    (`(calls, next_tool_idx)`). A message cut short by an abort (`details.aborted`) asks for
    nothing: the model never finished it, so its calls are not run."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if m.role == "assistant":
            if m.details and m.details.get("aborted"):
                return (), 0
            calls = m.get_tool_calls()
            answered = {t.tool_call_id for t in messages[i + 1 :] if t.role == "tool"}
            done = 0
            for call in calls:
                if call.id not in answered:
                    break
                done += 1
            return (calls, done) if done < len(calls) else ((), 0)
        if m.role == "user":
            return (), 0
    return (), 0


async def restore_environment(session: AgentSession) -> Environment | None:
    """The session's environment rebuilt from its latest state (`deserialize`), or None."""
    type_name = session.environment_type
    if type_name is None:
        return None
    try:
        cls = load_environment_class(type_name)
    except (ImportError, AttributeError, ValueError) as e:
        raise SessionError(
            f"session {session.session_id}: cannot import its environment {type_name!r} ({e}); "
            "make that module importable (install it or add it to PYTHONPATH)"
        ) from None
    if session.environment_state is None:
        try:
            return cls()
        except TypeError as e:
            raise SessionError(
                f"session {session.session_id} has no saved state for {type_name} and it cannot be "
                f"built without arguments ({e})"
            ) from None
    return await cls.deserialize(dict(session.environment_state))


async def resume_session(
    store: SessionStore, session_id: str, *, endpoint: Endpoint | None = None, api_key: str = ""
) -> AgentState:
    """The state to continue `session_id` from: its whole history, its environment as it was
    after the last recorded message, and the tool calls of an interrupted turn still pending
    (`run_agent` runs those first).

    Sessions are stored without API keys: pass `api_key` for the stored endpoint, or a whole
    `endpoint` to continue with another model."""
    session, messages = await store.get(session_id)
    environment = await restore_environment(session)
    calls, done = pending_tool_calls(messages)
    actor_endpoint = endpoint if endpoint is not None else replace(session.endpoint, api_key=api_key)
    return AgentState(
        actor=Actor(Trajectory(tuple(messages)), actor_endpoint),
        environment=environment,
        pending_tool_calls=calls,
        next_tool_idx=done,
        session_id=session.session_id,
        parent_session_id=session.parent_id,
        branch_point=session.branch_point,
    )
