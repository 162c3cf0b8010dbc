"""A real MCP server for the tests, written with the SDK's server API (`MCPServer`).

    python tests/_mcp_server.py stdio          # over stdin/stdout
    python tests/_mcp_server.py http [PORT]    # streamable HTTP on 127.0.0.1 (0: any free port);
                                               # prints "PORT <n>" once it listens

Tools: `add` (structured result), `echo`, `fail` (a tool error), `pid`, `hang` (sleeps until
killed), `remember`/`recall` (notes kept per MCP session: what samples must not share),
`whoami` (a hash of the Authorization header the HTTP server received, for the header tests),
`bash` (says what it was asked to run: the CLI tests' scripted `shell` model calls it)."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("rollouts-test-server")
_notes: dict[str, list[str]] = {}


def _session_key(ctx: Context) -> str:
    """One key per client connection: the HTTP session id, else (stdio: one client) the process."""
    request = getattr(ctx.request_context, "request", None)
    sid = request.headers.get("mcp-session-id") if request is not None else None
    return sid or f"process-{os.getpid()}"


@server.tool()
def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ValueError(message)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def hang(marker: str) -> str:
    """Write the marker file, then never answer."""
    await anyio.Path(marker).write_text(str(os.getpid()))
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
def remember(note: str, ctx: Context) -> str:
    """Keep a note for this session."""
    _notes.setdefault(_session_key(ctx), []).append(note)
    return "ok"


@server.tool()
def recall(ctx: Context) -> list[str]:
    """The notes of this session."""
    return _notes.get(_session_key(ctx), [])


@server.tool()
def whoami(ctx: Context) -> str:
    """The SHA-256 of this HTTP request's Authorization header ('' over stdio or without one): the
    test compares it without the secret itself entering the transcript."""
    request = getattr(ctx.request_context, "request", None)
    value = request.headers.get("authorization", "") if request is not None else ""
    return hashlib.sha256(value.encode()).hexdigest() if value else ""


@server.tool()
def bash(command: str, ctx: Context) -> str:
    """Pretends to run a command (for the CLI tests' scripted `shell` model): says what it got,
    and a hash of the Authorization header when the HTTP request had one."""
    request = getattr(ctx.request_context, "request", None)
    value = request.headers.get("authorization", "") if request is not None else ""
    who = f" as {hashlib.sha256(value.encode()).hexdigest()[:12]}" if value else ""
    return f"mcp ran: {command}{who}"


async def _serve_http(port: int) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.set_inheritable(True)
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    app: Any = server.streamable_http_app()
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await serve(app, config)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        anyio.run(server.run_stdio_async, backend="trio")
    else:
        anyio.run(_serve_http, int(sys.argv[2]) if len(sys.argv) > 2 else 0, backend="trio")
