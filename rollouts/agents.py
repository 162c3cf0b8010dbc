"""The agent loop: run_agent -> run_agent_step -> rollout + process_pending_tools.

Every function takes a frozen state and returns a new one. Tool calls run in order; problems
with a call (unknown tool, arguments that are not JSON or do not fit the schema, a tool that
raises) become error tool results sent back to the model. Cancellation always propagates; what
must be recorded on abort is recorded in a shielded scope.

The stop and step handlers (`handle_stop_max_turns`, `compose_handlers`, ...) and
`stdout_handler` live in `rollouts.handlers` and are importable from here too, as in the
original rollouts.
"""

from __future__ import annotations

import json
from typing import Any

import trio

from rollouts import tracing as _tracing
from rollouts._schema import argument_errors
from rollouts.dtypes import Actor, AgentState, Message, StopReason, Tool, ToolCall, ToolResult, evolve, now_iso
from rollouts.environments.base import Environment, clone_environment, environment_type_name
from rollouts.errors import AuthenticationError, ContextTooLongError, ProviderError
from rollouts.events import OnChunk, StreamEvent, ToolExecutionStart, ToolResultReceived
from rollouts.handlers import (
    compose_handlers,
    handle_stop_cost_budget,
    handle_stop_max_turns,
    handle_stop_on_empty_message,
    handle_stop_token_budget,
    inject_tool_reminder,
    inject_turn_warning,
    stdout_handler,
)
from rollouts.providers import MessageBuilder, client_scope, get_provider_function
from rollouts.providers.raw import record_raw_calls
from rollouts.run_config import RunConfig
from rollouts.store.base import SessionConflictError, SessionStatus, SessionStore

__all__ = [  # (the handlers are re-exported: the original rollouts' `from rollouts.agents import ...`)
    "compose_handlers",
    "handle_stop_cost_budget",
    "handle_stop_max_turns",
    "handle_stop_on_empty_message",
    "handle_stop_token_budget",
    "inject_tool_reminder",
    "inject_turn_warning",
    "process_pending_tools",
    "rollout",
    "run_agent",
    "run_agent_step",
    "stdout_handler",
]

_SCHEDULE_EVERY = 64  # streamed events between two full checkpoints (see run_agent_step)


class _Tracker:
    """The latest state of a run in progress and the message being streamed, so an abort can
    return (and record) exactly what had happened."""

    __slots__ = ("aborted", "builder", "state")

    def __init__(self, state: AgentState) -> None:
        self.state = state
        self.builder: MessageBuilder | None = None
        self.aborted: tuple[AgentState, Message | None] | None = None


async def rollout(actor: Actor, on_chunk: OnChunk, *, use_tito: bool = False, record_raw: bool = False) -> Actor:
    """One model call: route to the provider for `actor.endpoint` and return the actor with the
    new assistant message appended. With `use_tito` the provider's token-exact variant is used
    (`rollouts.providers.tito`) and the new Completion carries the call's TokenRecord; with
    `record_raw` it carries the raw request and response (`rollouts.providers.raw`)."""
    if record_raw:
        with record_raw_calls():
            return await rollout(actor, on_chunk, use_tito=use_tito)
    if _tracing.tracer is None:
        return await _rollout(actor, on_chunk, use_tito)
    with _tracing.span(_tracing.model_call_name(actor), _tracing.model_call_attributes(actor)) as span:
        new_actor = await _rollout(actor, on_chunk, use_tito)
        _tracing.set_attributes(span, _tracing.model_result_attributes(actor, new_actor))
        return new_actor


async def _rollout(actor: Actor, on_chunk: OnChunk, use_tito: bool) -> Actor:
    if use_tito:
        from rollouts.providers.tito import get_token_provider_function

        fn = get_token_provider_function(actor.endpoint.provider)
    else:
        fn = get_provider_function(actor.endpoint.provider, actor.endpoint.model)
    new_actor = await fn(actor, on_chunk)
    _check_provider_result(actor, new_actor)
    if use_tito:
        last = new_actor.trajectory.completions[-1] if new_actor.trajectory.completions else None
        if last is None or last.tokens is None:
            raise TypeError(
                f"provider {actor.endpoint.provider!r} was asked for a token-exact call (use_tito) but recorded "
                "no Completion.tokens"
            )
    return new_actor


def _check_provider_result(actor: Actor, new_actor: object) -> None:
    """The provider contract (checked on every call: it is user code when registered)."""
    provider = actor.endpoint.provider
    if not isinstance(new_actor, Actor):
        raise TypeError(
            f"provider {provider!r} must return the Actor with the new assistant message appended, "
            f"got {type(new_actor).__name__}"
        )
    n = len(actor.trajectory.messages)
    added = len(new_actor.trajectory.messages) - n
    if added != 1 or new_actor.trajectory.messages[-1].role != "assistant":
        raise TypeError(
            f"provider {provider!r} must append exactly one assistant message to the trajectory; it "
            f"appended {added} message(s)"
            + (f", the last a {new_actor.trajectory.messages[-1].role!r} message" if added > 0 else "")
        )


async def _record(
    rc: RunConfig,
    state: AgentState,
    messages: tuple[Message, ...],
    environment_state: dict[str, Any] | None = None,
) -> None:
    """Append messages that are already part of `state` to its session. Shielded: a message the
    state holds is always recorded, so the session and the state never disagree.
    `environment_state` (the environment after the last message) goes with the last one."""
    if rc.session_store is not None and state.session_id is not None and messages:
        # conditional on the session holding exactly what precedes them: if another process
        # continued the same session meanwhile, SessionConflictError ends this run, nothing lost
        expected = len(state.messages) - len(messages)
        with trio.CancelScope(shield=True):
            if len(messages) == 1:
                await rc.session_store.append_message(
                    state.session_id, messages[0], environment_state=environment_state, expected_count=expected
                )
            else:
                await rc.session_store.append_messages(
                    state.session_id, messages, environment_state=environment_state, expected_count=expected
                )


async def _record_added(rc: RunConfig, before: AgentState, after: AgentState, tracker: _Tracker | None = None) -> None:
    """Record messages a handler appended. The tracker learns the new state first, so a
    cancellation from here on returns (and records after) what the session holds."""
    n = len(before.actor.trajectory.messages)
    added = after.actor.trajectory.messages[n:]
    if added:
        if tracker is not None:
            tracker.state = after
        await _record(rc, after, added)


def _error_result(call: ToolCall, text: str) -> ToolResult:
    return ToolResult(call.id, text, is_error=True)


async def _execute_tool(
    env: Environment, tools: dict[str, Tool], call: ToolCall, state: AgentState, rc: RunConfig
) -> ToolResult:
    if _tracing.tracer is None:
        return await _run_tool(env, tools, call, state, rc)
    with _tracing.span(f"execute_tool {call.name}", _tracing.tool_attributes(call)) as span:
        result = await _run_tool(env, tools, call, state, rc)
        _tracing.tool_result(span, result)
        return result


async def _run_tool(
    env: Environment, tools: dict[str, Tool], call: ToolCall, state: AgentState, rc: RunConfig
) -> ToolResult:
    tool = tools.get(call.name)
    if tool is None:
        names = ", ".join(sorted(tools)) or "(none)"
        return _error_result(call, f"Unknown tool '{call.name}'. Available tools: {names}.")
    if call.parse_error is not None:
        return _error_result(
            call,
            f"The arguments for '{call.name}' were not valid JSON ({call.parse_error}). "
            f"Call it again with a JSON object matching its schema: {json.dumps(dict(tool.parameters))}",
        )
    problem = argument_errors(tool.parameters, call.arguments)
    if problem is not None:
        return _error_result(
            call,
            f"Invalid arguments for '{call.name}': {problem}. "
            f"Expected a JSON object matching: {json.dumps(dict(tool.parameters))}",
        )
    try:
        if rc.tool_limiter is not None:
            async with rc.tool_limiter:
                result = await env.exec_tool(call, state, rc)
        else:
            result = await env.exec_tool(call, state, rc)
    except Exception as e:  # trio.Cancelled is a BaseException and propagates
        return _error_result(call, f"Tool '{call.name}' failed: {type(e).__name__}: {e}")
    if not isinstance(result, ToolResult):
        raise TypeError(f"{type(env).__name__}.exec_tool must return a ToolResult, got {type(result).__name__}")
    if result.tool_call_id != call.id:
        raise TypeError(
            f"{type(env).__name__}.exec_tool must answer the call it was given: its ToolResult has "
            f"tool_call_id {result.tool_call_id!r}, the call's id is {call.id!r}"
        )
    return result


async def process_pending_tools(
    state: AgentState, run_config: RunConfig, *, _tracker: _Tracker | None = None
) -> AgentState:
    """Run `state.pending_tool_calls[state.next_tool_idx:]` in order, appending one tool
    message per call. Resumable: `next_tool_idx` advances after each recorded result.

    Each call runs on a fresh copy of the environment, so the state after call i (and the
    environment state recorded with its result) never sees what an interrupted call i+1 did."""
    rc = run_config
    calls = state.pending_tool_calls
    if state.next_tool_idx >= len(calls):
        raise ValueError(
            "process_pending_tools: the state has no pending tool calls "
            f"(next_tool_idx {state.next_tool_idx} of {len(calls)}); run_agent_step decides when to call it"
        )
    recording = rc.session_store is not None and state.session_id is not None
    tools = {t.name: t for t in state.environment.get_tools()} if state.environment is not None else {}
    for idx in range(state.next_tool_idx, len(calls)):
        call = calls[idx]
        executed = False
        env = state.environment
        if state.stop is not None:
            result = _error_result(call, f"Not executed: the run stopped ({state.stop.value}).")
        elif env is None:
            result = _error_result(call, "This agent has no environment, so it has no tools to call.")
        else:
            env = await clone_environment(env)
            state = evolve(state, environment=env)
            approved = True
            if env.requires_confirmation(call):
                state, confirm = await rc.confirm_tool(call, state, rc)
                if not confirm.approved:
                    approved = False
                    result = _error_result(call, f"The user denied this tool call: {confirm.reason}")
            if approved:
                await rc.on_chunk(ToolExecutionStart(call.id, call.name))
                await trio.lowlevel.checkpoint_if_cancelled()
                result = await _execute_tool(env, tools, call, state, rc)
                executed = True
        message = Message.tool_result(
            call, result.content, is_error=result.is_error, result_details=result.details, timestamp=now_iso()
        )
        env_state = await env.serialize() if (recording and env is not None) else None
        state = evolve(state.with_messages(message), next_tool_idx=idx + 1)
        if _tracker is not None:
            _tracker.state = state
        # Recorded before the event goes out: a cancel landing in or after the event keeps it.
        await _record(rc, state, (message,), env_state)
        await rc.on_chunk(ToolResultReceived(call.id, call.name, result))
        await trio.lowlevel.checkpoint_if_cancelled()
        if result.is_error and executed:
            before = state
            state = rc.handle_tool_error(result, state)
            await _record_added(rc, before, state, _tracker)
        if result.stop_reason is not None and state.stop is None:
            state = evolve(state, stop=result.stop_reason)
    return evolve(state, pending_tool_calls=(), next_tool_idx=0)


async def run_agent_step(state: AgentState, run_config: RunConfig, *, _tracker: _Tracker | None = None) -> AgentState:
    """One step: stop checks, then either the pending tool calls of an interrupted turn or one
    model call followed by its tool calls. Returns the new state (turn_idx advanced)."""
    if _tracing.tracer is None:
        return await _step(state, run_config, _tracker)
    with _tracing.span(f"turn {state.turn_idx}", {"rollouts.turn.index": state.turn_idx}) as span:
        new = await _step(state, run_config, _tracker)
        if new.stop is not None:
            span.set_attribute("rollouts.stop_reason", new.stop.value)
        return new


async def _step(state: AgentState, run_config: RunConfig, _tracker: _Tracker | None) -> AgentState:
    rc = run_config
    # Every turn passes a checkpoint (a cancel point and a schedule point): a scripted model and
    # an in-memory environment never yield on their own, and cancellation must still land.
    await trio.lowlevel.checkpoint()
    before = state
    state = rc.handle_stop(state)
    await _record_added(rc, before, state, _tracker)
    if state.stop is not None:
        return state
    if state.next_tool_idx < len(state.pending_tool_calls):
        state = await process_pending_tools(state, rc, _tracker=_tracker)
        return evolve(state, turn_idx=state.turn_idx + 1)

    before = state
    state = rc.on_step_start(state)
    await _record_added(rc, before, state, _tracker)
    if state.stop is not None:  # a step handler may end the run too
        return state
    env = state.environment
    tools = tuple(env.get_tools()) if env is not None else ()
    actor = state.actor if state.actor.tools == tools else evolve(state.actor, tools=tools)

    user_on_chunk = rc.on_chunk
    builder: MessageBuilder | None = None
    if _tracker is not None:
        builder = MessageBuilder(actor.endpoint.provider, actor.endpoint.model)
        _tracker.builder = builder

    events = 0

    async def on_chunk(event: StreamEvent) -> None:
        # Every streamed event is a cancel point (cheap: it yields only when cancelled) and every
        # 64th a full checkpoint, so other tasks and deadlines get to run during a long stream
        # that never waits on I/O (a full checkpoint per event would double a scripted turn).
        nonlocal events
        if builder is not None:
            builder.feed(event)
        await user_on_chunk(event)
        events += 1
        if events % _SCHEDULE_EVERY == 0:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()

    try:
        if rc.model_limiter is not None:
            async with rc.model_limiter:
                new_actor = await rollout(actor, on_chunk, use_tito=rc.use_tito, record_raw=rc.record_raw)
        else:
            new_actor = await rollout(actor, on_chunk, use_tito=rc.use_tito, record_raw=rc.record_raw)
    except AuthenticationError:
        raise
    except ProviderError as e:
        reason = StopReason.CONTEXT_TOO_LONG if isinstance(e, ContextTooLongError) else StopReason.PROVIDER_ERROR
        return evolve(state, stop=reason, error=f"{type(e).__name__}: {e}")
    if _tracker is not None:
        _tracker.builder = None

    message = new_actor.trajectory.messages[-1]
    state = evolve(state, actor=new_actor)
    if _tracker is not None:
        _tracker.state = state
    await _record(rc, state, (message,))
    if env is not None:
        before = state
        state = await env.on_assistant_message(message, state)
        await _record_added(rc, before, state, _tracker)

    calls = message.get_tool_calls()
    if not calls:
        before = state
        state = await rc.handle_no_tool(state, rc)
        await _record_added(rc, before, state, _tracker)
        return evolve(state, turn_idx=state.turn_idx + 1)
    state = evolve(state, pending_tool_calls=calls, next_tool_idx=0)
    if _tracker is not None:
        _tracker.state = state
    state = await process_pending_tools(state, rc, _tracker=_tracker)
    return evolve(state, turn_idx=state.turn_idx + 1)


def _same_message(a: Message, b: Message) -> bool:
    """Whether two messages are the same recorded message (by role, time and call id; by text
    when they carry no timestamp)."""
    if (a.role, a.timestamp, a.tool_call_id) != (b.role, b.timestamp, b.tool_call_id):
        return False
    return bool(a.timestamp) or a.text == b.text


async def _continue_session(state: AgentState, store: SessionStore) -> None:
    """A resumed run: record the messages the state has beyond the session's (e.g. a new user
    message), never those it already holds, and mark the session running. If another process
    continued the session since this state was read, SessionConflictError: nothing is appended."""
    assert state.session_id is not None
    stored = await store.message_count(state.session_id)
    if len(state.messages) < stored:
        raise SessionConflictError(
            f"the state has {len(state.messages)} messages but session {state.session_id} has {stored}: "
            f"it is behind the session; continue from resume_session(store, {state.session_id!r})"
        )
    if stored:
        _, recorded = await store.get(state.session_id)
        if len(recorded) != stored or not _same_message(recorded[-1], state.messages[stored - 1]):
            raise SessionConflictError(
                f"session {state.session_id} was continued elsewhere since this state was read (its message "
                f"{stored} is not this state's); nothing was recorded. Continue from "
                f"resume_session(store, {state.session_id!r})"
            )
    new = state.messages[stored:]
    if new:
        with trio.CancelScope(shield=True):
            await store.append_messages(state.session_id, new, expected_count=stored)
    env = state.environment
    await store.update(
        state.session_id,
        status=SessionStatus.RUNNING,
        environment_state=await env.serialize() if env is not None else None,
    )


async def _start_session(state: AgentState, rc: RunConfig) -> AgentState:
    """Create (or continue) the run's session and record what it does not hold yet. Called
    shielded, so a session that exists always gets its outcome recorded, even when the run was
    cancelled before it began."""
    store = rc.session_store
    if store is None:
        return state
    if state.session_id is not None:
        await _continue_session(state, store)
        return state
    env = state.environment
    session = await store.create(
        endpoint=state.actor.endpoint,
        environment_type=environment_type_name(env) if env is not None else None,
        environment_state=await env.serialize() if env is not None else None,
        parent_id=state.parent_session_id,
        branch_point=state.branch_point,
        tags=rc.session_tags,
        status=SessionStatus.RUNNING,
    )
    state = evolve(state, session_id=session.session_id)
    own = state.messages[state.branch_point :] if state.parent_session_id and state.branch_point else state.messages
    await _record(rc, state, tuple(own))
    return state


def _final_status(state: AgentState) -> SessionStatus:
    if state.stop == StopReason.ABORTED:
        return SessionStatus.ABORTED
    if state.stop in (StopReason.PROVIDER_ERROR, StopReason.CONTEXT_TOO_LONG):
        return SessionStatus.FAILED
    if state.stop == StopReason.MAX_TURNS:  # a limit ended it, not the agent
        return SessionStatus.MAX_TURNS
    if state.stop == StopReason.BUDGET_EXCEEDED:
        return SessionStatus.BUDGET_EXCEEDED
    if state.stop == StopReason.NO_TOOL_CALLED and state.actor.tools:
        return SessionStatus.NO_TOOL_CALLED  # it had tools to finish with and answered in text instead
    return SessionStatus.COMPLETED


async def _finish_session(rc: RunConfig, state: AgentState, status: SessionStatus) -> None:
    if rc.session_store is None or state.session_id is None:
        return
    env_state = await state.environment.serialize() if state.environment is not None else None
    await rc.session_store.update(state.session_id, status=status, environment_state=env_state)


def _is_cancellation(exc: BaseException) -> bool:
    """Whether `exc` is trio's cancellation: `Cancelled` itself, or an exception group (from a
    nursery inside a tool or a provider) that holds nothing but `Cancelled`."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return False


def _aborted(tracker: _Tracker) -> tuple[AgentState, Message | None]:
    """The state at the moment of an abort, with any partially streamed message appended (made
    once, so the state returned and the message recorded are the same)."""
    if tracker.aborted is None:
        state = tracker.state
        partial = tracker.builder.partial_message() if tracker.builder is not None else None
        if partial is not None:
            state = state.with_messages(partial)
        tracker.aborted = (evolve(state, stop=StopReason.ABORTED, error="the run was cancelled"), partial)
    return tracker.aborted


async def _run_loop(states: list[AgentState], rc: RunConfig, tracker: _Tracker) -> None:
    created = rc.session_store is not None and states[0].session_id is None
    with trio.CancelScope(shield=True):
        state = await _start_session(states[0], rc)
    states[0] = tracker.state = state
    try:
        if created and state.environment is not None and state.session_id is not None:
            await state.environment.on_session_start(state.session_id)
        # Each step is one model turn or the resumption of an interrupted turn's tool calls,
        # so 2 * max_turns + 1 steps bound the loop whatever the handlers do.
        for _ in range(2 * rc.max_turns + 1):
            if state.stop is not None:
                break
            if state.turn_idx >= rc.max_turns and state.next_tool_idx >= len(state.pending_tool_calls):
                state = evolve(state, stop=StopReason.MAX_TURNS, error=f"reached RunConfig.max_turns={rc.max_turns}")
                states.append(state)
                break
            state = await run_agent_step(state, rc, _tracker=tracker)
            states.append(state)
            tracker.state = state
        else:
            raise AssertionError("agent loop exceeded its step bound")
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            if rc.session_store is not None and tracker.state.session_id is not None:
                if _is_cancellation(exc):
                    aborted, partial = _aborted(tracker)
                    try:
                        if partial is not None:
                            await _record(rc, aborted, (partial,))
                        await _finish_session(rc, tracker.state, SessionStatus.ABORTED)
                    except SessionConflictError:
                        pass  # another run continued the session: not ours to mark; cancellation goes on
                elif not isinstance(exc, SessionConflictError):  # the session is another run's now
                    await rc.session_store.update(tracker.state.session_id, status=SessionStatus.FAILED)
        raise
    # The run is over: its outcome is recorded even if a cancellation arrives meanwhile.
    with trio.CancelScope(shield=True):
        await _finish_session(rc, state, _final_status(state))


async def run_agent(state: AgentState, run_config: RunConfig) -> list[AgentState]:
    """Run until a handler, a tool or the model stops the run. Returns every state, starting
    with the initial one (given a session id if a session store is configured).

    Cancelling `run_config.cancel_scope` ends the run gracefully: the last state returned is
    marked ABORTED and holds any partially streamed message. Cancellation from outside
    propagates as usual (after the abort is recorded in the session store)."""
    if _tracing.tracer is None:
        return await _run_agent(state, run_config)
    with _tracing.span("invoke_agent", _tracing.agent_attributes(state)) as span:
        states = await _run_agent(state, run_config)
        _tracing.set_attributes(span, _tracing.agent_end_attributes(states))
        return states


async def _run_agent(state: AgentState, run_config: RunConfig) -> list[AgentState]:
    states = [state]
    tracker = _Tracker(state)
    async with client_scope():
        if run_config.cancel_scope is None:
            await _run_loop(states, run_config, tracker)
        else:
            with run_config.cancel_scope:
                await _run_loop(states, run_config, tracker)
            if run_config.cancel_scope.cancelled_caught:
                states.append(_aborted(tracker)[0])
    return states
