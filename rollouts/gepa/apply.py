"""Putting a candidate's texts into an agent: the system prompt, `{{name}}` placeholders in
messages, and tool descriptions.

    system_prompt       (default name) becomes the first system message (replacing one the row has)
    tool:NAME           becomes the description of the environment's tool NAME
    any other name      replaces `{{name}}` in the text of the messages prepare_messages makes
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from rollouts.dtypes import AgentState, Message, TextContent, Tool, ToolCall, ToolResult
from rollouts.environments.base import (
    Environment,
    EnvironmentBase,
    ToolFormatter,
    environment_type_name,
    load_environment_class,
)
from rollouts.errors import ConfigurationError
from rollouts.eval.config import EnvironmentFactory, PrepareMessages, Row

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

__all__ = ["TOOL_PREFIX", "ToolTextEnvironment", "placeholder", "split_components"]

TOOL_PREFIX = "tool:"


def placeholder(name: str) -> str:
    return "{{" + name + "}}"


def split_components(
    candidate: Mapping[str, str], system_component: str
) -> tuple[str | None, dict[str, str], dict[str, str]]:
    """(system prompt, placeholder texts, tool descriptions by tool name)."""
    system = candidate.get(system_component)
    tools = {k[len(TOOL_PREFIX) :]: v for k, v in candidate.items() if k.startswith(TOOL_PREFIX)}
    texts = {k: v for k, v in candidate.items() if k != system_component and not k.startswith(TOOL_PREFIX)}
    return system, texts, tools


def _fill(message: Message, texts: Mapping[str, str], used: set[str]) -> Message:
    if not texts:
        return message
    if isinstance(message.content, str):
        content = message.content
        for name, text in texts.items():
            if placeholder(name) in content:
                used.add(name)
                content = content.replace(placeholder(name), text)
        return message if content == message.content else replace(message, content=content)
    blocks = []
    changed = False
    for block in message.blocks:
        if isinstance(block, TextContent):
            text = block.text
            for name, value in texts.items():
                if placeholder(name) in text:
                    used.add(name)
                    text = text.replace(placeholder(name), value)
            if text != block.text:
                block = replace(block, text=text)
                changed = True
        blocks.append(block)
    return replace(message, content=tuple(blocks)) if changed else message


def candidate_prepare(
    prepare: PrepareMessages, system: str | None, texts: Mapping[str, str], *, strict: bool = True
) -> PrepareMessages:
    """`prepare` with the candidate applied: `system` as the first system message and the
    placeholders filled. With `strict`, a component no message uses is an error."""

    async def prepare_candidate(row: Row) -> Sequence[Message]:
        out = prepare(row)
        if inspect.isawaitable(out):
            out = await out
        used: set[str] = set()
        msgs = [_fill(m, texts, used) for m in out]
        if strict and len(used) < len(texts):
            missing = sorted(set(texts) - used)
            raise ConfigurationError(
                f"candidate component(s) {', '.join(map(repr, missing))} are not used: no message made by "
                f"prepare_messages contains {', '.join(placeholder(n) for n in missing)}; put the placeholder "
                f"in a message, name a tool description '{TOOL_PREFIX}NAME', or give RolloutsAdapter an apply function"
            )
        if system is not None:
            if msgs and msgs[0].role == "system":
                msgs[0] = replace(msgs[0], content=system)
            else:
                msgs.insert(0, Message("system", system))
        return msgs

    prepare_candidate.__qualname__ = f"{getattr(prepare, '__qualname__', 'prepare')}+candidate"
    return prepare_candidate


def candidate_environment_factory(factory: EnvironmentFactory, tools: Mapping[str, str]) -> EnvironmentFactory:
    """`factory` whose environments offer the candidate's tool descriptions."""
    from rollouts.eval.run_sample import takes_row

    async def make(row: Row) -> Environment:
        env = factory(row) if takes_row(factory) else factory()
        if inspect.isawaitable(env):
            env = await env
        names = {t.name for t in env.get_tools()}
        unknown = sorted(set(tools) - names)
        if unknown:
            raise ConfigurationError(
                f"candidate components {', '.join(TOOL_PREFIX + n for n in unknown)} name tools the environment "
                f"does not have; its tools: {', '.join(sorted(names)) or '(none)'}"
            )
        return ToolTextEnvironment(env, tools)

    make.__qualname__ = f"{getattr(factory, '__qualname__', 'factory')}+tool_texts"
    return make


class ToolTextEnvironment(EnvironmentBase):
    """An environment whose tool descriptions are replaced; everything else is the inner one's."""

    def __init__(self, inner: Environment, descriptions: Mapping[str, str]) -> None:
        self.inner = inner
        self.descriptions = dict(descriptions)

    def get_tools(self) -> Sequence[Tool]:
        return tuple(
            replace(t, description=self.descriptions[t.name]) if t.name in self.descriptions else t
            for t in self.inner.get_tools()
        )

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        return await self.inner.exec_tool(tool_call, state, run_config, cancel_scope)

    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        return self.inner.requires_confirmation(tool_call)

    def get_tool_formatter(self, tool_name: str) -> ToolFormatter | None:
        return self.inner.get_tool_formatter(tool_name)

    def get_status_info(self) -> Mapping[str, str] | None:
        return self.inner.get_status_info()

    async def on_session_start(self, session_id: str) -> None:
        await self.inner.on_session_start(session_id)

    async def on_assistant_message(self, message: Message, state: AgentState) -> AgentState:
        return await self.inner.on_assistant_message(message, state)

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()

    async def serialize(self) -> dict[str, Any]:
        return {
            "inner_type": environment_type_name(self.inner),
            "inner": await self.inner.serialize(),
            "descriptions": self.descriptions,
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        inner_cls = load_environment_class(data["inner_type"])
        return cls(await inner_cls.deserialize(data["inner"]), data["descriptions"])
