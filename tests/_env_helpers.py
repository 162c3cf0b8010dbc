"""Helpers shared by the environment tests: running the scripted agent, process liveness."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import trio

from rollouts import Actor, AgentState, Message, RunConfig, ScriptedModel, Trajectory, run_agent
from rollouts.environments.base import Environment
from rollouts.providers.scripted import ReplyLike, ScriptedReply, ScriptedToolCall


def calls(*pairs: tuple[str, dict[str, Any]]) -> ScriptedReply:
    """A reply with several tool calls: calls(("read", {"path": "a"}), ("bash", {...}))."""
    return ScriptedReply(tool_calls=tuple(ScriptedToolCall(n, a) for n, a in pairs))


async def run(
    env: Environment | None,
    replies: Sequence[ReplyLike],
    *,
    prompt: str = "do the task",
    state: AgentState | None = None,
    **rc: Any,
) -> list[AgentState]:
    """Run the agent on a list-scripted model; with `state`, continue that state instead."""
    model = ScriptedModel(list(replies))
    if state is None:
        state = AgentState(Actor(Trajectory((Message("user", prompt),)), model.endpoint), env)
    else:
        from dataclasses import replace

        actor = replace(state.actor, endpoint=model.endpoint)
        state = replace(state, actor=actor, environment=env, stop=None)
    return await run_agent(state, RunConfig(max_turns=rc.pop("max_turns", 20), **rc))


def tool_messages(state: AgentState) -> list[Message]:
    return [m for m in state.messages if m.role == "tool"]


def is_running(pid: int) -> bool:
    """True if `pid` exists and is not a zombie (a killed process nobody has reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    """Every live (non-zombie) process in session `sid`, from a full listing of /proc (what
    `ps -e -o pid,sid` shows). A bash command runs in its own session whose id is the shell's
    pid, so this finds every descendant that did not leave it, recorded or not."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state not in ("Z", "X"):
            members.append(int(entry))
    return members


async def wait_session_empty(sid: int, attempts: int = 200) -> list[int]:
    """Poll (bounded) until session `sid` has no live process; the ones still there at the end."""
    left = session_members(sid)
    for _ in range(attempts):
        if not left:
            break
        await trio.sleep(0.02)
        left = session_members(sid)
    return left


async def wait_dead(pid: int, attempts: int = 200) -> bool:
    """Poll (bounded) until `pid` is gone; SIGKILL delivery is asynchronous."""
    for _ in range(attempts):
        if not is_running(pid):
            return True
        await trio.sleep(0.02)
    return False
