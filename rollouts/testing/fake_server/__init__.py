"""A wire-faithful fake LLM provider server for tests, benchmarks and users' own tests.

It is a real HTTP/1.1 server (h11 on `trio.serve_tcp`) bound to 127.0.0.1 on a free port that
speaks the providers' real streaming formats, so the official SDK clients (and our lean HTTP
transport) talk to it unchanged through `Endpoint.api_base`::

    from rollouts.testing import open_fake_server, http_error, FakeTurn
    from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall

    async with open_fake_server([
        http_error(429, retry_after=0.1),                       # turn 1: rate limited
        ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 5}),)),
        FakeTurn("The answer is 5.", drop_after=3),             # breaks after 3 SSE events
        "The answer is 5.",
    ]) as srv:
        endpoint = Endpoint("openai", "gpt-4o-mini", api_base=srv.base_url, api_key="x")
        ...
        assert srv.requests[1].json["messages"][0]["role"] == "system"
        assert srv.max_in_flight <= 8

**Script.** A list of turns consumed in order, one per scripted request (all formats share
the list), or a function `fn(request: RecordedRequest) -> turn` (sync or async) for
concurrent or request-dependent replies. A turn is a `str` (text reply), a
`rollouts.providers.scripted.ScriptedReply` (text, thinking, tool calls — a tool call whose
`arguments` is a string is sent verbatim, so malformed JSON is easy — usage, finish reason) or a
`FakeTurn` wrapping a reply with faults:

* `http_error(status, retry_after=None, message=None, code=None)`: 429/500/503/529/400/401...
  with the provider's error body and a `retry-after` header;
* `FakeTurn(reply, drop_after=N)`: connection closed after N stream events;
* `FakeTurn(reply, truncate_after=N)`: N events, half of the next one, then closed;
* `FakeTurn(reply, end_after=N)`: N events, then the body ends cleanly (no finish, no `[DONE]`);
* `FakeTurn(close_without_response=True)`: the connection closes before any response;
* `FakeTurn(reply, first_byte_delay=s, event_delay=s)`: slow first byte / slow tokens.

A request beyond the end of a list script gets HTTP 418 and is noted in `srv.errors`.

**Server options** (`open_fake_server(script, ...)`): `chunk_size` (characters per delta,
default 4), `latency_s` (delay before every scripted response), `send_usage` (False mimics
servers that never report usage), `interleave_tool_calls` (parallel tool-call deltas
alternate), `formats` (default: every format in `_registry.FORMATS`), `port`, `keep_requests`
(False: only count them in `srv.request_count`, for load runs whose heap must not grow with
every request served).

**Inspection.** `srv.base_url` (`http://127.0.0.1:<port>/v1`), `srv.url` (no path),
`srv.requests` (every `RecordedRequest`: method, path, query, lower-cased headers, parsed JSON
`body`/`.json`, `raw_body`, `index`), `srv.scripted_requests`, `srv.last_request`,
`srv.in_flight`, `srv.max_in_flight` (most scripted requests in progress at once),
`await srv.wait_idle()` (until nothing is in flight),
`srv.connections_opened`, `srv.connections_closed` (connections that have ended, by either side;
`await srv.wait_connections_closed()` until all have),
`srv.completed_streams`, `srv.errors`.

**Formats** are pluggable (`WireFormat` protocol in `server.py`, registry in `_registry.py`).
Shipped: OpenAI Chat Completions (`chat.py`: `POST */chat/completions`, `GET */models`).
Also: Anthropic Messages (`anthropic_format.py`: `POST */v1/messages`; `AnthropicReply` adds
redacted thinking, a fixed signature and an `error` event mid-stream), OpenAI Responses
(`responses_format.py`: `POST */responses`) and Gemini (`gemini_format.py`:
`POST */models/<model>:streamGenerateContent?alt=sse` and `:generateContent`).
Helpers for format authors: `sse(data, event=None)`, `split_text`, `estimate_tokens`,
`RenderContext`.

Run standalone (for benchmarks in another process): `python -m rollouts.testing.fake_server --help`.
"""

from rollouts.testing.fake_server.server import (
    FakeServer,
    FakeTurn,
    RecordedRequest,
    RenderContext,
    ScriptExhaustedError,
    TurnFn,
    TurnLike,
    WireFormat,
    default_formats,
    estimate_tokens,
    http_error,
    open_fake_server,
    split_text,
    sse,
)

__all__ = [
    "FakeServer",
    "FakeTurn",
    "RecordedRequest",
    "RenderContext",
    "ScriptExhaustedError",
    "TurnFn",
    "TurnLike",
    "WireFormat",
    "default_formats",
    "estimate_tokens",
    "http_error",
    "open_fake_server",
    "split_text",
    "sse",
]
