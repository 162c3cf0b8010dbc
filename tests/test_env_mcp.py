"""MCPEnvironment against a real MCP server (tests/_mcp_server.py, written with the SDK's server
API) started over stdio and over streamable HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from _env_helpers import run, tool_messages

from rollouts import Message, RunConfig, ScriptedModel, ToolCall, ToolResult, tool_call
from rollouts.environments import check_environment, compose
from rollouts.environments._mcp_connection import _LIVE
from rollouts.environments.base import clone_environment
from rollouts.environments.compose import ComposedEnvironment
from rollouts.environments.mcp import MCPEnvironment, MCPServer
from rollouts.errors import ConfigurationError
from rollouts.eval.run import EvalConfig, evaluate
from rollouts.store import FileSessionStore, resume_session

SERVER = str(Path(__file__).with_name("_mcp_server.py"))
STDIO = MCPServer.stdio([sys.executable, SERVER, "stdio"])


@dataclass
class HttpServer:
    url: str
    port: int
    process: trio.Process


async def _start_http(port: int = 0) -> HttpServer:
    proc = await trio.lowlevel.open_process(
        [sys.executable, SERVER, "http", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    line = b""
    with trio.fail_after(60):
        while not line.endswith(b"\n"):  # the server prints its port once it listens
            chunk = await proc.stdout.receive_some(1)
            assert chunk, "the test MCP server exited before listening"
            line += chunk
    port = int(line.split()[1])
    return HttpServer(f"http://127.0.0.1:{port}/mcp", port, proc)


async def _stop(server: HttpServer) -> None:
    server.process.kill()
    await server.process.wait()


@pytest.fixture
async def http() -> AsyncIterator[HttpServer]:
    server = await _start_http()
    try:
        yield server
    finally:
        await _stop(server)


async def _call(env: Any, name: str, **args: Any) -> ToolResult:
    return await env.exec_tool(ToolCall("c1", name, args), None, RunConfig())  # type: ignore[no-any-return]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def _wait_until(predicate: Any, seconds: float = 20) -> bool:
    """Poll a condition on the outside world (a process, a file) at most `seconds`."""
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return True
        await trio.sleep(0.02)
    return bool(predicate())


async def _wait_dead(pid: int) -> bool:
    return await _wait_until(lambda: not _alive(pid))


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_mcp_tools_are_listed_with_their_json_schemas(transport: str, http: HttpServer) -> None:
    env = await MCPEnvironment.connect(STDIO if transport == "stdio" else MCPServer.http(http.url))
    try:
        tools = {t.name: t for t in env.get_tools()}
        assert {"add", "echo", "fail", "pid", "hang", "remember", "recall", "whoami"} <= set(tools)
        add = tools["add"]
        assert add.description == "Add two integers."
        assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == ["a", "b"]
        r = await _call(env, "add", a=2, b=40)
        assert not r.is_error and json.loads(r.content) == {"sum": 42}
        assert r.details is not None and r.details["structured_content"] == {"sum": 42}
        await check_environment(env, calls=[ToolCall("1", "echo", {"text": "round trip"})])
    finally:
        await env.aclose()


async def test_run_agent_calls_mcp_tools_from_a_scripted_model() -> None:
    env = await MCPEnvironment.connect(STDIO)
    try:
        states = await run(
            env,
            [tool_call("add", a=20, b=22), tool_call("echo", text="sum is 42"), "The answer is 42."],
        )
        results = tool_messages(states[-1])
        assert [json.loads(results[0].text)["sum"], results[1].text] == [42, "sum is 42"]
        assert not any(m.is_error for m in results)
        assert states[-1].messages[-1].text == "The answer is 42."
    finally:
        await env.aclose()


async def test_mcp_errors_become_error_results() -> None:
    env = await MCPEnvironment.connect(STDIO)
    try:
        r = await _call(env, "fail", message="boom")
        assert r.is_error and "Error executing tool fail" in r.content
        r = await _call(env, "add", a="not a number", b=1)  # the server's own validation
        assert r.is_error and "valid integer" in r.content
        r = await _call(env, "no_such_tool")
        assert r.is_error and "Unknown tool 'no_such_tool'" in r.content and "add" in r.content
        r = await _call(env, "echo", text="still connected")
        assert not r.is_error and r.content == "still connected"
    finally:
        await env.aclose()
    with pytest.raises(ConfigurationError, match="could not connect to the MCP server"):
        await MCPEnvironment.connect(MCPServer.stdio([sys.executable, "-c", "import sys; sys.exit('no server here')"]))


async def test_a_stdio_server_killed_mid_call_gives_an_error_result_and_a_reconnect(tmp_path: Path) -> None:
    env = await MCPEnvironment.connect(STDIO)
    try:
        first = int((await _call(env, "pid")).content)
        marker = tmp_path / "hanging"
        results: list[ToolResult] = []
        with trio.fail_after(30):  # never a hang
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _call_into(results, env, "hang", marker=str(marker)))
                assert await _wait_until(marker.exists)
                os.kill(first, 9)
        assert results[0].is_error and "failed" in results[0].content and "connects again" in results[0].content
        clone = await clone_environment(env)  # clones share the connection, so they reconnect too
        second = int((await _call(clone, "pid")).content)
        assert second != first and _alive(second)
    finally:
        await env.aclose()
    assert await _wait_dead(second), "aclose left the server process running"


async def _call_into(results: list[ToolResult], env: Any, name: str, **args: Any) -> None:
    results.append(await _call(env, name, **args))


async def test_a_hung_server_gives_an_error_at_the_call_timeout(tmp_path: Path) -> None:
    env = await MCPEnvironment.connect(STDIO)
    env.call_timeout = 1.0
    try:
        first = int((await _call(env, "pid")).content)
        t0 = trio.current_time()
        r = await _call(env, "hang", marker=str(tmp_path / "m"))
        assert r.is_error and "did not answer within 1s" in r.content and trio.current_time() - t0 < 5
        env.call_timeout = 60.0
        assert int((await _call(env, "pid")).content) != first
        assert await _wait_dead(first), "the hung server was not stopped"
    finally:
        await env.aclose()


async def test_an_http_server_killed_mid_call_then_restarted(tmp_path: Path) -> None:
    server = await _start_http()
    env = await MCPEnvironment.connect(MCPServer.http(server.url))
    try:
        marker = tmp_path / "hanging"
        results: list[ToolResult] = []
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _call_into(results, env, "hang", marker=str(marker)))
                assert await _wait_until(marker.exists)
                await _stop(server)
        assert results[0].is_error and "connects again" in results[0].content
        r = await _call(env, "echo", text="anyone?")  # nobody listens: an error, not a hang
        assert r.is_error
        server = await _start_http(server.port)
        r = await _call(env, "echo", text="back")
        assert not r.is_error and r.content == "back"
    finally:
        await env.aclose()
        await _stop(server)


async def test_http_headers_come_from_environment_variables_and_are_never_recorded(
    http: HttpServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "Bearer mcp-secret-0123456789"
    server = MCPServer.parse(f"{http.url} Authorization=$ROLLOUTS_TEST_MCP_AUTH")
    with pytest.raises(ConfigurationError, match="ROLLOUTS_TEST_MCP_AUTH, which is not set"):
        await MCPEnvironment.connect(server)
    monkeypatch.setenv("ROLLOUTS_TEST_MCP_AUTH", secret)
    env = await MCPEnvironment.connect(server)
    store = FileSessionStore(tmp_path / "sessions")
    try:
        states = await run(env, [tool_call("whoami"), "done"], session_store=store)
        assert tool_messages(states[-1])[0].text == hashlib.sha256(secret.encode()).hexdigest()  # the server got it
        assert secret not in json.dumps(await env.serialize())
        assert "ROLLOUTS_TEST_MCP_AUTH" in json.dumps(await env.serialize())
    finally:
        await env.aclose()
    for f in (tmp_path / "sessions").rglob("*"):
        if f.is_file():
            assert b"mcp-secret" not in f.read_bytes(), f"the header's value was written to {f}"
    with pytest.raises(ConfigurationError, match="no credentials in the MCP server URL"):
        MCPServer.parse("http://user:pw@127.0.0.1:1/mcp")


async def test_resume_of_a_session_that_used_mcp_tools(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    env = await MCPEnvironment.connect(STDIO)
    states = await run(env, [tool_call("pid"), "first part done"], session_store=store)
    first = int(tool_messages(states[-1])[0].text)
    await env.aclose()
    assert await _wait_dead(first)

    sid = (await store.list())[0].session_id
    state = await resume_session(FileSessionStore(tmp_path), sid)  # as a new process would
    assert isinstance(state.environment, MCPEnvironment)
    assert [t.name for t in state.environment.get_tools()] == [t.name for t in env.get_tools()]
    model = ScriptedModel([tool_call("pid"), tool_call("echo", text="resumed"), "all done"])
    from dataclasses import replace

    state = replace(state.with_messages(Message("user", "go on")), actor=replace(state.actor, endpoint=model.endpoint))
    try:
        resumed = await run_agent_with(state, store)
        results = tool_messages(resumed[-1])
        second = int(results[-2].text)
        assert second != first and results[-1].text == "resumed"
        assert resumed[-1].messages[-1].text == "all done"
    finally:
        await state.environment.aclose()
    assert await _wait_dead(second)


async def run_agent_with(state: Any, store: FileSessionStore) -> Any:
    from rollouts import run_agent

    return await run_agent(state, RunConfig(session_store=store, max_turns=10))


async def test_compose_mcp_servers_with_prefixes(http: HttpServer) -> None:
    a = await MCPEnvironment.connect(STDIO)
    b = await MCPEnvironment.connect(MCPServer.http(http.url))
    env = compose(a, b, prefixes=("local_", "remote_"))
    try:
        names = {t.name for t in env.get_tools()}
        assert {"local_add", "remote_add", "local_pid", "remote_echo"} <= names
        restored = await ComposedEnvironment.deserialize(json.loads(json.dumps(await env.serialize())))
        r = await _call(restored, "remote_echo", text="via http")
        assert not r.is_error and r.content == "via http"
        assert json.loads((await _call(restored, "local_add", a=1, b=1)).content) == {"sum": 2}
    finally:
        await env.aclose()


async def test_evaluate_over_50_samples_shares_nothing_it_should_not(http: HttpServer) -> None:
    """Every sample gets its own connection (its own key, closed when the sample ends) and sees
    exactly its own results, with 25 samples calling the same server concurrently."""
    keys: list[str] = []

    async def factory() -> MCPEnvironment:
        env = await MCPEnvironment.connect(MCPServer.http(http.url))
        keys.append(env.connection_key)
        return env

    def reply(req: Any) -> Any:
        tools = [m for m in req.messages if m.role == "tool"]
        if not tools:
            return tool_call("echo", text=f"token-{req.last_user_text}")
        return f"got {tools[-1].text}"

    model = ScriptedModel(reply)
    rows = [{"question": f"s{i}"} for i in range(50)]
    report = await evaluate(rows, EvalConfig(endpoint=model.endpoint, environment_factory=factory, max_concurrent=25))
    assert [s.status for s in report.samples] == ["completed"] * 50
    for s in report.samples:
        assert s.response == f"got token-{s.input['question']}"  # type: ignore[index]
    assert len(set(keys)) == 50, "two samples shared a connection"
    assert not set(keys) & set(_LIVE), "a sample's connection was left open"


async def test_stdio_samples_each_get_their_own_server_process() -> None:
    def reply(req: Any) -> Any:
        tools = [m for m in req.messages if m.role == "tool"]
        if not tools:
            return tool_call("remember", note=req.last_user_text)
        if len(tools) == 1:
            return tool_call("recall")
        if len(tools) == 2:
            return tool_call("pid")
        return f"{tools[1].text}|{tools[2].text}"

    model = ScriptedModel(reply)
    rows = [{"question": f"note{i}"} for i in range(4)]
    config = EvalConfig(
        endpoint=model.endpoint, environment_factory=lambda: MCPEnvironment.connect(STDIO), max_concurrent=4
    )
    report = await evaluate(rows, config)
    pids = set()
    for s in report.samples:
        notes, pid = s.response.split("|")
        assert notes == s.input["question"], "a sample saw another sample's notes"  # type: ignore[index]
        pids.add(int(pid))
    assert len(pids) == 4
    for pid in pids:
        assert await _wait_dead(pid), "a sample's server process outlived it"
