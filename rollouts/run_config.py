"""RunConfig: the callbacks and limits a run uses. Frozen; defaults are non-interactive."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import trio

from rollouts.dtypes import AgentState, ToolCall, ToolResult
from rollouts.events import OnChunk, ignore_chunk
from rollouts.frozen import FrozenDict, freeze
from rollouts.handlers import (
    NoToolHandler,
    ToolConfirmResult,
    confirm_tool_auto_approve,
    handle_no_tool_stop,
    handle_tool_error_continue,
    keep_state,
    read_stdin,
)

if TYPE_CHECKING:
    from rollouts.store import SessionStore

ConfirmTool: TypeAlias = Callable[[ToolCall, AgentState, "RunConfig"], Awaitable[tuple[AgentState, ToolConfirmResult]]]


@dataclass(frozen=True)
class RunConfig:
    """How a run behaves.

    on_chunk: receives every stream event (text deltas, tool calls, tool results).
    on_input: asks the user for text (interactive handlers use it).
    confirm_tool: called for tool calls the environment marks `requires_confirmation`.
    handle_tool_error: `(result, state) -> state` after an error tool result (may set `stop`).
    on_step_start: `state -> state` before each model call (e.g. inject a turn warning).
    handle_stop: `state -> state` before each step; setting `stop` ends the run.
    handle_no_tool: called when the model answered without tool calls.
    session_store: when set, every message is recorded as it happens.
    cancel_scope: when set, cancelling it ends the run gracefully: `run_agent` returns with the
        last state marked ABORTED (holding any partial message) instead of raising. A trio
        cancel scope can be entered only once: give each run its own.
    max_turns: a hard bound on the loop, whatever the handlers say.
    model_limiter / tool_limiter: capacity limiters held around each model call / tool
        execution (evaluate() shares them across samples).
    session_tags: tags given to the session this run creates.
    use_tito: token in, token out: every model call records the exact prompt and completion token
        ids and the sampler's log-probs (`Completion.tokens`), and later turns extend the
        previous turn's tokens instead of re-rendering text (for training; see
        `rollouts.providers.tito` for the providers that can).
    record_raw: every model call also keeps its raw request (as sent to the SDK or transport)
        and raw response (the stream's items) on its `Completion`, secrets masked and each cut
        at `rollouts.providers.raw.RAW_MAX_CHARS` characters; the viewer shows them in a sample's
        timeline. Off by default (nothing is written). Recorded by every provider built on the
        shared call skeleton (the built-in API providers and `scripted`).
    """

    on_chunk: OnChunk = ignore_chunk
    on_input: Callable[[str], Awaitable[str]] = read_stdin
    confirm_tool: ConfirmTool = confirm_tool_auto_approve
    handle_tool_error: Callable[[ToolResult, AgentState], AgentState] = handle_tool_error_continue
    on_step_start: Callable[[AgentState], AgentState] = keep_state
    handle_stop: Callable[[AgentState], AgentState] = keep_state
    handle_no_tool: NoToolHandler = handle_no_tool_stop
    session_store: SessionStore | None = None
    cancel_scope: trio.CancelScope | None = None
    max_turns: int = 100
    model_limiter: trio.CapacityLimiter | None = None
    tool_limiter: trio.CapacityLimiter | None = None
    session_tags: Mapping[str, str] | None = None
    extra: Mapping[str, Any] | None = None
    use_tito: bool = False
    record_raw: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"RunConfig.max_turns must be >= 1, got {self.max_turns}")
        for name in ("session_tags", "extra"):
            value = getattr(self, name)
            if value is not None and type(value) is not FrozenDict:
                object.__setattr__(self, name, freeze(value))
