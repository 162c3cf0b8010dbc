"""Resuming sessions in the agent loop: after a cancellation mid-tool, after a cancelled stream,
after SIGKILL mid-tool, and from a branch: the same environment state, the pending tool calls,
nothing recorded twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from _session_helpers import BLOCK_ENV, BlockingCalculator

from rollouts import (
    Actor,
    AgentState,
    Message,
    RunConfig,
    ScriptedModel,
    ScriptedReply,
    ScriptedToolCall,
    StopReason,
    ToolCallContent,
    Trajectory,
    run_agent,
)
from rollouts.events import StreamEvent, TextDelta
from rollouts.store import (
    FileSessionStore,
    SessionError,
    SessionStatus,
    pending_tool_calls,
    restore_environment,
    resume_session,
)

THREE_CALLS = ScriptedReply(
    text="Working.",
    tool_calls=(
        ScriptedToolCall("add", {"value": 2}, id="t_add2"),
        ScriptedToolCall("multiply", {"value": 10}, id="t_mul10"),
        ScriptedToolCall("add", {"value": 1}, id="t_add1"),
    ),
)
FINISH = ScriptedReply(tool_calls=(ScriptedToolCall("complete_task", {"final_result": "21"}, id="t_done"),))


def _start(model: ScriptedModel, env: object) -> AgentState:
    msgs = (Message("system", "You are a calculator."), Message("user", "What is (2 * 10) + 1?"))
    return AgentState(actor=Actor(Trajectory(msgs), model.endpoint), environment=env)  # type: ignore[arg-type]


def _tool_ids(messages: list[Message] | tuple[Message, ...]) -> list[str | None]:
    return [m.tool_call_id for m in messages if m.role == "tool"]


@pytest.fixture(autouse=True)
def _reset_blocking() -> None:
    BlockingCalculator.release = trio.Event()
    BlockingCalculator.entered = trio.Event()


async def test_resume_after_cancellation_mid_tool_continues_with_the_same_environment(tmp_path: Path) -> None:
    model = ScriptedModel([THREE_CALLS, FINISH])
    store = FileSessionStore(tmp_path)
    seen: list[AgentState] = []

    async def run() -> None:
        seen.extend(await run_agent(_start(model, BlockingCalculator()), RunConfig(session_store=store)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        assert BlockingCalculator.entered is not None
        await BlockingCalculator.entered.wait()  # multiply is running: cancel from outside
        nursery.cancel_scope.cancel()
    assert seen == []  # the cancellation propagated out of run_agent

    sid = (await store.list())[0].session_id
    session, messages = await FileSessionStore(tmp_path).get(sid)
    assert session.status == SessionStatus.ABORTED  # recorded, shielded, on the way out
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool"]
    assert session.environment_state == {"current_value": 2.0}  # after add(2), before multiply

    # a fresh store, as a new process would have
    state = await resume_session(FileSessionStore(tmp_path), sid)
    assert [c.id for c in state.pending_tool_calls] == ["t_add2", "t_mul10", "t_add1"]
    assert state.next_tool_idx == 1
    assert isinstance(state.environment, BlockingCalculator) and state.environment.current_value == 2
    assert state.messages == tuple(messages) and state.session_id == sid

    assert BlockingCalculator.release is not None
    BlockingCalculator.release.set()
    resumed = await run_agent(state, RunConfig(session_store=FileSessionStore(tmp_path)))
    final = resumed[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert final.environment is not None and final.environment.current_value == 21  # type: ignore[attr-defined]
    assert model.calls == 2  # the interrupted turn was not asked again

    session, stored = await store.get(sid)
    assert list(stored) == list(final.messages)  # the session and the state agree exactly
    assert _tool_ids(stored) == ["t_add2", "t_mul10", "t_add1", "t_done"]  # each result once
    assert session.status == SessionStatus.COMPLETED
    assert session.environment_state == {"current_value": 21.0}


async def test_resume_after_a_cancelled_stream_records_new_messages_once(tmp_path: Path) -> None:
    model = ScriptedModel([ScriptedReply("one two three four five six"), "Second answer."], chunk_size=4)
    store = FileSessionStore(tmp_path)
    cs = trio.CancelScope()
    deltas = 0

    async def on_chunk(event: StreamEvent) -> None:
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 2:
                cs.cancel()
                await trio.lowlevel.checkpoint()

    states = await run_agent(_start(model, None), RunConfig(on_chunk=on_chunk, cancel_scope=cs, session_store=store))
    aborted = states[-1]
    assert aborted.stop == StopReason.ABORTED
    sid = aborted.session_id
    assert sid is not None
    session, messages = await store.get(sid)
    assert session.status == SessionStatus.ABORTED
    assert list(messages) == list(aborted.messages)
    assert messages[-1].details == {"aborted": True} and messages[-1].text == "one two "

    state = await resume_session(store, sid)
    assert state.pending_tool_calls == () and state.environment is None
    question = Message("user", "Try again?")
    final = (await run_agent(state.with_messages(question), RunConfig(session_store=store)))[-1]
    assert final.messages[-1].text == "Second answer."
    _, stored = await store.get(sid)
    assert list(stored) == list(final.messages)
    assert Counter(m.text for m in stored)["Try again?"] == 1

    # a state that is behind its session is refused with the way out
    with pytest.raises(SessionError, match=r"has 4 messages but session .* has 5.*resume_session"):
        behind = replace(final, actor=replace(final.actor, trajectory=Trajectory(final.messages[:4])))
        await run_agent(behind, RunConfig(session_store=store))


async def test_a_branch_mid_turn_resumes_with_the_environment_of_that_point(tmp_path: Path) -> None:
    assert BlockingCalculator.release is not None
    BlockingCalculator.release.set()
    model = ScriptedModel([THREE_CALLS, FINISH])
    store = FileSessionStore(tmp_path)
    done = (await run_agent(_start(model, BlockingCalculator()), RunConfig(session_store=store)))[-1]
    assert done.environment is not None and done.environment.current_value == 21  # type: ignore[attr-defined]
    sid = done.session_id
    assert sid is not None
    _, original = await store.get(sid)

    # messages: system, user, assistant(3 calls), add, multiply, add, assistant, complete_task
    for at, value, next_idx in ((3, 0, 0), (4, 2, 1), (5, 20, 2)):
        branch = await store.branch(sid, at)
        state = await resume_session(store, branch.session_id, endpoint=ScriptedModel([FINISH]).endpoint)
        assert state.environment is not None and state.environment.current_value == value  # type: ignore[attr-defined]
        assert state.next_tool_idx == next_idx and len(state.pending_tool_calls) == 3
        final = (await run_agent(state, RunConfig(session_store=store)))[-1]
        assert final.environment is not None and final.environment.current_value == 21  # type: ignore[attr-defined]
        _, stored = await store.get(branch.session_id)
        assert list(stored[:at]) == list(original[:at])
        assert _tool_ids(stored) == ["t_add2", "t_mul10", "t_add1", "t_done"]
    assert list((await store.get(sid))[1]) == list(original)  # the original is untouched


_KILLED_RUN = """
import sys, trio
sys.path.insert(0, sys.argv[2])
from _session_helpers import BlockingCalculator
from rollouts import Actor, AgentState, Message, RunConfig, ScriptedModel, ScriptedReply, ScriptedToolCall, Trajectory, run_agent
from rollouts.store import FileSessionStore

reply = ScriptedReply(tool_calls=(
    ScriptedToolCall("add", {"value": 2}, id="t_add2"),
    ScriptedToolCall("multiply", {"value": 10}, id="t_mul10"),
    ScriptedToolCall("add", {"value": 1}, id="t_add1"),
))
model = ScriptedModel([reply])
state = AgentState(actor=Actor(Trajectory((Message("user", "What is (2 * 10) + 1?"),)), model.endpoint),
                   environment=BlockingCalculator())
trio.run(run_agent, state, RunConfig(session_store=FileSessionStore(sys.argv[1])))
"""


def _run_and_kill_mid_tool(root: Path) -> str:
    """Run the agent in a child process until `multiply` blocks, SIGKILL it, return the session id."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_RUN, str(root), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, BLOCK_ENV: "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("blocked "), line
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return line.split()[1]


async def test_resume_after_sigkill_mid_tool(tmp_path: Path) -> None:
    sid = _run_and_kill_mid_tool(tmp_path)
    store = FileSessionStore(tmp_path)
    session, _ = await store.get(sid)
    assert session.status == SessionStatus.RUNNING  # nobody could record the end
    assert BlockingCalculator.release is not None
    BlockingCalculator.release.set()
    state = await resume_session(store, sid, endpoint=ScriptedModel([FINISH]).endpoint)
    assert state.environment is not None and state.environment.current_value == 2  # type: ignore[attr-defined]
    assert state.next_tool_idx == 1
    final = (await run_agent(state, RunConfig(session_store=store)))[-1]
    assert final.environment is not None and final.environment.current_value == 21  # type: ignore[attr-defined]
    _, stored = await store.get(sid)
    assert _tool_ids(stored) == ["t_add2", "t_mul10", "t_add1", "t_done"]


def test_pending_tool_calls_of_a_history() -> None:
    a = Message("assistant", tuple(ToolCallContent(i, "add", {"value": 1}) for i in ("x", "y", "z")))
    tool = [Message("tool", "ok", tool_call_id=i) for i in ("x", "y", "z")]
    assert pending_tool_calls([Message("user", "q"), a]) == (a.get_tool_calls(), 0)
    assert pending_tool_calls([a, tool[0]]) == (a.get_tool_calls(), 1)
    assert pending_tool_calls([a, *tool]) == ((), 0)
    assert pending_tool_calls([a, tool[0], Message("user", "stop")]) == ((), 0)
    aborted = Message("assistant", a.content, details={"aborted": True})
    assert pending_tool_calls([aborted]) == ((), 0)  # a message cut short asks for nothing
    assert pending_tool_calls([Message("assistant", "just text")]) == ((), 0)
    assert pending_tool_calls([]) == ((), 0)


async def test_an_environment_that_cannot_be_imported_is_a_clear_error(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    s = await store.create(
        endpoint=ScriptedModel(["x"]).endpoint, environment_type="no_such_module:Env", environment_state={}
    )
    with pytest.raises(SessionError, match=r"cannot import its environment 'no_such_module:Env'.*PYTHONPATH"):
        await restore_environment((await store.get(s.session_id))[0])
