"""Define tools from typed methods: `@tool` + `ToolEnvironment`.

    class Notes(ToolEnvironment):
        def __init__(self, notes: list[str] | None = None) -> None:
            self.notes = list(notes or [])

        @tool
        async def add_note(self, text: str, pinned: bool = False) -> str:
            '''Store a note.

            Args:
                text: What to remember.
                pinned: Keep it at the top.
            '''
            self.notes.insert(0, text) if pinned else self.notes.append(text)
            return f"{len(self.notes)} notes"

The JSON schema comes from the signature (str, int, float, bool, list[...], tuple[...],
dict, Literal[...], `X | None`, `Annotated[X, "description"]`); the description is the
docstring's first paragraph and parameter descriptions come from its `Args:` section.
A tool returns a `str` (the result text) or a `ToolResult` (its `tool_call_id` is filled in);
`raise ToolError("...")` reports a problem to the model as an error result.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Union

import trio

from rollouts.dtypes import AgentState, Tool, ToolCall, ToolResult
from rollouts.environments.base import EnvironmentBase

if TYPE_CHECKING:
    from rollouts.run_config import RunConfig

__all__ = ["ToolEnvironment", "ToolError", "ToolSpec", "schema_for_function", "tool"]

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class ToolError(Exception):
    """Raised inside a tool to send a clear error result to the model (not a crash)."""


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """What `@tool` attaches to a method: its `Tool` and the method's attribute name."""

    tool: Tool
    attr: str


def _json_type(tp: Any, where: str) -> dict[str, Any]:
    """JSON schema for a Python type annotation."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        schema = _json_type(args[0], where)
        texts = [a for a in args[1:] if isinstance(a, str)]
        if texts:
            schema["description"] = texts[0]
        return schema
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is Any:
        return {}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _json_type(non_none[0], where)
        return {"anyOf": [_json_type(a, where) for a in non_none]}
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _json_type(args[0], where)}
        if args and origin is not tuple:
            return {"type": "array", "items": _json_type(args[0], where)}
        return {"type": "array"}
    if origin in (dict, Mapping) or tp is dict:
        return {"type": "object"}
    raise TypeError(
        f"@tool: cannot turn the annotation {tp!r} of {where} into a JSON schema; "
        "use str, int, float, bool, list[...], dict, Literal[...] or X | None"
    )


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring."""
    doc = inspect.cleandoc(doc or "")
    lines = doc.splitlines()
    desc_lines: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines) and lines[i].strip().lower() not in ("args:", "arguments:", "parameters:"):
        desc_lines.append(lines[i])
        i += 1
    current: str | None = None
    for line in lines[i + 1 :]:
        if not line.strip():
            continue
        if not line.startswith((" ", "\t")):
            break  # another section (Returns:, Raises:, ...)
        m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?\s*:\s*(.*)$", line)
        if m and (current is None or len(line) - len(line.lstrip()) <= 4):
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current is not None:
            params[current] = (params[current] + " " + line.strip()).strip()
    description = "\n".join(desc_lines).strip()
    return description, params


def schema_for_function(fn: Callable[..., Any], *, skip_self: bool = True) -> tuple[str, dict[str, Any]]:
    """(description, JSON schema of the arguments) for a typed function."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    description, param_docs = _docstring_parts(fn.__doc__ or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        assert p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), (
            f"@tool {fn.__qualname__}: parameter {p.name!r} must be a plain or keyword-only parameter"
        )
        assert p.name in hints, f"@tool {fn.__qualname__}: parameter {p.name!r} needs a type annotation"
        schema = _json_type(hints[p.name], f"{fn.__qualname__}({p.name})")
        if p.name in param_docs and "description" not in schema:
            schema["description"] = param_docs[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
        elif p.default is not None and isinstance(p.default, (str, int, float, bool)):
            schema["default"] = p.default
        properties[p.name] = schema
    out: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = required
    return description, out


def tool(fn: F | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Mark an async method of a `ToolEnvironment` as a tool (usable as `@tool` or `@tool(name=...)`)."""

    def decorate(f: F) -> F:
        assert inspect.iscoroutinefunction(typing.cast(Any, f)), f"@tool {f.__qualname__} must be an `async def` method"
        tool_name = name or f.__name__
        assert _NAME_RE.match(tool_name), f"tool name {tool_name!r} must match {_NAME_RE.pattern}"
        desc, schema = schema_for_function(f)
        desc = description or desc
        assert desc, f"@tool {f.__qualname__} needs a docstring (or description=...) telling the model what it does"
        f.__rollouts_tool__ = ToolSpec(Tool(tool_name, desc, schema), f.__name__)  # type: ignore[attr-defined]
        return f

    if fn is not None:
        return decorate(fn)
    return decorate


_SPECS_CACHE: weakref.WeakKeyDictionary[type, tuple[ToolSpec, ...]] = weakref.WeakKeyDictionary()


class ToolEnvironment(EnvironmentBase):
    """An environment whose tools are its `@tool` methods (in definition order).

    Override `enabled_tools()` to hide some tools (e.g. presets). `exec_tool` calls the method
    with the call's arguments; `ToolError` becomes an error result."""

    @classmethod
    def tool_specs(cls) -> tuple[ToolSpec, ...]:
        """Every `@tool` method of the class and its bases (base-class tools first)."""
        cached = _SPECS_CACHE.get(cls)
        if cached is not None:
            return cached
        seen: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                spec = getattr(value, "__rollouts_tool__", None)
                if isinstance(spec, ToolSpec):
                    seen.pop(spec.tool.name, None)
                    seen[spec.tool.name] = ToolSpec(spec.tool, attr)
        specs = _SPECS_CACHE[cls] = tuple(seen.values())
        return specs

    def enabled_tools(self) -> Sequence[str] | None:
        """Names of the tools to offer, or None for all of them."""
        return None

    def _specs(self) -> dict[str, ToolSpec]:
        enabled = self.enabled_tools()
        specs = {s.tool.name: s for s in type(self).tool_specs()}
        if enabled is None:
            return specs
        return {n: specs[n] for n in specs if n in enabled}

    def get_tools(self) -> Sequence[Tool]:
        return tuple(s.tool for s in self._specs().values())

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        spec = self._specs().get(tool_call.name)
        if spec is None:
            names = ", ".join(self._specs()) or "(none)"
            return ToolResult(
                tool_call.id, f"Unknown tool '{tool_call.name}'. Available tools: {names}.", is_error=True
            )
        method = getattr(self, spec.attr)
        try:
            out = await method(**dict(tool_call.arguments))
        except ToolError as e:
            return ToolResult(tool_call.id, str(e), is_error=True)
        if isinstance(out, ToolResult):
            return dataclasses.replace(out, tool_call_id=tool_call.id)
        assert isinstance(out, str), f"tool {tool_call.name!r} must return str or ToolResult, got {type(out).__name__}"
        return ToolResult(tool_call.id, out)
