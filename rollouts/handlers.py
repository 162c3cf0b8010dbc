"""Composable handlers: pure functions of state that decide when a run stops or what it sees.

Stop handlers have the shape `state -> state` and set `state.stop` to end a run; combine them
with `compose_handlers`. Step handlers (`on_step_start`) may add messages before a model call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeAlias

import trio

from rollouts.dtypes import AgentState, Message, StopReason, ToolCall, ToolResult, Usage
from rollouts.errors import ConfigurationError
from rollouts.events import TextEnd, ToolCallEnd, ToolResultReceived
from rollouts.providers import price_for
from rollouts.redaction import known_secrets

if TYPE_CHECKING:
    from rollouts.events import StreamEvent
    from rollouts.run_config import RunConfig

Handler: TypeAlias = Callable[[AgentState], AgentState]
# The shape of `RunConfig.handle_no_tool` (the same alias as `rollouts.run_config.NoToolHandler`).
NoToolHandler: TypeAlias = Callable[[AgentState, "RunConfig"], Awaitable[AgentState]]


@dataclass(frozen=True)
class ToolConfirmResult:
    """The answer of a `confirm_tool` callback: whether the call may run, and if not, why (the
    reason is sent to the model in the error tool result)."""

    approved: bool
    reason: str = ""


def keep_state(state: AgentState) -> AgentState:
    """The identity handler."""
    return state


def _stopped(state: AgentState, reason: StopReason, detail: str) -> AgentState:
    return replace(state, stop=reason, error=detail)


def handle_stop_max_turns(max_turns: int) -> Handler:
    """Stop once `max_turns` model turns have run."""
    if max_turns < 1:
        raise ValueError(f"handle_stop_max_turns: max_turns must be >= 1, got {max_turns}")

    def handler(state: AgentState) -> AgentState:
        if state.turn_idx >= max_turns:
            return _stopped(state, StopReason.MAX_TURNS, f"reached max_turns={max_turns}")
        return state

    return handler


def _is_injected(message: Message) -> bool:
    return bool(message.details and message.details.get("injected"))


def handle_stop_on_empty_message() -> Handler:
    """Stop when the model's last message has no text and no tool calls.

    Messages the handlers injected after it (a tool reminder, a turn warning) are looked past, so
    an empty reply stops the run even when `handle_no_tool` answered it with a reminder; a new
    message from the user (a resumed conversation) is not, so the model gets to answer it."""

    def handler(state: AgentState) -> AgentState:
        for m in reversed(state.actor.trajectory.messages):
            if _is_injected(m):
                continue
            if m.role == "assistant" and not m.text.strip() and not m.get_tool_calls():
                return _stopped(state, StopReason.EMPTY_MESSAGE, "the model returned an empty message")
            break
        return state

    return handler


def _total_usage(state: AgentState) -> Usage:
    return state.actor.trajectory.total_usage()


def handle_stop_token_budget(max_tokens: int) -> Handler:
    """Stop once the tokens the providers reported (`Usage.total_tokens` summed over the
    trajectory's assistant messages: input + output + cache read/write) reach `max_tokens`.
    Counts come from each call's real Usage, never from an estimate of the text.

    A server that reports no usage (the reply is marked `details["usage_reported"] = False`)
    makes the budget uncountable: the handler raises ConfigurationError at the first such reply
    rather than letting the run go on unbounded."""
    if max_tokens < 1:
        raise ValueError(f"handle_stop_token_budget: max_tokens must be >= 1, got {max_tokens}")

    def handler(state: AgentState) -> AgentState:
        for m in state.actor.trajectory.messages:
            if m.role == "assistant" and m.details and m.details.get("usage_reported") is False:
                raise ConfigurationError(
                    f"handle_stop_token_budget: the server of {m.provider or 'this endpoint'}/{m.model or '?'} "
                    "reports no token usage, so a token budget cannot be counted; turn on usage reporting "
                    "(OpenAI-compatible servers: stream_options include_usage) or bound the run with max_turns"
                )
        used = _total_usage(state).total_tokens
        if used >= max_tokens:
            return _stopped(state, StopReason.BUDGET_EXCEEDED, f"used {used} tokens of a {max_tokens} budget")
        return state

    return handler


def handle_stop_cost_budget(max_cost_usd: float, cost_fn: Callable[[Usage], float] | None = None) -> Handler:
    """Stop once the cost reaches `max_cost_usd` (from Usage.cost_usd, or `cost_fn(usage)`).

    Without `cost_fn`, a model the price table does not know (see `register_price`) would cost
    $0 forever and the budget would never stop the run: the handler raises ConfigurationError on
    its first check instead (the start of the run). Scripted models set their own costs."""
    if not max_cost_usd > 0:
        raise ValueError(f"handle_stop_cost_budget: max_cost_usd must be > 0, got {max_cost_usd}")

    def handler(state: AgentState) -> AgentState:
        ep = state.actor.endpoint
        if cost_fn is None and ep.provider != "scripted" and price_for(ep.model) is None:
            raise ConfigurationError(
                f"handle_stop_cost_budget: no price for model {ep.model!r} (provider {ep.provider!r}), so its "
                "cost would always read $0 and the budget would never stop the run; add one with "
                "rollouts.register_price(model, ModelPrice(input=..., output=...)) or pass cost_fn="
            )
        usage = _total_usage(state)
        cost = cost_fn(usage) if cost_fn is not None else usage.cost_usd
        if cost >= max_cost_usd:
            return _stopped(state, StopReason.BUDGET_EXCEEDED, f"spent ${cost:.4f} of a ${max_cost_usd:.4f} budget")
        return state

    return handler


def compose_handlers(handlers: Sequence[Handler]) -> Handler:
    """Apply handlers in order; the first that sets `stop` wins."""
    hs = tuple(handlers)

    def handler(state: AgentState) -> AgentState:
        for h in hs:
            if state.stop is not None:
                break
            state = h(state)
        return state

    return handler


def inject_turn_warning(max_turns: int, warning_at: int = 2) -> Handler:
    """An `on_step_start` handler: when `warning_at` or fewer turns remain, add a user message
    saying how many are left (once per turn)."""
    if max_turns < 1 or warning_at < 1:
        raise ValueError(
            f"inject_turn_warning: max_turns and warning_at must be >= 1, got {max_turns} and {warning_at}"
        )

    def handler(state: AgentState) -> AgentState:
        remaining = max_turns - state.turn_idx
        if 0 < remaining <= warning_at:
            text = f"[{remaining} turn{'s' if remaining != 1 else ''} left. Finish the task now.]"
            return state.with_messages(Message("user", text, details={"injected": "turn_warning"}))
        return state

    return handler


def inject_tool_reminder(max_reminders: int = 1, text: str | None = None) -> NoToolHandler:
    """A `handle_no_tool` handler: when the model answers without calling a tool, remind it to
    use its tools (at most `max_reminders` times per run), then stop with NO_TOOL_CALLED."""
    if max_reminders < 0:
        raise ValueError(f"inject_tool_reminder: max_reminders must be >= 0, got {max_reminders}")
    reminder = text or "Please use the available tools to complete the task, then call the tool that finishes it."

    async def handler(state: AgentState, run_config: RunConfig) -> AgentState:
        sent = sum(
            1 for m in state.actor.trajectory.messages if m.details and m.details.get("injected") == "tool_reminder"
        )
        if sent >= max_reminders:
            return _stopped(state, StopReason.NO_TOOL_CALLED, "the model answered without calling a tool")
        return state.with_messages(Message("user", reminder, details={"injected": "tool_reminder"}))

    return handler


async def handle_no_tool_stop(state: AgentState, run_config: RunConfig) -> AgentState:
    """Default `handle_no_tool`: the model answered in text, so the run is done."""
    return replace(state, stop=StopReason.NO_TOOL_CALLED)


def handle_tool_error_continue(result: ToolResult, state: AgentState) -> AgentState:
    """Default `handle_tool_error`: the error result goes back to the model and the run goes on."""
    return state


def handle_tool_error_stop(result: ToolResult, state: AgentState) -> AgentState:
    """Stop the run at the first error tool result."""
    return _stopped(state, StopReason.TOOL_ERROR, result.content)


async def confirm_tool_auto_approve(
    tool_call: ToolCall, state: AgentState, run_config: RunConfig
) -> tuple[AgentState, ToolConfirmResult]:
    """Default `confirm_tool`: approve every call (non-interactive)."""
    return state, ToolConfirmResult(True)


async def confirm_tool_interactive(
    tool_call: ToolCall, state: AgentState, run_config: RunConfig
) -> tuple[AgentState, ToolConfirmResult]:
    """Ask the user through `run_config.on_input`; 'y'/'yes' approves, anything else denies
    (the answer is passed to the model as the reason)."""
    args = ", ".join(f"{k}={v!r}" for k, v in tool_call.arguments.items())
    answer = (await run_config.on_input(f"Run {tool_call.name}({args})? [y/N] ")).strip()
    if answer.lower() in ("y", "yes"):
        return state, ToolConfirmResult(True)
    return state, ToolConfirmResult(False, answer or "denied by the user")


async def read_stdin(prompt: str) -> str:
    """Default `on_input`: read a line from standard input without blocking the event loop."""
    return await trio.to_thread.run_sync(input, prompt, abandon_on_cancel=True)


async def stdout_handler(event: StreamEvent) -> None:
    """An `on_chunk` printing a run to standard output: each finished text block, each tool call
    (`-> name(args)`) and the first line of each tool result, with known secrets masked
    (`rollouts.redaction`). Whole blocks, not token by token: a secret cut across deltas is never
    printed (the CLI's renderer streams tokens, through `redact_events`)."""
    redact = known_secrets().redact
    if isinstance(event, TextEnd) and event.text:
        print(redact(event.text), flush=True)
    elif isinstance(event, ToolCallEnd):
        args = ", ".join(f"{k}={v!r}" for k, v in event.tool_call.arguments.items())
        print(redact(f"-> {event.tool_call.name}({args})"), flush=True)
    elif isinstance(event, ToolResultReceived):
        first = event.result.content.splitlines()[0] if event.result.content else ""
        print(redact(f"<- {event.tool_name}: {first}"), flush=True)
