"""BasicEnvironment: no tools. A plain conversation."""

from __future__ import annotations

from rollouts.environments.base import EnvironmentBase


class BasicEnvironment(EnvironmentBase):
    """An environment with no tools and no state."""
