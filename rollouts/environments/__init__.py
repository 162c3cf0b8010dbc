"""Environments: the tools an agent can call. See `rollouts.environments.base` for the protocol
and docs/environments.md for how to write one."""

from rollouts.environments._process import CommandResult, run_command
from rollouts.environments.base import Environment, EnvironmentBase, ToolFormatter
from rollouts.environments.basic import BasicEnvironment
from rollouts.environments.browsing import BrowsingEnvironment, SearchBackend, SearchResult
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.environments.coding import PRESETS, CodingEnvironment
from rollouts.environments.compose import ComposedEnvironment, compose
from rollouts.environments.git_worktree import GitError, GitWorktreeEnvironment
from rollouts.environments.mcp import MCPEnvironment, MCPServer
from rollouts.environments.sandbox import (
    BubblewrapSandbox,
    DockerSandbox,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    Unsandboxed,
    resolve_sandbox,
)
from rollouts.environments.testing import check_environment, check_tools
from rollouts.environments.tools import ToolEnvironment, ToolError, tool

__all__ = [
    "PRESETS",
    "BasicEnvironment",
    "BrowsingEnvironment",
    "BubblewrapSandbox",
    "CalculatorEnvironment",
    "CodingEnvironment",
    "CommandResult",
    "ComposedEnvironment",
    "DockerSandbox",
    "Environment",
    "EnvironmentBase",
    "GitError",
    "GitWorktreeEnvironment",
    "MCPEnvironment",
    "MCPServer",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "SearchBackend",
    "SearchResult",
    "ToolEnvironment",
    "ToolError",
    "ToolFormatter",
    "Unsandboxed",
    "check_environment",
    "check_tools",
    "compose",
    "resolve_sandbox",
    "run_command",
    "tool",
]
