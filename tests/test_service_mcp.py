"""The service's environment settings name MCP servers only as the operator's policy defines them
(`[mcp.NAME]`, used as environment "mcp/NAME"); a request never gives a command or a URL."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rollouts import RunConfig, ToolCall
from rollouts.errors import ConfigurationError
from rollouts.service.execution import resolve_environment
from rollouts.service.policy import PolicyError, ServicePolicy
from rollouts.service.requests import ApiError, parse_environment

SERVER = str(Path(__file__).with_name("_mcp_server.py"))


def _policy(tmp_path: Path, extra: str = "") -> ServicePolicy:
    path = tmp_path / "policy.toml"
    path.write_text(
        f'[mcp.tests]\ncommand = ["{sys.executable}", "{SERVER}", "stdio"]\n'
        '[mcp.remote]\nurl = "https://mcp.example.com/mcp"\nheaders_from_env = { Authorization = "REMOTE_MCP_AUTH" }\n'
        + extra
    )
    return ServicePolicy.load(path)


def _field(env: str, policy: ServicePolicy | None) -> str | None:
    try:
        parse_environment({"environment": env}, policy)
    except ApiError as e:
        return e.field
    return None


def test_requests_name_only_the_operators_mcp_servers(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    assert policy.mcp_servers["remote"].headers_from_env == (("Authorization", "REMOTE_MCP_AUTH"),)
    for ok in ("mcp/tests", "calculator+mcp/tests", "mcp/tests+mcp/remote"):
        assert _field(ok, policy) is None, ok
    for refused in ("mcp/nope", "calculator+mcp/nope", "mcp/python -c 'boom'", "calculator+os:abort"):
        assert _field(refused, policy) == "environment", refused
    assert _field("mcp/tests", None) == "environment"  # the built-in policy defines no MCP server
    with pytest.raises(PolicyError, match=r"no MCP server 'nope'.*configured: remote, tests"):
        resolve_environment("mcp/nope", policy)  # a worker checks again


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[mcp.bad]\ncommand = "x"\nshell = true\n', "unknown setting"),
        ('[mcp.bad]\ncommand = "x"\npass_env = ["ROLLOUTS_SERVICE_DB"]\n', "service's own configuration"),
        ("[mcp.bad]\ncwd = '/'\n", "needs command"),
        ('[mcp.bad]\nurl = "https://u:p@host/mcp"\n', "no credentials in the MCP server URL"),
    ],
)
def test_the_policys_mcp_tables_are_checked(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _policy(tmp_path, extra)


async def test_a_worker_composes_the_named_mcp_server_with_the_environment(tmp_path: Path) -> None:
    factory = resolve_environment("calculator+mcp/tests", _policy(tmp_path))
    assert factory is not None
    env = await factory()
    try:
        names = {t.name for t in env.get_tools()}
        assert {"add", "multiply", "tests_add", "tests_echo"} <= names  # clashing names: prefixed
        r = await env.exec_tool(ToolCall("1", "tests_echo", {"text": "from the worker"}), None, RunConfig())  # type: ignore[arg-type]
        assert not r.is_error and r.content == "from the worker"
    finally:
        await env.aclose()
