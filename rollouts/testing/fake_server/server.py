"""The fake provider HTTP server: h11 over `trio.serve_tcp`, scripted turns, faults, recording.

See the package docstring (`rollouts.testing.fake_server`) for the public API.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, TypeAlias
from urllib.parse import parse_qs, urlsplit

import h11
import trio

from rollouts.providers.scripted import ScriptedReply

_MAX_BODY = 64 * 1024 * 1024  # requests bigger than this are refused (413)
_MAX_REQUESTS_PER_CONNECTION = 100_000  # bound on the keep-alive loop


# --------------------------------------------------------------------------------------------
# What the server received
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received. `headers` keys are lower-case; `body` is the parsed JSON
    body (None when there was no body or it was not JSON); `index` counts scripted requests
    (0-based) and is -1 for unscripted routes such as `GET /v1/models`."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any
    raw_body: bytes
    index: int = -1

    @property
    def json(self) -> dict[str, Any]:
        """The JSON body as a dict (asserts there was one)."""
        assert isinstance(self.body, dict), f"request {self.method} {self.path} had no JSON object body"
        return self.body


# --------------------------------------------------------------------------------------------
# Turns and faults
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FakeTurn:
    """One scripted response, with optional faults.

    * `status` != 200: reply with that HTTP status and the format's error body
      (`error_message`, `error_code`), plus `retry-after: <retry_after>` when set.
    * `drop_after=N`: send N stream events, then close the connection without ending the body.
    * `truncate_after=N`: send N events, then the first half of event N+1, then close.
    * `end_after=N`: send N events, then end the body cleanly (HTTP-wise complete, but the
      provider's stream never finished: no finish reason, no `[DONE]`).
    * `close_without_response`: read the request and close the connection (a connection error).
    * `first_byte_delay`: seconds before the response headers; `event_delay`: seconds between
      stream events.
    * `headers`: extra response headers.
    """

    reply: ScriptedReply | str | None = None
    status: int = 200
    retry_after: float | None = None
    error_message: str | None = None
    error_code: str | None = None
    drop_after: int | None = None
    truncate_after: int | None = None
    end_after: int | None = None
    close_without_response: bool = False
    first_byte_delay: float = 0.0
    event_delay: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.status == 200 or self.reply is None, "an error turn carries no reply"
        assert self.status != 200 or self.reply is not None or self.close_without_response, "a 200 turn needs a reply"
        cuts = [c for c in (self.drop_after, self.truncate_after, self.end_after) if c is not None]
        assert len(cuts) <= 1, "choose one of drop_after, truncate_after, end_after"

    @property
    def scripted_reply(self) -> ScriptedReply:
        assert self.reply is not None
        return ScriptedReply(text=self.reply) if isinstance(self.reply, str) else self.reply


def http_error(
    status: int, *, retry_after: float | None = None, message: str | None = None, code: str | None = None
) -> FakeTurn:
    """A turn answered with an HTTP error: `http_error(429, retry_after=0.2)`."""
    assert status >= 400
    return FakeTurn(status=status, retry_after=retry_after, error_message=message, error_code=code)


TurnLike: TypeAlias = str | ScriptedReply | FakeTurn
TurnFn: TypeAlias = Callable[[RecordedRequest], TurnLike | Awaitable[TurnLike]]


def _as_turn(item: TurnLike) -> FakeTurn:
    if isinstance(item, FakeTurn):
        return item
    if isinstance(item, str | ScriptedReply):
        return FakeTurn(reply=item)
    raise AssertionError(f"a fake-server turn must be str, ScriptedReply or FakeTurn, got {item!r}")


# --------------------------------------------------------------------------------------------
# Wire formats
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderContext:
    """What a wire format needs besides the reply: chars per delta, whether to report usage,
    the request's index (for stable ids) and the model name from the request."""

    chunk_size: int
    send_usage: bool
    index: int
    model: str
    interleave_tool_calls: bool = False


class WireFormat(Protocol):
    """One provider's HTTP API. Implement this to add a provider to the fake server."""

    name: str

    def matches(self, method: str, path: str) -> bool:
        """Whether this format serves `method path`."""
        ...

    def static_response(self, request: RecordedRequest) -> Any | None:
        """A JSON body for an unscripted route (e.g. `GET /v1/models`), else None."""
        ...

    def is_stream(self, request: RecordedRequest) -> bool:
        """Whether the request asked for a streamed (SSE) response."""
        ...

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        """The whole SSE body as a list of encoded events (each ends with a blank line)."""
        ...

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        """The JSON body of a non-streamed response."""
        ...

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        """The JSON body of an error response in this provider's shape."""
        ...


def sse(data: Any, event: str | None = None) -> bytes:
    """Encode one server-sent event; `data` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def split_text(text: str, size: int) -> list[str]:
    """`text` in pieces of `size` characters (at least one piece, maybe empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def estimate_tokens(text: str) -> int:
    """~4 characters per token (at least 1): what the fake server reports when a reply has no usage."""
    return max(1, math.ceil(len(text) / 4))


def default_formats() -> tuple[WireFormat, ...]:
    """Every format module shipped in this package (the chat format first)."""
    from rollouts.testing.fake_server import _registry

    return _registry.all_formats()


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


class ScriptExhaustedError(AssertionError):
    """The fake server was asked for more turns than its script has."""


class FakeServer:
    """A running fake provider server. Create with `open_fake_server`."""

    def __init__(
        self,
        script: Sequence[TurnLike] | TurnFn,
        *,
        formats: Iterable[WireFormat] | None = None,
        chunk_size: int = 4,
        latency_s: float = 0.0,
        send_usage: bool = True,
        interleave_tool_calls: bool = False,
        models: Sequence[str] = ("fake-model",),
        keep_requests: bool = True,
    ) -> None:
        assert chunk_size > 0
        self._fn: TurnFn | None = script if callable(script) else None
        self._script: tuple[TurnLike, ...] = () if callable(script) else tuple(script)
        self.formats: tuple[WireFormat, ...] = tuple(formats) if formats is not None else default_formats()
        self.chunk_size = chunk_size
        self.latency_s = latency_s
        self.send_usage = send_usage
        self.interleave_tool_calls = interleave_tool_calls
        self.models = tuple(models)
        self.requests: list[RecordedRequest] = []
        self.keep_requests = keep_requests
        self.request_count = 0  # every request, kept or not
        self.errors: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections_opened = 0
        self.connections_closed = 0
        self.completed_streams = 0
        self._next_index = 0
        self._idle = trio.Event()
        self._idle.set()
        self._closed = trio.Event()  # set (and replaced) each time a connection ends
        self.host = "127.0.0.1"
        self.port = 0

    # -- public helpers ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>` (no path)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-style API base, `http://127.0.0.1:<port>/v1`."""
        return f"{self.url}/v1"

    @property
    def scripted_requests(self) -> list[RecordedRequest]:
        """Requests that consumed a scripted turn (unscripted routes like /models excluded)."""
        return [r for r in self.requests if r.index >= 0]

    @property
    def last_request(self) -> RecordedRequest:
        reqs = self.scripted_requests
        assert reqs, "the fake server has received no scripted request"
        return reqs[-1]

    def _record(self, request: RecordedRequest) -> None:
        self.request_count += 1
        if self.keep_requests:
            self.requests.append(request)

    async def wait_idle(self) -> None:
        """Return once no scripted request is in progress (e.g. after a client hung up, the
        handler ends at its next write)."""
        while self.in_flight:
            await self._idle.wait()

    async def wait_connections_closed(self) -> None:
        """Return once every connection opened so far has ended (e.g. once a client that kept its
        connection alive was closed)."""
        while self.connections_closed < self.connections_opened:
            await self._closed.wait()

    # -- internals -----------------------------------------------------------------------------

    async def _next_turn(self, request: RecordedRequest) -> FakeTurn:
        if self._fn is not None:
            item = self._fn(request)
            if inspect.isawaitable(item):
                item = await item
            return _as_turn(item)
        if request.index >= len(self._script):
            raise ScriptExhaustedError(
                f"fake server script has {len(self._script)} turns but request #{request.index + 1} arrived"
            )
        return _as_turn(self._script[request.index])

    def _format_for(self, method: str, path: str) -> WireFormat | None:
        for fmt in self.formats:
            if fmt.matches(method, path):
                return fmt
        return None

    async def handle_connection(self, stream: trio.SocketStream) -> None:
        self.connections_opened += 1
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_BODY)
        try:
            for _ in range(_MAX_REQUESTS_PER_CONNECTION):
                request = await self._read_request(conn, stream)
                if request is None:
                    return
                keep_open = await self._respond(conn, stream, request)
                if not keep_open or conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return  # the client went away
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self.connections_closed += 1
            self._closed.set()
            self._closed = trio.Event()

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> RecordedRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)  # b"" marks EOF
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > _MAX_BODY:
                    raise h11.RemoteProtocolError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                break
        assert head is not None
        target = head.target.decode("latin-1")
        parts = urlsplit(target)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except ValueError:
                parsed = None
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        return RecordedRequest(head.method.decode(), parts.path, query, headers, parsed, bytes(body))

    async def _send(self, conn: h11.Connection, stream: trio.SocketStream, *events: Any) -> None:
        """Send h11 events in one write (a response's head, body and end go out together when
        nothing is meant to come between them: one syscall instead of one per event)."""
        data = b"".join(conn.send(event) or b"" for event in events)
        if data:
            await stream.send_all(data)

    async def _send_json(
        self,
        conn: h11.Connection,
        stream: trio.SocketStream,
        status: int,
        body: Any,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        payload = json.dumps(body).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
        headers += list((extra or {}).items())
        await self._send(
            conn, stream, h11.Response(status_code=status, headers=headers), h11.Data(data=payload), h11.EndOfMessage()
        )

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream, request: RecordedRequest) -> bool:
        """Answer one request; False means the connection must be closed."""
        fmt = self._format_for(request.method, request.path)
        if fmt is None:
            self._record(request)
            await self._send_json(
                conn, stream, 404, {"error": {"message": f"no route {request.method} {request.path}"}}
            )
            return True
        static = fmt.static_response(request)
        if static is not None:
            self._record(request)
            await self._send_json(conn, stream, 200, static)
            return True

        index = self._next_index
        self._next_index += 1
        request = RecordedRequest(
            request.method, request.path, request.query, request.headers, request.body, request.raw_body, index
        )
        self._record(request)
        if self.in_flight == 0:
            self._idle = trio.Event()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._respond_scripted(conn, stream, request, fmt)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    @staticmethod
    async def _peer_closed_within(conn: h11.Connection, stream: trio.SocketStream, seconds: float) -> bool:
        """Wait `seconds`, watching the connection: True as soon as the client closes it (a real
        server notices a client that hangs up while it prepares the response; our reply would
        otherwise go out in one write the kernel accepts even after the peer closed). Bytes that
        arrive meanwhile are handed to h11 for the next request."""
        with trio.move_on_after(seconds):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return True
                conn.receive_data(data)
        return False

    async def _respond_scripted(
        self, conn: h11.Connection, stream: trio.SocketStream, request: RecordedRequest, fmt: WireFormat
    ) -> bool:
        try:
            turn = await self._next_turn(request)
        except ScriptExhaustedError as e:
            self.errors.append(str(e))
            await self._send_json(conn, stream, 418, fmt.error_body(418, str(e), "script_exhausted"))
            return True
        delay = self.latency_s + turn.first_byte_delay
        if turn.first_byte_delay > 0:
            if await self._peer_closed_within(conn, stream, delay):
                return False  # the client went away while we "thought": nothing is sent
        elif delay > 0:
            await trio.sleep(delay)
        if turn.close_without_response:
            return False
        if turn.status != 200:
            extra = dict(turn.headers)
            if turn.retry_after is not None:
                ra = turn.retry_after
                extra["retry-after"] = str(int(ra)) if float(ra).is_integer() else f"{ra:g}"
            message = turn.error_message or f"fake server error {turn.status}"
            await self._send_json(
                conn, stream, turn.status, fmt.error_body(turn.status, message, turn.error_code), extra
            )
            return True
        body = request.body if isinstance(request.body, dict) else {}
        ctx = RenderContext(
            chunk_size=self.chunk_size,
            send_usage=self.send_usage,
            index=request.index,
            model=str(body.get("model") or (self.models[0] if self.models else "fake-model")),
            interleave_tool_calls=self.interleave_tool_calls,
        )
        reply = turn.scripted_reply
        try:  # a reply the format cannot render (e.g. malformed arguments Gemini sends as JSON)
            rendered = (
                fmt.stream_events(reply, request, ctx)
                if fmt.is_stream(request)
                else fmt.complete_response(reply, request, ctx)
            )
        except Exception as e:
            message = f"the fake server's {fmt.name} format cannot render turn {request.index + 1}: {e!r}"
            self.errors.append(message)
            await self._send_json(conn, stream, 500, fmt.error_body(500, message, "unrenderable_turn"))
            return True
        if not fmt.is_stream(request):
            await self._send_json(conn, stream, 200, rendered, turn.headers)
            return True
        events = rendered
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        headers += list(turn.headers.items())
        head = h11.Response(status_code=200, headers=headers)
        cut = turn.drop_after if turn.drop_after is not None else turn.truncate_after
        if turn.end_after is not None:
            events = events[: turn.end_after]
        if cut is None and turn.event_delay <= 0:  # nothing between the events: one chunk, one write
            await self._send(conn, stream, head, h11.Data(data=b"".join(events)), h11.EndOfMessage())
            self.completed_streams += 1
            return True
        await self._send(conn, stream, head)
        for n, ev in enumerate(events):
            if cut is not None and n == cut:
                if turn.truncate_after is not None:
                    await self._send(conn, stream, h11.Data(data=ev[: max(1, len(ev) // 2)]))
                return False  # close without finishing the chunked body
            if turn.event_delay > 0 and n > 0:
                await trio.sleep(turn.event_delay)
            await self._send(conn, stream, h11.Data(data=ev))
        await self._send(conn, stream, h11.EndOfMessage())
        self.completed_streams += 1
        return True


@asynccontextmanager
async def open_fake_server(
    script: Sequence[TurnLike] | TurnFn,
    *,
    formats: Iterable[WireFormat] | None = None,
    chunk_size: int = 4,
    latency_s: float = 0.0,
    send_usage: bool = True,
    interleave_tool_calls: bool = False,
    models: Sequence[str] = ("fake-model",),
    port: int = 0,
    keep_requests: bool = True,
) -> AsyncIterator[FakeServer]:
    """Start a FakeServer on 127.0.0.1 (a free port unless `port` is given); stopped on exit."""
    server = FakeServer(
        script,
        formats=formats,
        chunk_size=chunk_size,
        latency_s=latency_s,
        send_usage=send_usage,
        interleave_tool_calls=interleave_tool_calls,
        models=models,
        keep_requests=keep_requests,
    )
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle_connection, port, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
