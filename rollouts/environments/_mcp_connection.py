"""One live connection to an MCP server, shared by an environment and its clones.

The official SDK's `Client` is an async context manager whose task group must be entered and
left by one task, while an environment lives across the agent loop's tasks. So each connection
is owned by a trio *system task* that opens the `Client`, then serves requests sent to it over
a bounded channel (each request gets its own one-shot reply channel) until it is dropped. A
request never waits forever:

* the owner dying (server crash, transport error, `drop()`) closes every pending and queued
  request's reply channel: the caller sees `ConnectionLost` at once;
* every call has a time limit; past it the connection is dropped (the server process is
  stopped by the SDK) and the next call connects again.

Connections are found by key (`MCPEnvironment.serialize()` records it), so clones made by the
agent loop share one; a key unknown in this trio run (a resumed session, another process)
gets a new connection to the same server.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import IO, TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from rollouts.environments.mcp import MCPServer

_MAX_QUEUED = 256
_CLOSE_TIMEOUT_S = 15.0
_MAX_TOOL_PAGES = 100
_STDERR_TAIL = 2000


class ConnectionLost(Exception):
    """The connection failed or ended before the request was answered."""


@dataclasses.dataclass
class _Request:
    op: str  # "call" or "list"
    name: str
    arguments: Mapping[str, Any]
    reply: trio.MemorySendChannel[tuple[bool, Any]]


def _is_connection_error(e: BaseException) -> bool:
    """Whether `e` means the connection is unusable (as opposed to one request's failure)."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED
    from pydantic import ValidationError

    if isinstance(e, MCPError):
        return e.code == CONNECTION_CLOSED
    return not isinstance(e, ValidationError | ValueError | TypeError)


class Connection:
    """A lazily (re)connected MCP client session; see the module docstring."""

    def __init__(self, server: MCPServer, key: str, connect_timeout_s: float) -> None:
        self.server = server
        self.key = key
        self.connect_timeout_s = connect_timeout_s
        self.token = trio.lowlevel.current_trio_token()
        self.closed = False
        self.connects = 0
        self._lock = trio.Lock()
        self._inbox: trio.MemorySendChannel[_Request] | None = None
        self._scope: trio.CancelScope | None = None
        self._done: trio.Event | None = None

    # ---- the owner task ----------------------------------------------------------------

    @asynccontextmanager
    async def _client(self, errlog: IO[str]) -> AsyncIterator[Any]:
        from mcp import Client, StdioServerParameters
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        s = self.server
        if s.url:
            async with create_mcp_http_client(headers=s.resolve_headers()) as http:
                transport = streamable_http_client(s.url, http_client=http)
                async with Client(transport, cache=None) as client:
                    yield client
        else:
            params = StdioServerParameters(
                command=s.command[0], args=list(s.command[1:]), env=s.resolve_env(), cwd=s.cwd
            )
            from mcp.client.stdio import stdio_client

            async with Client(stdio_client(params, errlog=errlog), cache=None) as client:  # type: ignore[arg-type]
                yield client

    async def _owner(
        self,
        inbox: trio.MemoryReceiveChannel[_Request],
        scope: trio.CancelScope,
        ready: trio.Event,
        failure: list[BaseException],
        done: trio.Event,
        errlog: IO[str],
        stderr_tail: list[str],
    ) -> None:
        try:
            with scope:
                try:
                    async with self._client(errlog) as client, trio.open_nursery() as nursery:
                        ready.set()
                        async for request in inbox:
                            nursery.start_soon(self._serve, client, request, scope)
                except BaseException as e:  # split: cancellation always propagates
                    _keep_cancellation(e, failure)
        finally:
            ready.set()
            while True:  # answer the queued requests: the connection is gone
                try:
                    inbox.receive_nowait().reply.close()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            inbox.close()
            if self._scope is scope:
                self._inbox = None
                self._scope = None
            if failure:
                stderr_tail.append(_tail(errlog))
            errlog.close()
            done.set()

    async def _serve(self, client: Any, request: _Request, scope: trio.CancelScope) -> None:
        async with request.reply:
            try:
                if request.op == "list":
                    tools: list[Any] = []
                    cursor = None
                    for _ in range(_MAX_TOOL_PAGES):
                        page = await client.list_tools(cursor=cursor)
                        tools.extend(page.tools)
                        cursor = page.next_cursor
                        if cursor is None:
                            break
                    value: Any = tools
                else:
                    value = await client.call_tool(request.name, dict(request.arguments))
            except Exception as e:
                if _is_connection_error(e):
                    self._detach(scope)  # this connection is done for; the next request reconnects
                await request.reply.send((False, e))
                return
            await request.reply.send((True, value))

    # ---- callers -----------------------------------------------------------------------

    async def _ensure(self) -> trio.MemorySendChannel[_Request]:
        async with self._lock:
            if self.closed:
                raise ConnectionLost("the environment was closed (aclose)")
            if self._inbox is not None:
                return self._inbox
            send, recv = trio.open_memory_channel[_Request](_MAX_QUEUED)
            scope, ready, done = trio.CancelScope(), trio.Event(), trio.Event()
            failure: list[BaseException] = []
            stderr_tail: list[str] = []
            errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
            self._inbox, self._scope, self._done = send, scope, done
            self.connects += 1
            trio.lowlevel.spawn_system_task(
                self._owner, recv, scope, ready, failure, done, errlog, stderr_tail, name=f"mcp:{self.server.label}"
            )
            with trio.move_on_after(self.connect_timeout_s) as deadline:
                await ready.wait()
            if deadline.cancelled_caught or failure or done.is_set():
                self._detach(scope)
                with trio.move_on_after(2):  # the owner records the server's last words as it ends
                    await done.wait()
                tail = stderr_tail[0] if stderr_tail else ""
                why = (
                    f"no answer within {self.connect_timeout_s:g}s" if deadline.cancelled_caught else _describe(failure)
                )
                stderr = f"; its stderr ends with: {tail}" if tail else ""
                raise ConnectionLost(f"could not connect to the MCP server {self.server.label}: {why}{stderr}")
            return send

    async def request(self, op: str, name: str, arguments: Mapping[str, Any], timeout_s: float) -> Any:
        """Send one request and return its result; raises ConnectionLost, TimeoutError, or the
        SDK's error for a request the server refused."""
        with trio.fail_after(timeout_s):
            inbox = await self._ensure()
            reply_send, reply_recv = trio.open_memory_channel[tuple[bool, Any]](1)
            try:
                inbox.send_nowait(_Request(op, name, arguments, reply_send))
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
                reply_send.close()
                raise ConnectionLost("the connection ended before the request was sent") from None
            try:
                ok, value = await reply_recv.receive()
            except trio.EndOfChannel:
                raise ConnectionLost("the connection ended during the request") from None
        if not ok:
            raise value
        return value

    def _detach(self, scope: trio.CancelScope) -> None:
        """Stop the owner of `scope` and forget it at once: requests from now on go to a new
        connection while the old one winds down."""
        scope.cancel()
        if self._scope is scope:
            self._inbox = None
            self._scope = None

    def drop(self) -> None:
        """Stop the current owner (its server process too); the next request reconnects."""
        if self._scope is not None:
            self._detach(self._scope)

    async def aclose(self) -> None:
        """Close for good (bounded wait for the server to stop)."""
        self.closed = True
        done = self._done
        self.drop()
        if done is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(_CLOSE_TIMEOUT_S):
                await done.wait()


def _keep_cancellation(e: BaseException, failure: list[BaseException]) -> None:
    """Record a failure of the connection (callers see it; the run goes on: a system task must
    not crash) and re-raise whatever part of `e` is cancellation or an interrupt."""
    if isinstance(e, BaseExceptionGroup):
        keep, rest = e.split((trio.Cancelled, KeyboardInterrupt, SystemExit))
        if rest is not None:
            failure.append(rest)
        if keep is not None:
            raise keep
        return
    if not isinstance(e, Exception):
        raise e
    failure.append(e)


def _describe(failure: list[BaseException]) -> str:
    if not failure:
        return "it ended the connection"
    e = failure[0]
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:500]


def _tail(f: IO[str]) -> str:
    try:
        f.flush()
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - _STDERR_TAIL))
        return " ".join(f.read().split())[-_STDERR_TAIL:]
    except (OSError, ValueError):
        return ""


_LIVE: dict[str, Connection] = {}


def connection(server: MCPServer, key: str, connect_timeout_s: float) -> Connection:
    """The live connection recorded under `key` in this trio run, or a new one."""
    token = trio.lowlevel.current_trio_token()
    c = _LIVE.get(key)
    if c is None or c.closed or c.server != server or c.token is not token:
        for k in [k for k, v in _LIVE.items() if v.token is not token]:  # left by finished trio runs
            del _LIVE[k]
        c = Connection(server, key, connect_timeout_s)
        _LIVE[key] = c
    return c


def forget(key: str, conn: Connection) -> None:
    if _LIVE.get(key) is conn:
        del _LIVE[key]
