"""Issue 33 item 3: cancel after a handler-injected message. When `on_step_start` injected a
message (`inject_turn_warning`) and the run was cancelled while the model streamed, the session
kept the injected message but the returned state dropped it, the partial reply was not recorded
(the conditional append's conflict was silently ignored) and the session stayed `running`.
The returned state and the session agree at every cancellation point."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from rollouts import Message, RunConfig, ScriptedModel, inject_turn_warning, run_agent
from rollouts.dtypes import Actor, AgentState, StopReason, Trajectory
from rollouts.events import StreamEvent, TextDelta
from rollouts.store import FileSessionStore, SessionStatus


@pytest.mark.parametrize("graceful", [True, False])
async def test_cancel_after_injected_message_state_and_session_agree(tmp_path: Path, graceful: bool) -> None:
    store = FileSessionStore(tmp_path)
    model = ScriptedModel(["a long reply, streamed in many small pieces " * 4], chunk_size=4)
    scope = trio.CancelScope()
    deltas = 0

    async def on_chunk(event: StreamEvent) -> None:
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 3:
                scope.cancel()

    rc = RunConfig(
        session_store=store,
        on_step_start=inject_turn_warning(max_turns=2, warning_at=2),
        on_chunk=on_chunk,
        max_turns=2,
        cancel_scope=scope if graceful else None,
    )
    state = AgentState(actor=Actor(Trajectory((Message("user", "hi"),)), model.endpoint))
    if graceful:
        states = await run_agent(state, rc)
        final = states[-1]
        session_id = final.session_id
    else:  # cancelled from outside: the run raises, the session still records the abort
        with scope:
            await run_agent(state, rc)
        assert scope.cancelled_caught
        session_id = (await store.list())[0].session_id
        final = None
    assert session_id is not None
    session, messages = await store.get(session_id)
    assert session.status == SessionStatus.ABORTED
    roles = [m.role for m in messages]
    assert roles == ["user", "user", "assistant"]  # the question, the injected warning, the partial reply
    assert messages[1].details == {"injected": "turn_warning"}
    assert messages[2].details is not None and messages[2].details.get("aborted") is True
    assert 0 < len(messages[2].text) < len("a long reply, streamed in many small pieces " * 4)
    if final is not None:
        assert final.stop == StopReason.ABORTED
        assert final.actor.trajectory.messages == tuple(messages)
