"""Client reuse: one client per endpoint per run (one connection for a whole multi-turn run), closed
when the run ends, however it ends; a call outside any run closes its own client."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import trio

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, StopReason, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.events import StreamEvent, TextDelta
from rollouts.providers._clients import ClientPool, client_scope
from rollouts.run_config import RunConfig
from rollouts.testing import FakeServer, FakeTurn, ScriptedReply, ScriptedToolCall, open_fake_server
from tests._provider_helpers import call

SCRIPT = [
    ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 5}),)),
    ScriptedReply(tool_calls=(ScriptedToolCall("multiply", {"value": 3}),)),
    ScriptedReply("15", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "15"}),)),
]
SDK_PROVIDERS = ["anthropic", "openai", "openai-responses", "google", "openai-compatible"]


def _endpoint(provider: str, srv: FakeServer, **kw: Any) -> Endpoint:
    if provider in ("anthropic", "google"):
        return Endpoint(provider, "fake-model", api_base=srv.url, api_key="k", **kw)
    return Endpoint(provider, "fake-model", api_base=srv.base_url, api_key="k", **kw)


def _state(endpoint: Endpoint) -> AgentState:
    msgs = (Message("system", "You are a calculator."), Message("user", "What is (0 + 5) * 3?"))
    return AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())


async def _all_closed(srv: FakeServer) -> None:
    """Wait (at most 2 s) until every connection the server saw has ended."""
    with trio.fail_after(2):
        await srv.wait_connections_closed()


@pytest.mark.parametrize("provider", SDK_PROVIDERS)
async def test_a_run_uses_one_client_per_endpoint_and_closes_it_on_exit(provider: str) -> None:
    async with open_fake_server(SCRIPT) as srv:
        states = await run_agent(_state(_endpoint(provider, srv)), RunConfig())
        assert states[-1].stop == StopReason.TASK_COMPLETED
        assert len(srv.scripted_requests) == 3
        assert srv.connections_opened == 1  # three model calls, one client, one kept-alive connection
        await _all_closed(srv)  # the run closed its client when it returned


async def test_the_lean_http_transport_closes_its_clients_when_the_run_ends() -> None:
    async with open_fake_server(SCRIPT) as srv:
        states = await run_agent(_state(_endpoint("openai-compatible", srv, transport="http")), RunConfig())
        assert states[-1].stop == StopReason.TASK_COMPLETED
        assert 1 <= srv.connections_opened <= 3  # requests are spread over a few pooled clients
        await _all_closed(srv)


async def test_switching_endpoints_mid_run_keeps_one_client_per_endpoint() -> None:
    async with open_fake_server(SCRIPT[:1] + SCRIPT[2:]) as a_srv, open_fake_server(SCRIPT[1:2]) as b_srv:
        a = _endpoint("anthropic", a_srv)
        b = _endpoint("openai", b_srv)

        def switch(state: AgentState) -> AgentState:  # a, b, a
            return replace(state, actor=replace(state.actor, endpoint=b if state.turn_idx == 1 else a))

        states = await run_agent(_state(a), RunConfig(on_step_start=switch))
        assert states[-1].stop == StopReason.TASK_COMPLETED
        assert (len(a_srv.scripted_requests), len(b_srv.scripted_requests)) == (2, 1)
        assert (a_srv.connections_opened, b_srv.connections_opened) == (1, 1)  # `a` reused after `b`
        await _all_closed(a_srv)
        await _all_closed(b_srv)


async def test_a_cancelled_run_closes_its_clients() -> None:
    async with open_fake_server([FakeTurn("word " * 400, event_delay=0.02)]) as srv:
        seen = 0

        async def on_chunk(event: StreamEvent) -> None:
            nonlocal seen
            if isinstance(event, TextDelta):
                seen += 1
                if seen == 3:
                    await trio.sleep_forever()

        with trio.move_on_after(0.5) as scope:
            await run_agent(_state(_endpoint("openai", srv)), RunConfig(on_chunk=on_chunk))
        assert scope.cancelled_caught
        await _all_closed(srv)
        assert srv.completed_streams == 0


@pytest.mark.parametrize("provider", SDK_PROVIDERS)
async def test_a_call_outside_any_run_closes_its_own_client(provider: str) -> None:
    async with open_fake_server(["hi", "again"]) as srv:
        actor = Actor(Trajectory((Message("user", "hi"),)), _endpoint(provider, srv))
        await call(actor)
        await call(actor)
        assert srv.connections_opened == 2  # nothing is pooled outside a client_scope()
        await _all_closed(srv)


async def test_nested_scopes_share_the_outer_pool_and_one_failing_close_does_not_leak_the_others() -> None:
    async with client_scope() as outer, client_scope() as inner:
        assert inner is outer

    closed: list[str] = []

    class Client:
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        async def aclose(self) -> None:
            closed.append(self.name)
            if self.fail:
                raise OSError(f"{self.name} failed to close")

    pool = ClientPool()
    for name, fail in (("a", False), ("b", True), ("c", False)):
        await pool.get(name, lambda name=name, fail=fail: Client(name, fail))  # type: ignore[misc]
    assert await pool.get("a", lambda: Client("other")) is not None and closed == []
    with pytest.raises(OSError, match="b failed"):
        await pool.aclose()
    assert closed == ["a", "b", "c"]
