"""The scripted provider: deterministic, unique tool-call ids; the shared call path."""

from __future__ import annotations

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Message, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.providers.scripted import ScriptedModel, tool_call
from rollouts.run_config import RunConfig


def _ids(state: AgentState) -> list[str]:
    return [c.id for m in state.messages if m.role == "assistant" for c in m.get_tool_calls()]


async def test_scripted_tool_call_ids_do_not_repeat_when_another_process_continues_the_session() -> None:
    """Issue 13 item 14: a continuation made by a fresh model (another process: its call count
    starts again at 0) gave the same ids as the first run, so one conversation held two calls
    `call_1_0`. Ids now count the conversation's turns: unique in it, and deterministic."""
    replies = [tool_call("add", value=2), tool_call("add", value=3)]
    first = ScriptedModel(replies)
    start = AgentState(
        actor=Actor(Trajectory((Message("user", "Add 2 then 3."),)), first.endpoint),
        environment=CalculatorEnvironment(),
    )
    done = (await run_agent(start, RunConfig(max_turns=2)))[-1]
    assert _ids(done) == ["call_1_0", "call_2_0"]

    second = ScriptedModel(replies)  # what a new process has: a model that has made no calls
    more = done.with_messages(Message("user", "Again."))
    more = AgentState(actor=Actor(more.actor.trajectory, second.endpoint), environment=done.environment)
    again = (await run_agent(more, RunConfig(max_turns=2)))[-1]
    ids = _ids(again)
    assert ids == ["call_1_0", "call_2_0", "call_3_0", "call_4_0"]
    assert len(set(ids)) == len(ids)
    # every result answers its own call
    results = [m.tool_call_id for m in again.messages if m.role == "tool"]
    assert results == ids
