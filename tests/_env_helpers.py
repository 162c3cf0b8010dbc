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


async def wait_dead(pid: int, attempts: int = 200) -> bool:
    """Poll (bounded) until `pid` is gone; SIGKILL delivery is asynchronous."""
    for _ in range(attempts):
        if not is_running(pid):
            return True
        await trio.sleep(0.02)
    return False
