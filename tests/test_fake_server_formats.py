"""The fake server's Anthropic, Responses and Gemini formats parse in the official SDKs, streamed
and not, and their error responses map to the SDKs' own error classes."""

from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from rollouts.dtypes import Usage
from rollouts.testing import ScriptedReply, ScriptedToolCall, http_error, open_fake_server

REPLY = ScriptedReply(
    "The sum is 7.",
    thinking="3 + 4",
    tool_calls=(ScriptedToolCall("add", {"value": 7}, id="t1"),),
    usage=Usage(input_tokens=11, output_tokens=9, cache_read_tokens=5, cache_write_tokens=2, reasoning_tokens=3),
)


async def test_anthropic_streamed_and_complete_through_the_sdk_helpers() -> None:
    async with open_fake_server([REPLY, REPLY, http_error(529, message="Overloaded")]) as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="k", max_retries=0)
        try:
            # the SDK's own accumulating stream helper rebuilds the same message
            async with client.messages.stream(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "q"}]
            ) as stream:
                streamed = await stream.get_final_message()
            complete = await client.messages.create(
                model="m", max_tokens=100, messages=[{"role": "user", "content": "q"}]
            )
            with pytest.raises(anthropic.OverloadedError):
                await client.messages.create(model="m", max_tokens=100, messages=[{"role": "user", "content": "q"}])
        finally:
            await client.close()
    for msg in (streamed, complete):
        assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
        assert msg.content[1].text == "The sum is 7."  # type: ignore[union-attr]
        assert msg.content[2].input == {"value": 7} and msg.content[2].id == "t1"  # type: ignore[union-attr]
        assert msg.stop_reason == "tool_use"
        assert (msg.usage.input_tokens, msg.usage.output_tokens) == (11, 9)
        assert (msg.usage.cache_read_input_tokens, msg.usage.cache_creation_input_tokens) == (5, 2)


async def test_responses_streamed_and_complete_through_the_sdk() -> None:
    async with open_fake_server([REPLY, REPLY, http_error(429, retry_after=3)]) as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="k", max_retries=0)
        try:
            stream = await client.responses.create(model="m", input="q", stream=True)
            async with stream:
                events = [e async for e in stream]
            complete = await client.responses.create(model="m", input="q")
            with pytest.raises(openai.RateLimitError) as info:
                await client.responses.create(model="m", input="q")
        finally:
            await client.close()
    final = events[-1]
    assert final.type == "response.completed"
    for resp in (final.response, complete):  # type: ignore[union-attr]
        assert [o.type for o in resp.output] == ["reasoning", "message", "function_call"]
        assert resp.output_text == "The sum is 7."
        assert resp.usage is not None and (resp.usage.input_tokens, resp.usage.output_tokens) == (18, 9)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "The sum is 7."  # type: ignore[union-attr]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert info.value.response.headers["retry-after"] == "3"


async def test_gemini_streamed_and_complete_through_the_sdk() -> None:
    async with open_fake_server([REPLY, REPLY, http_error(403)]) as srv:
        http = httpx2.AsyncClient()
        options = genai_types.HttpOptions(
            base_url=srv.url, httpx_async_client=http, retry_options=genai_types.HttpRetryOptions(attempts=1)
        )
        client = genai.Client(api_key="k", http_options=options)
        try:
            chunks = [c async for c in await client.aio.models.generate_content_stream(model="gemini-x", contents="q")]
            complete = await client.aio.models.generate_content(model="gemini-x", contents="q")
            with pytest.raises(genai_errors.ClientError) as info:
                await client.aio.models.generate_content(model="gemini-x", contents="q")
        finally:
            await http.aclose()
    streamed_parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]  # type: ignore[index,union-attr]
    for parts in (streamed_parts, complete.candidates[0].content.parts):  # type: ignore[index,union-attr]
        assert "".join(p.text for p in parts if p.thought) == "3 + 4"  # type: ignore[union-attr,misc]
        assert "".join(p.text or "" for p in parts if not p.thought) == "The sum is 7."  # type: ignore[union-attr]
        calls = [p.function_call for p in parts if p.function_call]  # type: ignore[union-attr]
        assert [(c.name, c.args, c.id) for c in calls] == [("add", {"value": 7}, "t1")]  # type: ignore[union-attr]
    last = chunks[-1]
    assert last.candidates[0].finish_reason == genai_types.FinishReason.STOP  # type: ignore[index]
    assert last.usage_metadata is not None and last.usage_metadata.thoughts_token_count == 3
    assert info.value.code == 403 and info.value.status == "PERMISSION_DENIED"


@pytest.mark.parametrize("stream", [True, False])
async def test_gemini_format_answers_500_for_malformed_tool_arguments(stream: bool) -> None:
    """Issue 13 item 14: Gemini sends arguments as a JSON object, so a scripted call with
    malformed arguments cannot be rendered. The server answered nothing and its task died;
    now it answers 500 naming the turn, notes it in `errors`, and keeps serving."""
    bad = ScriptedReply(tool_calls=(ScriptedToolCall("add", '{"value": 3'),))
    async with open_fake_server([bad, "still here"]) as srv:
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url = f"{srv.url}/v1beta/models/gemini-2.5-flash:{action}"
        body = {"contents": [{"role": "user", "parts": [{"text": "add"}]}]}
        async with httpx2.AsyncClient() as client:
            r = await client.post(url, json=body)
            assert r.status_code == 500
            assert "turn 1" in r.json()["error"]["message"]
            assert len(srv.errors) == 1 and "gemini" in srv.errors[0]
            ok = await client.post(url, json=body)
            assert ok.status_code == 200 and "stil" in ok.text
