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
from rollouts.environments.testing import check_environment, check_tools
from rollouts.environments.tools import ToolEnvironment, ToolError, tool

__all__ = [
    "PRESETS",
    "BasicEnvironment",
    "BrowsingEnvironment",
    "CalculatorEnvironment",
    "CodingEnvironment",
    "CommandResult",
    "ComposedEnvironment",
    "Environment",
    "EnvironmentBase",
    "GitError",
    "GitWorktreeEnvironment",
    "SearchBackend",
    "SearchResult",
    "ToolEnvironment",
    "ToolError",
    "ToolFormatter",
    "check_environment",
    "check_tools",
    "compose",
    "run_command",
    "tool",
]
