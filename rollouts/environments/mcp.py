"""MCPEnvironment: the tools of a Model Context Protocol server as an agent's tools.

    env = await MCPEnvironment.connect(MCPServer.stdio("npx -y @modelcontextprotocol/server-everything"))
    env = await MCPEnvironment.connect(MCPServer.http("https://mcp.example.com/mcp",
                                                      headers_from_env={"Authorization": "MCP_AUTH"}))
    env = compose(env, CodingEnvironment("repo"))      # several servers: compose, prefixes if names clash

Built on the official `mcp` SDK (`pip install 'rollouts[mcp]'`), which runs on anyio and so
under trio. A server is reached over stdio (a command this process starts; it gets only a few
harmless variables of this process's environment plus `env` and the variables named in
`pass_env`) or streamable HTTP (a URL; header values are read from environment variables when
connecting and never written anywhere: only the variables' names are serialized).

* `connect()` opens the connection and lists the tools; each becomes a `Tool` with the server's
  JSON schema (names outside `[a-zA-Z0-9_-]` are offered with `_` in their place).
* A call's text content, structured content (also in `details["structured_content"]`) and
  errors (`is_error`, and protocol errors) become the `ToolResult`.
* The connection's lifetime is the environment's: `aclose()` ends it (the stdio server process
  with it); clones made by the agent loop share it.
* A server that dies or hangs mid-call gives an error result (at once, or at `call_timeout`),
  never a hang; the next call connects again.
* `serialize()` records how to reconnect (the server, the tool list, the connection's key), so
  a resumed session and `deserialize()` in another process connect to the same server anew.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import trio

from rollouts.dtypes import AgentState, Tool, ToolCall, ToolResult
from rollouts.environments._mcp_connection import Connection, ConnectionLost, connection, forget
from rollouts.environments.base import EnvironmentBase
from rollouts.errors import ConfigurationError

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

__all__ = ["MCPEnvironment", "MCPServer"]

_NAME_OK = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_HEADER_VAR = re.compile(r"^([A-Za-z0-9-]+)=\$([A-Za-z_][A-Za-z0-9_]*)$")
DEFAULT_CALL_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 60.0
INSTALL_HINT = "pip install 'rollouts[mcp]'"


@dataclasses.dataclass(frozen=True)
class MCPServer:
    """How to reach an MCP server: `command` (stdio) or `url` (streamable HTTP). Build one with
    `MCPServer.stdio(...)`, `MCPServer.http(...)` or `MCPServer.parse(text)`.

    Attributes:
        command: the server's command line (stdio).
        url: the server's endpoint (streamable HTTP).
        headers_from_env: (header, environment variable) pairs: each header's value is the
            variable's value, read when connecting.
        env: (name, value) pairs set for a stdio server (serialized: no secrets here).
        pass_env: names of this process's variables passed to a stdio server (values never stored).
        cwd: a stdio server's working directory.
    """

    command: tuple[str, ...] = ()
    url: str = ""
    headers_from_env: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    pass_env: tuple[str, ...] = ()
    cwd: str | None = None

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ConfigurationError("an MCP server needs either a command (stdio) or a URL (streamable HTTP)")
        if self.url:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigurationError(f"MCP server URL {self.url!r} must be http:// or https:// with a host")
            if parts.username or parts.password:
                raise ConfigurationError(
                    "put no credentials in the MCP server URL (it is recorded in sessions); pass them in a header "
                    "read from an environment variable, e.g. 'https://host/mcp Authorization=$MCP_AUTH'"
                )

    @classmethod
    def stdio(
        cls,
        command: str | Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        cwd: str | None = None,
    ) -> MCPServer:
        """A server this process starts: `command` is a command line (split like a shell) or argv."""
        argv = tuple(shlex.split(command)) if isinstance(command, str) else tuple(command)
        if not argv:
            raise ConfigurationError("the MCP server command is empty")
        return cls(command=argv, env=tuple(sorted((env or {}).items())), pass_env=tuple(pass_env), cwd=cwd)

    @classmethod
    def http(cls, url: str, *, headers_from_env: Mapping[str, str] | None = None) -> MCPServer:
        """A server at `url` (streamable HTTP); `headers_from_env` maps header names to the
        environment variables holding their values, e.g. `{"Authorization": "MCP_AUTH"}`."""
        return cls(url=url, headers_from_env=tuple(sorted((headers_from_env or {}).items())))

    @classmethod
    def parse(cls, text: str) -> MCPServer:
        """What `--mcp` takes: a URL, optionally followed by `Header=$VARIABLE` words
        (`'https://host/mcp Authorization=$MCP_AUTH'`), or a command line (`'python server.py'`)."""
        words = shlex.split(text)
        if not words:
            raise ConfigurationError("--mcp needs a command or a URL")
        if re.match(r"^https?://", words[0]):
            headers: dict[str, str] = {}
            for w in words[1:]:
                m = _HEADER_VAR.match(w)
                if m is None:
                    raise ConfigurationError(
                        f"after an MCP server URL give only Header=$VARIABLE words (the value is read from the "
                        f"environment variable), got {w!r}"
                    )
                headers[m.group(1)] = m.group(2)
            return cls.http(words[0], headers_from_env=headers)
        return cls.stdio(words)

    @property
    def label(self) -> str:
        """A short name for messages: the URL, or the command's program and first argument."""
        if self.url:
            return self.url
        return " ".join(os.path.basename(w) if i == 0 else w for i, w in enumerate(self.command[:2]))

    def resolve_headers(self) -> dict[str, str]:
        """The HTTP headers, values read from the environment now."""
        out: dict[str, str] = {}
        for header, var in self.headers_from_env:
            value = os.environ.get(var)
            if value is None:
                raise ConfigurationError(
                    f"the MCP server {self.url} needs header {header} from the environment variable {var}, "
                    "which is not set"
                )
            out[header] = value
        return out

    def resolve_env(self) -> dict[str, str]:
        """A stdio server's extra variables: `env`, then the `pass_env` ones that are set."""
        passed = {n: os.environ[n] for n in self.pass_env if n in os.environ}
        return {**dict(self.env), **passed}

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": list(self.command),
            "url": self.url,
            "headers_from_env": dict(self.headers_from_env),
            "env": dict(self.env),
            "pass_env": list(self.pass_env),
            "cwd": self.cwd,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MCPServer:
        return cls(
            command=tuple(data.get("command", ())),
            url=str(data.get("url", "")),
            headers_from_env=tuple(sorted(dict(data.get("headers_from_env", {})).items())),
            env=tuple(sorted(dict(data.get("env", {})).items())),
            pass_env=tuple(data.get("pass_env", ())),
            cwd=data.get("cwd"),
        )


def _offered_name(name: str, taken: set[str]) -> str:
    base = name if _NAME_OK.match(name) else (re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:60] or "tool")
    offered, n = base, 1
    while offered in taken:
        n += 1
        offered = f"{base[:58]}_{n}"
    taken.add(offered)
    return offered


def _tool_entries(mcp_tools: Sequence[Any], label: str) -> list[dict[str, Any]]:
    taken: set[str] = set()
    entries = []
    for t in mcp_tools:
        schema = dict(t.input_schema or {"type": "object", "properties": {}})
        schema.setdefault("type", "object")
        entries.append(
            {
                "name": _offered_name(t.name, taken),
                "mcp_name": t.name,
                "description": t.description or f"{t.name} (a tool of the MCP server {label})",
                "parameters": schema,
            }
        )
    return entries


def _render(result: Any) -> str:
    """A CallToolResult's content as text (non-text blocks are described, not inlined)."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource {res.uri} ({res.mime_type or 'binary'})]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{kind or type(block).__name__} content]")
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return text or ("(the tool failed without a message)" if result.is_error else "(no output)")


class MCPEnvironment(EnvironmentBase):
    """The tools of one MCP server (see the module docstring). Make it with
    `await MCPEnvironment.connect(server)`; the constructor takes the tool list as recorded by
    `serialize()` and connects on the first call.

    Args:
        server: the `MCPServer` to reach.
        tools: tool entries (`name`, `mcp_name`, `description`, `parameters`), as `connect()` lists them.
        call_timeout: seconds a call may take before it gives an error result (and the
            connection is started again).
        connect_timeout: seconds to wait for a (re)connection.
        connection: the key of a live connection to share (clones); a fresh one when omitted.
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
        connection: str | None = None,
    ) -> None:
        if call_timeout <= 0 or connect_timeout <= 0:
            raise ValueError("call_timeout and connect_timeout must be > 0")
        self.server = server
        self.tools = [dict(t) for t in tools]
        self.call_timeout = float(call_timeout)
        self.connect_timeout = float(connect_timeout)
        self.connection_key = connection or uuid.uuid4().hex
        self._by_name = {t["name"]: t for t in self.tools}

    @classmethod
    async def connect(
        cls,
        server: MCPServer | str,
        *,
        call_timeout: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> MCPEnvironment:
        """Connect to `server` (an `MCPServer`, or text as `MCPServer.parse` takes) and list its
        tools. Raises `ConfigurationError` when the SDK is missing or the server cannot be reached."""
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigurationError(f"MCP servers need the official SDK: {INSTALL_HINT}") from None
        spec = MCPServer.parse(server) if isinstance(server, str) else server
        env = cls(spec, call_timeout=call_timeout, connect_timeout=connect_timeout)
        try:
            listed = await env._conn().request("list", "", {}, connect_timeout + call_timeout)
        except (ConnectionLost, trio.TooSlowError) as e:
            await env.aclose()
            raise ConfigurationError(f"MCP server {spec.label}: {e or 'no answer in time'}") from None
        except Exception as e:
            await env.aclose()
            raise ConfigurationError(f"MCP server {spec.label} could not list its tools: {e}") from None
        env.tools = _tool_entries(listed, spec.label)
        env._by_name = {t["name"]: t for t in env.tools}
        return env

    def _conn(self) -> Connection:
        return connection(self.server, self.connection_key, self.connect_timeout)

    # ---- protocol ----------------------------------------------------------------------

    def get_tools(self) -> Sequence[Tool]:
        return tuple(Tool(t["name"], t["description"], t["parameters"]) for t in self.tools)

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        entry = self._by_name.get(tool_call.name)
        if entry is None:
            names = ", ".join(self._by_name) or "(none)"
            return ToolResult(
                tool_call.id, f"Unknown tool '{tool_call.name}'. Available tools: {names}.", is_error=True
            )
        conn = self._conn()
        label = self.server.label
        arguments = dict(tool_call.arguments)
        try:
            result = await conn.request("call", entry["mcp_name"], arguments, self.call_timeout)
        except trio.TooSlowError:
            conn.drop()
            return self._error(
                tool_call,
                f"the MCP server {label} did not answer within {self.call_timeout:g}s; "
                "the connection was closed and the next call connects again",
            )
        except ConnectionLost as e:
            conn.drop()
            return self._error(tool_call, f"the MCP server {label} failed: {e}; the next call connects again")
        except Exception as e:  # raised by the SDK for this request: the server's refusal, or a broken transport
            return self._error(tool_call, f"the MCP server {label} could not run the call: {type(e).__name__}: {e}")
        details: dict[str, Any] = {"mcp_server": label}
        if result.structured_content is not None:
            details["structured_content"] = result.structured_content
        return ToolResult(tool_call.id, _render(result), is_error=bool(result.is_error), details=details)

    @staticmethod
    def _error(tool_call: ToolCall, text: str) -> ToolResult:
        return ToolResult(tool_call.id, text[0].upper() + text[1:] + ".", is_error=True)

    def get_status_info(self) -> dict[str, str]:
        return {"mcp_server": self.server.label}

    async def aclose(self) -> None:
        """End the connection (and a stdio server's process); clones share it, so it ends for all."""
        conn = self._conn()
        try:
            await conn.aclose()
        finally:
            forget(self.connection_key, conn)

    async def serialize(self) -> dict[str, Any]:
        return {
            "server": self.server.to_dict(),
            "tools": [dict(t) for t in self.tools],
            "call_timeout": self.call_timeout,
            "connect_timeout": self.connect_timeout,
            "connection": self.connection_key,
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        return cls(
            MCPServer.from_dict(data["server"]),
            tools=data.get("tools", ()),
            call_timeout=data.get("call_timeout", DEFAULT_CALL_TIMEOUT_S),
            connect_timeout=data.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT_S),
            connection=data.get("connection"),
        )
