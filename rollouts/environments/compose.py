"""compose(): several environments behind one, tools routed by name.

    env = compose(CodingEnvironment("."), BrowsingEnvironment(allow_hosts=["docs.python.org"]))
    env = compose(CodingEnvironment("a"), CodingEnvironment("b"), prefixes=("a_", "b_"))

Tool names must be unique across the parts; when they are not, give `prefixes` (one per part,
"" for none) and each part's tools are offered as `<prefix><name>`. `serialize()` stores every
part with its type, so `ComposedEnvironment.deserialize` rebuilds them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from rollouts.dtypes import AgentState, Message, Tool, ToolCall, ToolResult
from rollouts.environments.base import (
    Environment,
    EnvironmentBase,
    ToolFormatter,
    environment_type_name,
    load_environment_class,
)

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

__all__ = ["ComposedEnvironment", "compose"]


class ComposedEnvironment(EnvironmentBase):
    """Several environments as one. Build it with `compose()`."""

    def __init__(self, parts: Sequence[Environment], prefixes: Sequence[str] | None = None) -> None:
        if not parts:
            raise ValueError("compose() needs at least one environment")
        for p in parts:
            if not isinstance(p, Environment):
                raise TypeError(f"compose(): {p!r} is not an Environment (see rollouts.environments.base)")
        if prefixes is None:
            prefixes = ("",) * len(parts)
        if len(prefixes) != len(parts):
            raise ValueError(
                f"compose(): got {len(prefixes)} prefixes for {len(parts)} environments; give one per environment"
            )
        self.parts = tuple(parts)
        self.prefixes = tuple(prefixes)
        self._routes()  # fail now on collisions

    def _routes(self) -> dict[str, tuple[int, Tool]]:
        """{offered name: (part index, the part's own Tool)}; raises on collisions."""
        routes: dict[str, tuple[int, Tool]] = {}
        for i, (part, prefix) in enumerate(zip(self.parts, self.prefixes, strict=True)):
            for t in part.get_tools():
                name = prefix + t.name
                if name in routes:
                    other = type(self.parts[routes[name][0]]).__name__
                    raise ValueError(
                        f"compose(): tool name {name!r} is offered by both {other} and {type(part).__name__}; "
                        "pass prefixes=(...) with one prefix per environment, e.g. prefixes=('a_', 'b_')"
                    )
                routes[name] = (i, t)
        return routes

    def _route(self, tool_call: ToolCall) -> tuple[Environment, ToolCall] | None:
        hit = self._routes().get(tool_call.name)
        if hit is None:
            return None
        i, t = hit
        return self.parts[i], dataclasses.replace(tool_call, name=t.name)

    def get_tools(self) -> Sequence[Tool]:
        return tuple(dataclasses.replace(t, name=name) for name, (_, t) in self._routes().items())

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        routed = self._route(tool_call)
        if routed is None:
            names = ", ".join(self._routes()) or "(none)"
            return ToolResult(
                tool_call.id, f"Unknown tool '{tool_call.name}'. Available tools: {names}.", is_error=True
            )
        part, inner = routed
        return await part.exec_tool(inner, state, run_config, cancel_scope)

    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        routed = self._route(tool_call)
        return routed is not None and routed[0].requires_confirmation(routed[1])

    def get_tool_formatter(self, tool_name: str) -> ToolFormatter | None:
        hit = self._routes().get(tool_name)
        if hit is None:
            return None
        i, t = hit
        return self.parts[i].get_tool_formatter(t.name)

    def get_status_info(self) -> dict[str, str] | None:
        info: dict[str, str] = {}
        for part, prefix in zip(self.parts, self.prefixes, strict=True):
            for k, v in (part.get_status_info() or {}).items():
                key = prefix + k
                info[key if key not in info else f"{type(part).__name__}.{k}"] = v
        return info or None

    async def on_session_start(self, session_id: str) -> None:
        for part in self.parts:
            await part.on_session_start(session_id)

    async def on_assistant_message(self, message: Message, state: AgentState) -> AgentState:
        for part in self.parts:
            state = await part.on_assistant_message(message, state)
        return state

    async def aclose(self) -> None:
        """Close every part that has `aclose()` (e.g. remove git worktrees), even if one fails."""
        with trio.CancelScope(shield=True):
            errors: list[Exception] = []
            for part in self.parts:
                close = getattr(part, "aclose", None)
                if close is None:
                    continue
                try:
                    await close()
                except Exception as e:
                    errors.append(e)
            if errors:
                raise ExceptionGroup("closing composed environments failed", errors)

    async def serialize(self) -> dict[str, Any]:
        return {
            "parts": [{"type": environment_type_name(p), "state": await p.serialize()} for p in self.parts],
            "prefixes": list(self.prefixes),
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        parts = [await load_environment_class(p["type"]).deserialize(p["state"]) for p in data["parts"]]
        return cls(parts, data["prefixes"])


def compose(*envs: Environment, prefixes: Sequence[str] | None = None) -> ComposedEnvironment:
    """One environment offering the tools of all `envs`; see the module docstring."""
    return ComposedEnvironment(envs, prefixes)
