"""Environments: the tools an agent can call. See `rollouts.environments.base` for the protocol."""

from rollouts.environments.base import Environment, EnvironmentBase, ToolFormatter
from rollouts.environments.basic import BasicEnvironment
from rollouts.environments.calculator import CalculatorEnvironment

__all__ = ["BasicEnvironment", "CalculatorEnvironment", "Environment", "EnvironmentBase", "ToolFormatter"]
