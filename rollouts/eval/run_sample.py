"""One dataset row through the agent, in three phases: set-up (callbacks, messages,
environment), the agent (continued after provider errors), scoring.

`evaluate_sample` runs them in order; each phase either hands the next one what it made or
ends the sample with a recorded failure. `rescore_sample` runs only the scoring phase on a
recorded sample (evaluate(rescore=True)).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import random
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import trio

from rollouts import tracing as _tracing
from rollouts._awaitable import maybe_await as _maybe_await
from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Message, StopReason, Trajectory
from rollouts.environments.base import Environment
from rollouts.errors import AuthenticationError
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.sample import Sample, Score
from rollouts.events import StreamEvent
from rollouts.run_config import RunConfig

_log = logging.getLogger("rollouts.eval.run")

__all__ = ["close_environment", "evaluate_sample", "finish_sample", "rescore_sample", "takes_row"]


def takes_row(fn: Callable[..., Any]) -> bool:
    """Whether `fn` needs a positional argument (so `CalculatorEnvironment`, whose parameters all
    have defaults, is called with none, and `lambda row: ...` with the row)."""
    try:
        return _takes_argument_cached(fn)
    except TypeError:  # an unhashable callable
        return _needs_positional(fn)


@functools.lru_cache(maxsize=256)
def _takes_argument_cached(fn: Callable[..., Any]) -> bool:
    return _needs_positional(fn)


def _needs_positional(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in sig.parameters.values()
    )


_LIMIT_STOPS = (StopReason.MAX_TURNS, StopReason.BUDGET_EXCEEDED, StopReason.CONTEXT_TOO_LONG)


def unfinished_stop(state: AgentState) -> str | None:
    """The stop reason if the run ended before its task did: a limit, or a text answer from a
    model that had tools to finish with (`no_tool_called`; without tools a text answer is the
    result). The eval table counts such samples apart from finished ones."""
    if state.stop in _LIMIT_STOPS or (state.stop == StopReason.NO_TOOL_CALLED and state.actor.tools):
        return state.stop.value if state.stop is not None else None
    return None


def error_text(stage: str, e: BaseException) -> str:
    return f"{stage}: {type(e).__name__}: {e}"


def _backoff_delay(config: EvalConfig, retry: int) -> float:
    base = min(config.retry_backoff_max_s, config.retry_backoff_s * (2.0**retry))
    return base * (0.5 + random.random() / 2)  # "equal jitter": between half and all of it


class _EventCallbackError(Exception):
    """on_sample_event raised (carried out of the agent loop to be reported as such)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _sample_run_config(config: EvalConfig, sample_id: str) -> RunConfig:
    rc = config.run_config or RunConfig()
    max_turns = config.effective_max_turns
    if rc.max_turns != max_turns:
        rc = replace(rc, max_turns=max_turns)
    callback = config.on_sample_event
    if callback is not None:
        user_on_chunk = rc.on_chunk

        async def on_chunk(event: StreamEvent) -> None:
            await user_on_chunk(event)
            try:
                result = callback(sample_id, event)
                if inspect.isawaitable(result):
                    await result
            except Exception as e:
                raise _EventCallbackError(e) from e

        rc = replace(rc, on_chunk=on_chunk)
    return rc


def _time_limit(deadline: float) -> trio.CancelScope | None:
    """A scope ending at `deadline`, or None when there is no time limit (saves a scope per phase)."""
    return trio.CancelScope(deadline=deadline) if deadline != math.inf else None


class _Run:
    """What the phases of one sample share: its config, clock and deadline, and how a failure
    is recorded."""

    def __init__(self, config: EvalConfig, row: Row, sample_id: str) -> None:
        self.config = config
        self.row = row
        self.sample_id = sample_id
        self.started = time.perf_counter()
        timeout = config.sample_timeout_s
        self.deadline = trio.current_time() + timeout if timeout else math.inf
        self.timeout_text = f"timed out after {timeout}s (EvalConfig.sample_timeout_s)"
        self.fingerprint: dict[str, Any] = config.fingerprint.to_dict()

    def metadata(self, attempts: int, states: Sequence[AgentState] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"duration_s": round(time.perf_counter() - self.started, 6), "attempts": attempts}
        if states:
            last = states[-1]
            meta["turns"] = last.turn_idx
            meta["usage"] = last.actor.trajectory.total_usage().to_dict()
            early = unfinished_stop(last)
            if early is not None:
                meta["unfinished"] = early
        return meta

    def failed(
        self, error: str, sample: Sample, attempts: int = 0, states: Sequence[AgentState] | None = None, **extra: Any
    ) -> Sample:
        meta = {**self.metadata(attempts, states), **extra}
        return replace(sample, status="failed", error=error, metadata=meta, fingerprint=self.fingerprint)


@dataclass(frozen=True)
class _Agent:
    """What the agent phase made: the states of the run (continued after provider errors)."""

    states: Sequence[AgentState]
    attempts: int


# --------------------------------------------------------------------------------------------
# Phase 1: set-up
# --------------------------------------------------------------------------------------------


async def _set_up(run: _Run, environment: Environment | None) -> tuple[Sequence[Message], Environment | None] | Sample:
    """on_sample_start, the prepared messages and the environment; or the failed Sample."""
    config, sample = run.config, Sample(id=run.sample_id, input=run.row)
    messages: Sequence[Message] = ()
    env = environment
    scope = _time_limit(run.deadline)
    with scope or nullcontext():
        try:
            if config.on_sample_start is not None:
                await _maybe_await(config.on_sample_start(run.sample_id, run.row))
        except Exception as e:
            return run.failed(error_text("on_sample_start", e), sample, traceback=traceback.format_exc())
        try:
            messages = tuple(await _maybe_await(config.prepare_messages(run.row)))
            if not all(isinstance(m, Message) for m in messages):
                raise TypeError(f"prepare_messages must return Messages, got {[type(m).__name__ for m in messages]}")
            if not messages:
                raise ValueError("prepare_messages returned no messages")
        except Exception as e:
            return run.failed(error_text("prepare_messages", e), sample, traceback=traceback.format_exc())
        run.fingerprint = config.fingerprint.with_messages(messages).to_dict()
        if env is None and config.environment_factory is not None:
            factory = config.environment_factory
            try:
                env = await _maybe_await(factory(run.row) if takes_row(factory) else factory())
            except Exception as e:
                return run.failed(error_text("environment_factory", e), sample, traceback=traceback.format_exc())
    if scope is not None and scope.cancelled_caught:
        if env is not None and environment is None:
            await close_environment(env)
        return run.failed(run.timeout_text, sample)
    return messages, env


# --------------------------------------------------------------------------------------------
# Phase 2: the agent, continued after provider errors
# --------------------------------------------------------------------------------------------


async def _run_agent(
    run: _Run, messages: Sequence[Message], env: Environment | None, states: list[AgentState]
) -> _Agent | Sample:
    """The agent's run (`states` is kept up to date for the caller's cleanup); or the failed Sample."""
    config = run.config
    rc = _sample_run_config(config, run.sample_id)
    state = AgentState(
        actor=Actor(Trajectory(tuple(messages)), config.endpoint, tuple(env.get_tools()) if env is not None else ()),
        environment=env,
    )
    attempts = 0
    states[:] = [state]
    sample = Sample(id=run.sample_id, input=run.row)
    try:
        for retry in range(config.provider_error_retries + 1):
            attempts += 1
            run_scope = _time_limit(run.deadline)
            run_states = await run_agent(state, rc if run_scope is None else replace(rc, cancel_scope=run_scope))
            states[:] = states[:-1] + run_states if retry else run_states
            last = states[-1]
            if last.stop != StopReason.PROVIDER_ERROR or retry == config.provider_error_retries:
                break
            with trio.move_on_at(run.deadline):
                await trio.sleep(_backoff_delay(config, retry))
            if trio.current_time() >= run.deadline:
                break
            state = replace(last, stop=None, error=None)
    except AuthenticationError:
        raise
    except _EventCallbackError as e:
        text = error_text("on_sample_event", e.error)
        return run.failed(text, sample, attempts, states, traceback=traceback.format_exc())
    except Exception as e:
        return run.failed(error_text("agent", e), sample, attempts, states, traceback=traceback.format_exc())
    return _Agent(tuple(states), attempts)


def _agent_outcome(run: _Run, agent: _Agent) -> Sample:
    """The sample the agent's run makes: completed (to be scored), timed out or provider error."""
    last = agent.states[-1]
    sample = Sample(
        id=run.sample_id,
        input=run.row,
        trajectory=last.actor.trajectory,
        stop_reason=last.stop.value if last.stop is not None else None,
        fingerprint=run.fingerprint,
    )
    timed_out = trio.current_time() >= run.deadline and last.stop == StopReason.PROVIDER_ERROR
    if last.stop == StopReason.ABORTED or timed_out:
        return run.failed(run.timeout_text, sample, agent.attempts, agent.states)
    if last.stop == StopReason.PROVIDER_ERROR:
        meta = run.metadata(agent.attempts, agent.states)
        return replace(sample, status="provider_error", error=last.error, metadata=meta)
    return replace(sample, status="completed", metadata=run.metadata(agent.attempts, agent.states))


async def _with_environment_state(run: _Run, sample: Sample, agent: _Agent) -> Sample:
    """`sample` with the final environment's `serialize()` (what the score function sees as
    `sample.environment_state`); failed, naming the error, if serializing raises."""
    env = agent.states[-1].environment
    if env is None:
        return sample
    try:
        state = await env.serialize()
    except Exception as e:
        return run.failed(error_text("environment.serialize", e), sample, agent.attempts, agent.states)
    return replace(sample, environment_state=state)


# --------------------------------------------------------------------------------------------
# Phase 3: scoring
# --------------------------------------------------------------------------------------------


async def _score(config: EvalConfig, sample: Sample, deadline: float, timeout_text: str) -> Sample:
    """`sample` (completed) with its score; or failed, naming the score function's error."""
    if config.score_fn is None:
        return replace(sample, score=None)
    scope = _time_limit(deadline)
    with scope or nullcontext():
        try:
            score = await _maybe_await(config.score_fn(sample))
            if not isinstance(score, Score):
                raise TypeError(f"score_fn must return a Score, got {type(score).__name__}")
        except AuthenticationError:
            raise  # e.g. an LLM judge's key is wrong: every sample would fail the same way
        except Exception as e:
            meta = {**sample.metadata, "traceback": traceback.format_exc()}
            return replace(sample, status="failed", error=error_text("score_fn", e), metadata=meta)
    if scope is not None and scope.cancelled_caught:
        return replace(sample, status="failed", error=timeout_text + " while scoring")
    return replace(sample, score=score)


async def finish_sample(config: EvalConfig, sample: Sample) -> Sample:
    """Call on_sample_end; if it raises, the sample is recorded as failed with that error."""
    if config.on_sample_end is None:
        return sample
    try:
        await _maybe_await(config.on_sample_end(sample))
    except Exception as e:
        meta = {**sample.metadata, "traceback": traceback.format_exc()}
        return replace(sample, status="failed", error=error_text("on_sample_end", e), metadata=meta)
    return sample


# --------------------------------------------------------------------------------------------
# A sample
# --------------------------------------------------------------------------------------------


async def evaluate_sample(
    row: Row, sample_id: str, config: EvalConfig, environment: Environment | None = None
) -> Sample:
    """Run one dataset row through the agent and score it.

    Never raises for a problem of this sample (the returned Sample has status "failed" or
    "provider_error" and `error` set); raises only `trio.Cancelled` (and other cancellation),
    and `AuthenticationError` (from the agent or the score function, e.g. an LLM judge).
    `environment` overrides `config.environment_factory`.

    A run that stops for any reason of the agent's own (no tool called, max turns, context too
    long, a tool error handler) is "completed" and scored: that is the model's result."""
    if _tracing.tracer is None:
        return await _evaluate_sample(row, sample_id, config, environment)
    attributes = {
        "rollouts.eval.name": config.eval_name,
        "rollouts.sample.id": sample_id,
        "rollouts.sample.epoch": getattr(row, "epoch", None),  # (an EpochRow: EvalConfig.epochs > 1)
    }
    with _tracing.span("evaluate_sample", attributes) as span:
        sample = await _evaluate_sample(row, sample_id, config, environment)
        _tracing.sample_result(span, sample)
        return sample


async def _evaluate_sample(row: Row, sample_id: str, config: EvalConfig, environment: Environment | None) -> Sample:
    run = _Run(config, row, sample_id)
    made = await _set_up(run, environment)
    if isinstance(made, Sample):
        return await finish_sample(config, made)
    messages, env = made
    owned_env = env if environment is None else None  # made by the factory: ours to close
    states: list[AgentState] = []
    try:
        agent = await _run_agent(run, messages, env, states)
        if isinstance(agent, Sample):
            return await finish_sample(config, agent)
        sample = _agent_outcome(run, agent)
        if sample.status == "completed":
            sample = await _with_environment_state(run, sample, agent)
        if sample.status == "completed":
            sample = await _score(config, sample, run.deadline, run.timeout_text)
            if sample.status == "completed":  # the duration covers scoring too
                sample = replace(sample, metadata=run.metadata(agent.attempts, agent.states))
        return await finish_sample(config, sample)
    finally:
        if owned_env is not None:
            # The loop clones the environment before each turn's tools: close the latest copy
            # (clones share external resources such as a worktree, so one close releases them).
            latest = states[-1].environment if states and states[-1].environment is not None else owned_env
            await close_environment(latest)


async def rescore_sample(sample: Sample, config: EvalConfig) -> Sample:
    """A recorded, completed sample scored again by `config.score_fn` (its trajectory kept, no
    model call), with the config's fingerprint; then on_sample_end."""
    assert sample.status == "completed", "only completed samples are rescored"
    started = time.perf_counter()
    deadline = trio.current_time() + config.sample_timeout_s if config.sample_timeout_s else math.inf
    fingerprint = {**config.fingerprint.to_dict(), "messages": (sample.fingerprint or {}).get("messages")}
    timeout_text = f"timed out after {config.sample_timeout_s}s (EvalConfig.sample_timeout_s)"
    rescored = await _score(config, replace(sample, score=None, fingerprint=fingerprint), deadline, timeout_text)
    meta = {**rescored.metadata, "rescored": True, "rescore_duration_s": round(time.perf_counter() - started, 6)}
    return await finish_sample(config, replace(rescored, metadata=meta))


async def close_environment(env: Environment) -> None:
    """Release what a factory-made environment holds (a worktree, a browser client): its
    `aclose()` if it has one, shielded, with errors reported but not raised."""
    close = getattr(env, "aclose", None)
    if close is None:
        return
    with trio.CancelScope(shield=True):
        try:
            await close()
        except Exception as e:
            _log.warning("closing %s failed: %s: %s", type(env).__name__, type(e).__name__, e)
