"""The fake provider server speaks OpenAI chat SSE faithfully and injects faults as scripted.

Checked with a raw HTTP client (the bytes on the wire) and with the official openai SDK.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
import trio

from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.testing import FakeTurn, http_error, open_fake_server


def _data_lines(body: str) -> list[str]:
    return [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]


async def test_chat_stream_wire_format_with_usage_and_parallel_tool_calls() -> None:
    reply = ScriptedReply(
        text="Hi there",
        tool_calls=(ScriptedToolCall("add", {"value": 5}, id="c1"), ScriptedToolCall("mul", {"x": 2})),
    )
    async with open_fake_server([reply]) as srv, httpx2.AsyncClient() as client:
        body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": []}
        r = await client.post(f"{srv.base_url}/chat/completions", json=body)
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        datas = _data_lines(r.text)
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hi there"
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in (c["choices"][0]["delta"].get("tool_calls") or []) if c["choices"] else []:
            entry = calls.setdefault(tc["index"], {"id": "", "name": "", "args": ""})
            entry["id"] += tc.get("id", "")
            entry["name"] += tc.get("function", {}).get("name", "")
            entry["args"] += tc["function"].get("arguments", "")
    assert calls[0] == {"id": "c1", "name": "add", "args": '{"value": 5}'}
    assert calls[1]["name"] == "mul" and json.loads(calls[1]["args"]) == {"x": 2} and calls[1]["id"]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finish] == ["tool_calls"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert srv.last_request.json["stream_options"] == {"include_usage": True}


async def test_no_usage_chunk_unless_requested_or_when_disabled() -> None:
    async with open_fake_server(["a", "b"], send_usage=False) as srv, httpx2.AsyncClient() as client:
        for opts in (None, {"include_usage": True}):
            body = {"model": "m", "stream": True, "messages": [], **({"stream_options": opts} if opts else {})}
            r = await client.post(f"{srv.base_url}/chat/completions", json=body)
            assert all("usage" not in json.loads(d) or json.loads(d)["usage"] is None for d in _data_lines(r.text)[:-1])
    async with open_fake_server(["a"]) as srv, httpx2.AsyncClient() as client:
        r = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m", "stream": True, "messages": []})
        assert all("usage" not in json.loads(d) for d in _data_lines(r.text)[:-1])


async def test_sdk_reads_stream_and_non_stream_and_models() -> None:
    thinking = ScriptedReply(text="ok", thinking="let me think")
    async with open_fake_server([thinking, "plain"], chunk_size=3) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0) as c:
            stream = await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "q"}], stream=True
            )
            pieces, reasoning = [], []
            async with stream:
                async for ch in stream:
                    if ch.choices:
                        pieces.append(ch.choices[0].delta.content or "")
                        reasoning.append(getattr(ch.choices[0].delta, "reasoning_content", None) or "")
            assert "".join(pieces) == "ok" and "".join(reasoning) == "let me think"
            done = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
            assert done.choices[0].message.content == "plain"
            assert done.usage is not None and done.usage.prompt_tokens > 0
            models = await c.models.list()
            assert [m.id for m in models.data] == ["fake-model"]
    assert [r.index for r in srv.requests] == [0, 1, -1]
    assert srv.requests[0].headers["authorization"] == "Bearer k"


async def test_http_errors_carry_status_body_and_retry_after() -> None:
    script = [http_error(429, retry_after=0.25), http_error(529), http_error(400, code="context_length_exceeded")]
    async with open_fake_server(script) as srv, httpx2.AsyncClient() as client:
        r1 = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m"})
        r2 = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m"})
        r3 = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m"})
    assert (r1.status_code, r1.headers["retry-after"]) == (429, "0.25")
    assert r2.status_code == 529
    assert r3.status_code == 400 and r3.json()["error"]["code"] == "context_length_exceeded"


async def test_drop_and_truncate_close_the_connection_mid_body() -> None:
    for turn, whole_events in (
        (FakeTurn("abcdefghijkl", drop_after=2), 2),
        (FakeTurn("abcdefghijkl", truncate_after=2), 2),
    ):
        async with open_fake_server([turn]) as srv, httpx2.AsyncClient() as client:
            received = b""
            with pytest.raises(httpx2.RemoteProtocolError):
                async with client.stream(
                    "POST", f"{srv.base_url}/chat/completions", json={"model": "m", "stream": True}
                ) as r:
                    async for part in r.aiter_bytes():
                        received += part
            complete = received.count(b"\n\n")
            assert complete == whole_events
            if turn.truncate_after is not None:
                assert not received.endswith(b"\n\n")  # half an event arrived
            assert srv.completed_streams == 0


async def test_close_without_response_is_a_connection_error() -> None:
    async with open_fake_server([FakeTurn(close_without_response=True)]) as srv, httpx2.AsyncClient() as client:
        with pytest.raises(httpx2.RemoteProtocolError):
            await client.post(f"{srv.base_url}/chat/completions", json={"model": "m"})


async def test_async_reply_function_and_max_in_flight() -> None:
    arrived = 0
    all_here = trio.Event()

    async def reply(req):  # type: ignore[no-untyped-def]
        nonlocal arrived
        arrived += 1
        if arrived == 6:
            all_here.set()
        with trio.fail_after(10):
            await all_here.wait()  # every request is in flight at once
        return f"echo {req.json['messages'][0]['content']}"

    async with open_fake_server(reply, latency_s=0.01) as srv:
        results: dict[int, str] = {}
        async with httpx2.AsyncClient() as client:

            async def one(i: int) -> None:
                body = {"model": "m", "messages": [{"role": "user", "content": str(i)}]}
                r = await client.post(f"{srv.base_url}/chat/completions", json=body)
                results[i] = r.json()["choices"][0]["message"]["content"]

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, i)
        assert results == {i: f"echo {i}" for i in range(6)}
        assert srv.max_in_flight == 6 and srv.in_flight == 0


async def test_script_exhausted_is_reported() -> None:
    async with open_fake_server([]) as srv, httpx2.AsyncClient() as client:
        r = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m"})
    assert r.status_code == 418 and srv.errors


async def test_end_after_ends_the_body_cleanly_before_the_stream_finished() -> None:
    async with open_fake_server([FakeTurn("abcdefghijkl", end_after=3)]) as srv, httpx2.AsyncClient() as client:
        r = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m", "stream": True})
    datas = _data_lines(r.text)
    assert r.status_code == 200 and len(datas) == 3 and "[DONE]" not in datas
    assert all(json.loads(d)["choices"][0]["finish_reason"] is None for d in datas)


async def test_keep_requests_false_counts_without_keeping() -> None:
    """A load run's server keeps no request (its heap does not grow), but still counts every
    one, scripted or not, and still answers each in turn."""
    async with open_fake_server(["a", "b"], keep_requests=False) as srv, httpx2.AsyncClient() as client:
        for expected in ("a", "b"):
            r = await client.post(f"{srv.base_url}/chat/completions", json={"model": "m", "messages": []})
            assert r.json()["choices"][0]["message"]["content"] == expected
        await client.get(f"{srv.base_url}/models")
        assert srv.request_count == 3
        assert srv.requests == []
    async with open_fake_server(["a"]) as srv, httpx2.AsyncClient() as client:
        await client.post(f"{srv.base_url}/chat/completions", json={"model": "m", "messages": []})
        assert srv.request_count == 1 and len(srv.requests) == 1
