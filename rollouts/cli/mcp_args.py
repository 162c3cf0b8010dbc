"""`--mcp SERVER` (repeatable) for `rollouts run` and `rollouts eval`: an MCP server's tools added
to the environment `--env` makes (composed with it).

SERVER is a command line (`'python my_server.py'`, started over stdio) or a URL (streamable
HTTP), optionally followed by `Header=$VARIABLE` words whose values are read from the
environment (`'https://host/mcp Authorization=$MCP_AUTH'`). See `MCPServer.parse`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from rollouts.cli.common import CLIError
from rollouts.environments.base import Environment
from rollouts.errors import ConfigurationError

MCP_HELP = (
    "add the tools of an MCP server (repeatable): a command line started over stdio ('python server.py'), "
    "or a URL (streamable HTTP) optionally followed by Header=$VARIABLE words read from the environment "
    "('https://host/mcp Authorization=$MCP_AUTH')"
)


def add_mcp_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mcp", action="append", default=[], metavar="SERVER", help=MCP_HELP)


def check_mcp_args(specs: Sequence[str]) -> None:
    """Each `--mcp` value parses (a clear error now, not when connecting)."""
    from rollouts.environments.mcp import MCPServer

    for spec in specs:
        try:
            MCPServer.parse(spec)
        except ConfigurationError as e:
            raise CLIError(f"--mcp {spec!r}: {e}") from None


async def with_mcp(env: Environment, specs: Sequence[str]) -> Environment:
    """`env` composed with a fresh connection to each `--mcp` server (`env` itself when none).
    Tool names are kept as the servers give them; when they clash, each server's tools are
    offered as `mcp<N>_<name>`."""
    if not specs:
        return env
    from rollouts.environments.compose import compose
    from rollouts.environments.mcp import MCPEnvironment

    servers: list[Any] = []
    try:
        for spec in specs:
            try:
                servers.append(await MCPEnvironment.connect(spec))
            except ConfigurationError as e:
                raise CLIError(f"--mcp {spec!r}: {e}") from None
        try:
            return compose(env, *servers)
        except ValueError:
            return compose(env, *servers, prefixes=("", *(f"mcp{i}_" for i in range(1, len(servers) + 1))))
    except BaseException:
        for s in servers:
            await s.aclose()
        raise


def with_mcp_factory(factory: Callable[..., Any], specs: Sequence[str]) -> Callable[..., Any]:
    """An environment factory for `evaluate()` adding the `--mcp` servers to each sample's
    environment (every sample gets its own connections; `evaluate()` closes them)."""
    if not specs:
        return factory
    from rollouts.eval.run_sample import takes_row

    async def _made(env: Any) -> Environment:
        if hasattr(env, "__await__"):
            env = await env
        return await with_mcp(env, specs)

    async def with_row(row: Any) -> Environment:
        return await _made(factory(row))

    async def without_row() -> Environment:
        return await _made(factory())

    made = with_row if takes_row(factory) else without_row
    # the servers are part of the name, and so of the evaluation's fingerprint (resume reuses
    # samples only when they match); only variable names, never values, appear in them
    made.__qualname__ = f"{getattr(factory, '__qualname__', 'environment')}+mcp{list(specs)}"
    return made
