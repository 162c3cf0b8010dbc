"""The OpenAI-compatible path (vLLM, SGLang, llama.cpp server...) and its quirks."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import httpx2
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rollouts.agents import run_agent
from rollouts.dtypes import (
    Actor,
    AgentState,
    Endpoint,
    Message,
    StopReason,
    TextContent,
    Tool,
    ToolCallContent,
    Trajectory,
    Usage,
)
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import ConfigurationError
from rollouts.events import (
    StreamDone,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
)
from rollouts.providers import get_provider_function
from rollouts.providers._clients import client_scope
from rollouts.providers._text_tool_calls import extract_text_tool_calls
from rollouts.providers.openai_http import SHARDS
from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.run_config import RunConfig
from rollouts.testing import open_fake_server

TRANSPORTS = pytest.mark.parametrize("transport", ["sdk", "http"])
ADD = Tool("add", "Add a number.", {"type": "object", "properties": {"value": {"type": "number"}}})


class Recorder:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _actor(base_url: str, transport: str = "sdk", provider: str = "openai-compatible", **ep: Any) -> Actor:
    endpoint = Endpoint(provider, "qwen2.5-0.5b", api_base=base_url, transport=transport, **ep)  # type: ignore[arg-type]
    return Actor(Trajectory((Message("system", "Use tools."), Message("user", "Add 5."))), endpoint, tools=(ADD,))


async def _call(actor: Actor) -> tuple[Actor, Recorder]:
    rec = Recorder()
    fn = get_provider_function(actor.endpoint.provider, actor.endpoint.model)
    return await fn(actor, rec), rec


@TRANSPORTS
@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "arguments": {"value": 5}}',
        'I will add.\n```json\n{"name": "add", "arguments": {"value": 5}}\n```',
        '<tool_call>\n{"name": "add", "arguments": "{\\"value\\": 5}"}\n</tool_call>',
    ],
)
async def test_tool_call_written_as_text_becomes_a_real_tool_call(transport: str, text: str) -> None:
    async with open_fake_server([text], chunk_size=3) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport))
    msg = actor.trajectory.messages[-1]
    calls = msg.get_tool_calls()
    assert [(c.name, dict(c.arguments)) for c in calls] == [("add", {"value": 5})]
    prose = "I will add.\n" if text.startswith("I will") else ""  # streamed before the fence opened
    assert msg.text == prose
    starts, ends = rec.of(ToolCallStart), rec.of(ToolCallEnd)
    assert len(starts) == 1 and len(ends) == 1 and ends[0].tool_call == calls[0]
    assert starts[0].content_index == (1 if prose else 0)
    assert rec.of(ToolCallDelta)[0].partial_args == {"value": 5}
    assert rec.of(StreamDone)[0].finish_reason == "tool_use"
    assert "".join(d.delta for d in rec.of(TextDelta)) == prose  # JSON never leaked out as text


@TRANSPORTS
@pytest.mark.parametrize(
    "text",
    [
        '{"name": "delete_everything", "arguments": {}}',  # not a declared tool
        '{"name": "add", "arguments": {"value": 5,}}',  # does not parse
        '{"name": "add", "arguments": {"value": 5} and more',  # unclosed, but not at the end
        "Use a set like {1, 2} or <b>bold</b> and `code`.",
        '{"name": "add", "arguments": {"value": 5}, "extra": 1}',  # not a call's shape
    ],
)
async def test_text_that_is_not_a_declared_tool_call_stays_text(transport: str, text: str) -> None:
    async with open_fake_server([text], chunk_size=3) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport))
    msg = actor.trajectory.messages[-1]
    assert msg.content == (TextContent(text),)
    assert rec.of(ToolCallStart) == [] and rec.of(TextEnd) == [TextEnd(0, text)]
    assert rec.of(StreamDone)[0].finish_reason == "stop"


async def test_prose_before_a_possible_call_streams_immediately() -> None:
    text = "Sure thing, adding now. {not json"
    async with open_fake_server([text], chunk_size=4) as srv:
        _, rec = await _call(_actor(srv.base_url))
    deltas = [d.delta for d in rec.of(TextDelta)]
    assert deltas[:5] == ["Sure", " thi", "ng, ", "addi", "ng n"]  # streamed as it came
    assert "".join(deltas) == text and rec.of(TextStart) == [TextStart(0)]


async def test_without_declared_tools_text_is_never_converted() -> None:
    text = '{"name": "add", "arguments": {"value": 5}}'
    async with open_fake_server([text]) as srv:
        actor, _ = await _call(replace(_actor(srv.base_url), tools=()))
    assert actor.trajectory.messages[-1].content == (TextContent(text),)


@TRANSPORTS
async def test_missing_usage_gives_zeros_and_is_marked(transport: str) -> None:
    async with open_fake_server(["hello"], send_usage=False) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport))
    msg = actor.trajectory.messages[-1]
    assert msg.usage == Usage() and rec.of(StreamDone)[0].usage == Usage()
    assert msg.details is not None and msg.details["usage_reported"] is False
    async with open_fake_server([ScriptedReply("hi", usage=Usage(input_tokens=9, output_tokens=2))]) as srv:
        actor, _ = await _call(_actor(srv.base_url, transport))
    assert actor.trajectory.messages[-1].usage == Usage(input_tokens=9, output_tokens=2)
    assert "usage_reported" not in (actor.trajectory.messages[-1].details or {})


@TRANSPORTS
async def test_compat_request_shape(transport: str) -> None:
    history = (
        Message("user", "Add 5."),
        Message("assistant", (ToolCallContent("c1", "add", {"value": 5}),)),
        Message("tool", "Added 5. Current value: 5", tool_call_id="c1"),
    )
    async with open_fake_server(["done"]) as srv:
        actor = _actor(srv.base_url, transport, max_tokens=64, temperature=0.0)
        actor = replace(actor, trajectory=Trajectory(history))
        await _call(actor)
        req = srv.last_request
    body = req.json
    assert body["messages"][1] == {
        "role": "assistant",
        "content": "",  # not null: several servers reject null content
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"value": 5}'}}],
    }
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "c1", "content": "Added 5. Current value: 5"}
    assert body["max_tokens"] == 64 and "max_completion_tokens" not in body and body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True}
    # No key configured: the SDK must send some key, the lean transport sends none.
    if transport == "http":
        assert "authorization" not in req.headers
    else:
        assert req.headers["authorization"] == "Bearer EMPTY"


async def test_compat_needs_api_base_and_never_uses_the_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="api_base"):
        await _call(_actor(""))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-openai")
    async with open_fake_server(["x"]) as srv:
        await _call(_actor(srv.base_url))
        assert "sk-secret-openai" not in srv.last_request.headers.get("authorization", "")
    async with open_fake_server(["x"]) as srv:
        await _call(_actor(srv.base_url, api_key="vllm-key"))
        assert srv.last_request.headers["authorization"] == "Bearer vllm-key"


@pytest.mark.parametrize("alias", ["vllm", "sglang", "llamacpp"])
async def test_aliases(alias: str) -> None:
    async with open_fake_server(["hi"]) as srv:
        actor, _ = await _call(_actor(srv.base_url, provider=alias))
    assert actor.trajectory.messages[-1].provider == alias


@TRANSPORTS
async def test_agent_loop_with_text_tool_calls(transport: str) -> None:
    script = [
        '{"name": "add", "arguments": {"value": 2}}',
        '<tool_call>{"name": "add", "arguments": {"value": 3}}</tool_call>',
        ScriptedReply(tool_calls=(ScriptedToolCall("complete_task", {"final_result": "5"}),)),  # native this time
    ]
    async with open_fake_server(script) as srv:
        endpoint = Endpoint("openai-compatible", "m", api_base=srv.base_url, transport=transport)  # type: ignore[arg-type]
        msgs = (Message("system", "Calculator."), Message("user", "2 + 3?"))
        state = AgentState(Actor(Trajectory(msgs), endpoint), environment=CalculatorEnvironment())
        states = await run_agent(state, RunConfig())
        requests = srv.scripted_requests
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert final.environment is not None and final.environment.current_value == 5  # type: ignore[attr-defined]
    second = requests[1].json["messages"]
    assert second[2]["role"] == "assistant" and second[2]["tool_calls"][0]["function"]["name"] == "add"
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == second[2]["tool_calls"][0]["id"]


def test_extraction_unit_cases() -> None:
    names = {"add", "mul"}
    calls, rest = extract_text_tool_calls(
        '<tool_call>{"name":"add","arguments":{}}</tool_call>\n<tool_call>{"name":"mul","parameters":{"x":1}}</tool_call>',
        names,
    )
    assert [(c.name, c.arguments) for c in calls] == [("add", {}), ("mul", {"x": 1})] and rest.strip() == ""
    calls, rest = extract_text_tool_calls('{"name": "add", "arguments": "not json"}', names)
    assert calls == []
    calls, rest = extract_text_tool_calls('{"name": "add", "arguments": [1]}', names)
    assert calls == []
    calls, rest = extract_text_tool_calls('Then: {"name": "add", "arguments": {"value": 1}} ok', names)
    assert [c.arguments for c in calls] == [{"value": 1}] and rest == "Then:  ok"


def test_a_call_left_unclosed_at_the_end_of_the_reply_is_completed() -> None:
    names = {"add", "complete_task"}
    calls, rest = extract_text_tool_calls('{"name": "complete_task", "arguments": {"final_result": "7"}', names)
    assert [(c.name, c.arguments) for c in calls] == [("complete_task", {"final_result": "7"})] and rest == ""
    calls, rest = extract_text_tool_calls('ok {"name": "add", "arguments": {"value": 2', names)
    assert [c.arguments for c in calls] == [{"value": 2}] and rest == "ok "
    # only closing braces are added: a cut-off string or value is not guessed
    for cut in ('{"name": "complete_task", "arguments": {"final_result": "7', '{"name": "add", "arguments": {"value":'):
        assert extract_text_tool_calls(cut, names) == ([], cut)


def test_limit_keeps_the_first_call_and_drops_what_follows() -> None:
    names = {"add"}
    text = 'Adding. {"name": "add", "arguments": {"value": 1}} {"name": "add", "arguments": {"value": 2}} done'
    calls, rest = extract_text_tool_calls(text, names, limit=1)
    assert [c.arguments for c in calls] == [{"value": 1}] and rest == "Adding. "
    calls, rest = extract_text_tool_calls(text, names)
    assert [c.arguments for c in calls] == [{"value": 1}, {"value": 2}] and rest == "Adding.   done"


@TRANSPORTS
async def test_parallel_tool_calls_false_keeps_one_text_call(transport: str) -> None:
    text = '{"name": "add", "arguments": {"value": 1}}\n{"name": "add", "arguments": {"value": 2}}'
    async with open_fake_server([text, text], chunk_size=5) as srv:
        actor, rec = await _call(_actor(srv.base_url, transport, extra_params={"parallel_tool_calls": False}))
        assert srv.last_request.json["parallel_tool_calls"] is False
        assert [c.arguments for c in actor.trajectory.messages[-1].get_tool_calls()] == [{"value": 1}]
        assert len(rec.of(ToolCallEnd)) == 1 and rec.of(TextDelta) == []
        actor, _ = await _call(_actor(srv.base_url, transport))  # default: every call is kept
        assert [c.arguments for c in actor.trajectory.messages[-1].get_tool_calls()] == [{"value": 1}, {"value": 2}]


# --------------------------------------------------------------------------------------------
# The lean transport's SSE parser, whatever the network's chunk boundaries
# --------------------------------------------------------------------------------------------

_EVENTS = [{"n": i, "text": "a\nb" if i % 3 == 0 else "é" * i} for i in range(8)]


def _sse_body(crlf: bool) -> bytes:
    nl = "\r\n" if crlf else "\n"
    parts = [f": keep-alive comment{nl}{nl}"]
    for i, ev in enumerate(_EVENTS):
        data = json.dumps(ev, ensure_ascii=False)
        if i == 2:  # one event split over two data lines, with an event name and an id
            half = data.index(", ") + 1  # between tokens: the lines are joined with a newline
            parts.append(f"event: message{nl}id: {i}{nl}data: {data[:half]}{nl}data:{data[half:]}{nl}{nl}")
        else:
            parts.append(f"data: {data}{nl}{nl}")
    parts.append(f"data: [DONE]{nl}{nl}")
    parts.append(f'data: {{"after": "done"}}{nl}{nl}')  # ignored: after [DONE]
    return "".join(parts).encode()


async def _parse(body: bytes, cuts: list[int]) -> list[Any]:
    from rollouts.providers.openai_http import iter_sse_json

    bounds = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})

    async def chunks() -> Any:
        for a, b in itertools.pairwise(bounds):
            yield body[a:b]

    response = httpx2.Response(200, content=chunks())
    return [ev async for ev in iter_sse_json(response)]


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40), crlf=st.booleans())
def test_sse_parser_is_independent_of_chunk_boundaries(cuts: list[int], crlf: bool) -> None:
    body = _sse_body(crlf)
    joined = [json.loads(json.dumps(ev, ensure_ascii=False)) for ev in _EVENTS]
    assert trio.run(_parse, body, cuts) == joined


@TRANSPORTS
@pytest.mark.parametrize(
    ("provider", "extra", "reused"),
    [
        ("openai-compatible", None, True),
        ("llamacpp", None, False),  # llama.cpp drops kept-alive connections without notice
        ("openai-compatible", {"keepalive": False}, False),
        ("llamacpp", {"keepalive": True}, True),
    ],
)
async def test_connection_reuse_follows_keepalive(
    transport: str, provider: str, extra: dict[str, Any] | None, reused: bool
) -> None:
    n = SHARDS + 2  # more calls than the lean transport has pools
    async with open_fake_server([f"reply {i}" for i in range(n)]) as srv:
        actor = _actor(srv.base_url, transport, provider=provider, extra_params=extra)
        async with client_scope():
            for _ in range(n):
                await _call(actor)
        assert all("keepalive" not in r.json for r in srv.scripted_requests)  # never sent to the server
        # sequential calls reuse one connection (the lean transport picks its least busy pool)
        assert srv.connections_opened == (1 if reused else n)


@pytest.mark.parametrize(
    ("provider", "transport", "lean"),
    [
        ("openai-compatible", "auto", True),
        ("vllm", "auto", True),
        ("sglang", "auto", True),
        ("llamacpp", "auto", True),
        ("openai", "auto", False),
        ("openai-compatible", "sdk", False),
        ("openai", "http", True),
    ],
)
async def test_the_lean_transport_is_the_default_for_self_hosted_servers(
    provider: str, transport: str, lean: bool
) -> None:
    """Issue 19 item 1: a user who sets no transport gets the lean one for a self-hosted server
    (same events, Message and usage: the parametrized parity tests above) and the SDK for OpenAI."""
    async with open_fake_server(["hi"]) as srv:
        actor = _actor(srv.base_url, transport, provider=provider, api_key="k")
        assert Endpoint(provider, "m").transport == "auto"
        new, _ = await _call(actor)
        sdk_headers = any(h.startswith("x-stainless") for h in srv.last_request.headers)
    assert sdk_headers is not lean
    assert new.trajectory.messages[-1].text == "hi"


async def test_the_lean_transport_sends_a_request_in_one_write() -> None:
    """Issue 19 item 1: httpcore2 writes a request's head and body separately, each a system call
    that wakes the server; the lean transport's connections hold writes until they read."""
    import httpcore2

    from rollouts.providers.openai_http import _CorkedStream

    class Inner(httpcore2.AsyncNetworkStream):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
            self.writes.append(buffer)

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
            return b"HTTP/1.1 200 OK\r\n"

        async def aclose(self) -> None:
            pass

    inner = Inner()
    stream = _CorkedStream(inner)
    await stream.write(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n")
    await stream.write(b'{"model": "m"}')
    assert inner.writes == []
    assert await stream.read(100) == b"HTTP/1.1 200 OK\r\n"
    assert inner.writes == [b'POST /v1/chat/completions HTTP/1.1\r\n\r\n{"model": "m"}']
    await stream.write(b"x" * (70 * 1024))  # a large body does not wait for the read
    assert len(inner.writes) == 2
