"""The Environment protocol: the tools an agent can call, with state that serializes.

An environment is a class with state. The agent loop calls `get_tools()` before each model call
and `exec_tool()` for each tool call. Before each tool call, the loop makes a fresh copy
(`deserialize(serialize())`), so earlier `AgentState`s keep the environment they had.

Contract:
* `serialize()` captures everything needed to continue (JSON-safe dict, no secrets);
  `deserialize(data)` is a classmethod that rebuilds an equal environment. It is called when a
  run resumes from a session and before each tool call.
* `exec_tool()` returns a `ToolResult`; a problem the model should see (bad input, a failing
  command) is a `ToolResult(is_error=True)`. An exception raised by a tool is also turned into
  an error result by the loop, but raising is for bugs, not for expected failures.
* `trio.Cancelled` must never be swallowed; clean up in `finally` / shielded scopes.
* Optional `async def aclose()` releases external resources (a worktree, a server).
  `evaluate()` calls it on the environment its factory made once the sample is done. Clones
  made by the loop share such resources, so closing one releases them for all.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import trio

from rollouts.dtypes import AgentState, Message, Tool, ToolCall, ToolResult

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

ToolFormatter: TypeAlias = Callable[[ToolCall, ToolResult | None], str]


@runtime_checkable
class Environment(Protocol):
    """The tools an agent can call and the state they change (see the module docstring for the
    contract; `EnvironmentBase` implements the optional parts)."""

    def get_tools(self) -> Sequence[Tool]:
        """The tools offered to the model, asked before every model call."""
        ...

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        """Run one call (already checked against its tool's schema); expected failures are
        `ToolResult(is_error=True)`."""
        ...

    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        """Whether `RunConfig.confirm_tool` must approve this call before it runs."""
        ...

    def get_tool_formatter(self, tool_name: str) -> ToolFormatter | None:
        """How a UI shows a call of `tool_name` (None: the default)."""
        ...

    def get_status_info(self) -> Mapping[str, str] | None:
        """A few strings describing the state, for a UI."""
        ...

    async def on_session_start(self, session_id: str) -> None:
        """Called once the run has a session (e.g. to name a branch after it)."""
        ...

    async def on_assistant_message(self, message: Message, state: AgentState) -> AgentState:
        """Sees every model message; may return a changed state."""
        ...

    async def serialize(self) -> dict[str, Any]:
        """Everything needed to continue, JSON-safe and without secrets."""
        ...

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        """A new, equal environment from `serialize()`'s output (cheap: no one-time setup)."""
        ...


class EnvironmentBase:
    """Defaults for the optional parts of the protocol; subclass and write the rest."""

    def get_tools(self) -> Sequence[Tool]:
        return ()

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        return ToolResult(tool_call.id, f"unknown tool {tool_call.name!r}", is_error=True)

    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        return False

    def get_tool_formatter(self, tool_name: str) -> ToolFormatter | None:
        return None

    def get_status_info(self) -> Mapping[str, str] | None:
        return None

    async def on_session_start(self, session_id: str) -> None:
        return None

    async def on_assistant_message(self, message: Message, state: AgentState) -> AgentState:
        return state

    async def serialize(self) -> dict[str, Any]:
        return {}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        return cls()

    async def aclose(self) -> None:
        """Release external resources (none by default)."""
        return None


def environment_type_name(env: Environment | type) -> str:
    """`module:QualName` of an environment (class or instance), used to find it again."""
    cls = env if isinstance(env, type) else type(env)
    return f"{cls.__module__}:{cls.__qualname__}"


def load_environment_class(type_name: str) -> type[Environment]:
    """Import the class named by `environment_type_name`."""
    module_name, sep, qualname = type_name.partition(":")
    if not sep:
        raise ValueError(f"environment type must look like 'module:Class', got {type_name!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


async def clone_environment(env: Environment) -> Environment:
    """A fresh, equal copy made through serialize/deserialize."""
    return await type(env).deserialize(await env.serialize())
