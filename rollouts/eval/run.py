"""evaluate(): run every row of a dataset through an agent, concurrently, score it, keep it.

    config = EvalConfig(
        endpoint=Endpoint("openai", "gpt-4.1-mini"),
        prepare_messages=lambda row: [Message("user", row["question"])],
        score_fn=combine(metric("correct", exact_match(extract=extract_tag("answer")), weight=1)),
        max_concurrent=64,
        output_dir="runs/gsm8k",
    )
    report = await evaluate(load_jsonl("gsm8k.jsonl"), config)
    print(report.summary["reward"]["mean"])

How it runs:
* One trio nursery; a `CapacityLimiter(max_concurrent)` bounds samples in flight, and the next
  row is pulled from the dataset only when a slot is free, so a lazy dataset is never
  materialised. Separate limiters bound concurrent model calls and tool executions (held by the
  agent loop around each call, so a sample running a tool holds no model-call slot).
* Each sample gets a fresh environment. Any exception in `prepare_messages`, the environment
  factory, the agent or `score_fn` marks only that sample failed (error recorded); cancellation
  always propagates. `AuthenticationError` stops the whole evaluation (every sample would fail).
* A run that ends in a provider error (after the Endpoint's own retries) is continued from where
  it failed up to `provider_error_retries` more times, with exponential backoff; then the sample
  is recorded with status `provider_error`.
* With `output_dir`, each finished sample is appended to `samples.jsonl` (with its trajectory)
  and flushed; `report.json` (config without secrets + summary) is written atomically at the end,
  also on Ctrl-C or cancellation. Running again with the same `output_dir` reuses completed
  samples (same id, same row) and reruns missing, failed and provider-error ones and rows whose
  content changed; the report covers them all.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import random
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Message, StopReason, Trajectory, now_iso
from rollouts.environments.base import Environment
from rollouts.errors import AuthenticationError, ConfigurationError
from rollouts.eval.config import (
    Dataset,
    EnvironmentFactory,
    EvalConfig,
    OnSampleEnd,
    OnSampleEvent,
    OnSampleStart,
    PrepareMessages,
    Row,
    ScoreFn,
    default_prepare_messages,
)
from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, SampleLog, iter_sample_log, read_json, write_json_atomic
from rollouts.eval.progress import ProgressBar
from rollouts.eval.report import EvalReport, ReportStatus, load_report
from rollouts.eval.sample import Sample, Score
from rollouts.events import StreamEvent
from rollouts.providers import client_scope
from rollouts.run_config import RunConfig

_log = logging.getLogger("rollouts.eval.run")

__all__ = [
    "Dataset",
    "EnvironmentFactory",
    "EvalConfig",
    "EvalReport",
    "OnSampleEnd",
    "OnSampleEvent",
    "OnSampleStart",
    "PrepareMessages",
    "Row",
    "ScoreFn",
    "default_prepare_messages",
    "evaluate",
    "evaluate_sample",
    "load_report",
    "sample_id_for",
]


# --------------------------------------------------------------------------------------------
# One sample
# --------------------------------------------------------------------------------------------


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _takes_argument(fn: Callable[..., Any]) -> bool:
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


def _error_text(stage: str, e: BaseException) -> str:
    return f"{stage}: {type(e).__name__}: {e}"


def _base_metadata(started: float, attempts: int, states: Sequence[AgentState] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"duration_s": round(time.perf_counter() - started, 6), "attempts": attempts}
    if states:
        last = states[-1]
        meta["turns"] = last.turn_idx
        meta["usage"] = last.actor.trajectory.total_usage().to_dict()
    return meta


def _backoff_delay(config: EvalConfig, retry: int) -> float:
    base = min(config.retry_backoff_max_s, config.retry_backoff_s * (2**retry))
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
    started = time.perf_counter()
    deadline = trio.current_time() + config.sample_timeout_s if config.sample_timeout_s else math.inf
    sample = Sample(id=sample_id, input=row)
    timeout_text = f"timed out after {config.sample_timeout_s}s (EvalConfig.sample_timeout_s)"

    def failed(
        error: str, stage_sample: Sample, attempts: int = 0, states: Sequence[AgentState] | None = None, **extra: Any
    ) -> Sample:
        meta = {**_base_metadata(started, attempts, states), **extra}
        return replace(stage_sample, status="failed", error=error, metadata=meta)

    # 1. callbacks, messages and environment
    messages: Sequence[Message] = ()
    env = environment
    setup_scope = _time_limit(deadline)
    with setup_scope or nullcontext():
        try:
            if config.on_sample_start is not None:
                await _maybe_await(config.on_sample_start(sample_id, row))
        except Exception as e:
            return await _finish(
                config, failed(_error_text("on_sample_start", e), sample, traceback=traceback.format_exc())
            )
        try:
            messages = tuple(await _maybe_await(config.prepare_messages(row)))
            if not all(isinstance(m, Message) for m in messages):
                raise TypeError(f"prepare_messages must return Messages, got {[type(m).__name__ for m in messages]}")
            if not messages:
                raise ValueError("prepare_messages returned no messages")
        except Exception as e:
            return await _finish(
                config, failed(_error_text("prepare_messages", e), sample, traceback=traceback.format_exc())
            )
        if env is None and config.environment_factory is not None:
            factory = config.environment_factory
            try:
                env = await _maybe_await(factory(row) if _takes_argument(factory) else factory())
            except Exception as e:
                return await _finish(
                    config, failed(_error_text("environment_factory", e), sample, traceback=traceback.format_exc())
                )
    if setup_scope is not None and setup_scope.cancelled_caught:
        return await _finish(config, failed(timeout_text, sample))

    owned_env = env if environment is None else None  # made by the factory: ours to close
    states: list[AgentState] = []
    try:
        # 2. the agent, continued after provider errors
        rc = _sample_run_config(config, sample_id)
        state = AgentState(
            actor=Actor(
                Trajectory(tuple(messages)), config.endpoint, tuple(env.get_tools()) if env is not None else ()
            ),
            environment=env,
        )
        attempts = 0
        states = [state]
        try:
            for retry in range(config.provider_error_retries + 1):
                attempts += 1
                run_scope = _time_limit(deadline)
                run_states = await run_agent(state, rc if run_scope is None else replace(rc, cancel_scope=run_scope))
                states = states[:-1] + run_states if retry else run_states
                last = states[-1]
                if last.stop != StopReason.PROVIDER_ERROR or retry == config.provider_error_retries:
                    break
                with trio.move_on_at(deadline):
                    await trio.sleep(_backoff_delay(config, retry))
                if trio.current_time() >= deadline:
                    break
                state = replace(last, stop=None, error=None)
        except AuthenticationError:
            raise
        except _EventCallbackError as e:
            return await _finish(
                config,
                failed(
                    _error_text("on_sample_event", e.error), sample, attempts, states, traceback=traceback.format_exc()
                ),
            )
        except Exception as e:
            return await _finish(
                config, failed(_error_text("agent", e), sample, attempts, states, traceback=traceback.format_exc())
            )
        last = states[-1]
        sample = Sample(
            id=sample_id,
            input=row,
            trajectory=last.actor.trajectory,
            stop_reason=last.stop.value if last.stop is not None else None,
        )
        if last.stop == StopReason.ABORTED or (
            trio.current_time() >= deadline and last.stop == StopReason.PROVIDER_ERROR
        ):
            return await _finish(config, failed(timeout_text, sample, attempts, states))
        if last.stop == StopReason.PROVIDER_ERROR:
            meta = _base_metadata(started, attempts, states)
            return await _finish(config, replace(sample, status="provider_error", error=last.error, metadata=meta))

        # 3. scoring
        sample = replace(sample, status="completed")
        score: Score | None = None
        if config.score_fn is not None:
            score_scope = _time_limit(deadline)
            with score_scope or nullcontext():
                try:
                    score = await _maybe_await(config.score_fn(sample))
                    if not isinstance(score, Score):
                        raise TypeError(f"score_fn must return a Score, got {type(score).__name__}")
                except AuthenticationError:
                    raise  # e.g. an LLM judge's key is wrong: every sample would fail the same way
                except Exception as e:
                    return await _finish(
                        config,
                        failed(_error_text("score_fn", e), sample, attempts, states, traceback=traceback.format_exc()),
                    )
            if score_scope is not None and score_scope.cancelled_caught:
                return await _finish(config, failed(timeout_text + " while scoring", sample, attempts, states))
        return await _finish(config, replace(sample, score=score, metadata=_base_metadata(started, attempts, states)))
    finally:
        if owned_env is not None:
            # The loop clones the environment before each turn's tools: close the latest copy
            # (clones share external resources such as a worktree, so one close releases them).
            latest = states[-1].environment if states and states[-1].environment is not None else owned_env
            await _close_environment(latest)


async def _close_environment(env: Environment) -> None:
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


def _time_limit(deadline: float) -> trio.CancelScope | None:
    """A scope ending at `deadline`, or None when there is no time limit (saves a scope per phase)."""
    return trio.CancelScope(deadline=deadline) if deadline != math.inf else None


async def _finish(config: EvalConfig, sample: Sample) -> Sample:
    """Call on_sample_end; if it raises, the sample is recorded as failed with that error."""
    if config.on_sample_end is None:
        return sample
    try:
        await _maybe_await(config.on_sample_end(sample))
    except Exception as e:
        meta = {**sample.metadata, "traceback": traceback.format_exc()}
        return replace(sample, status="failed", error=_error_text("on_sample_end", e), metadata=meta)
    return sample


# --------------------------------------------------------------------------------------------
# A dataset
# --------------------------------------------------------------------------------------------


def sample_id_for(row: Row, index: int) -> str:
    """A row's stable id: its own `id` field if it has one, else its index in the dataset."""
    rid = row.get("id")
    return str(rid) if rid is not None and rid != "" else str(index)


class _Rows:
    """Pulls rows one at a time from a sync or async iterable (never more than asked for)."""

    def __init__(self, dataset: Dataset) -> None:
        self._sync: Iterator[Row] | None = None
        self._async: Any = None
        if hasattr(dataset, "__aiter__"):
            self._async = dataset.__aiter__()
        elif isinstance(dataset, Iterable):
            self._sync = iter(dataset)
        else:
            raise ConfigurationError(f"a dataset must be an iterable of dicts, got {type(dataset).__name__}")

    async def next(self) -> Any:
        """The next row (any object: it is checked by the caller), or `_END`."""
        if self._sync is not None:
            return next(self._sync, _END)
        try:
            return await self._async.__anext__()
        except StopAsyncIteration:
            return _END


_END = object()  # no more rows (a None row is an error, not the end)


def _dataset_len(dataset: Dataset, max_samples: int | None) -> int | None:
    n: int | None = None
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        n = None
    if max_samples is not None:
        return min(n, max_samples) if n is not None else max_samples
    return n


def _check_resumable(out: Path, config: EvalConfig) -> None:
    report = out / REPORT_FILE
    if not report.exists():
        return
    try:
        previous = read_json(report)
    except ValueError:
        return  # unreadable report: samples.jsonl is the source of truth
    name = previous.get("eval_name")
    if name is not None and name != config.eval_name:
        raise ConfigurationError(
            f"output_dir {str(out)!r} holds results of eval {name!r}, not {config.eval_name!r}: "
            "use the same eval_name to resume it, or another output_dir"
        )
    prev_ep = previous.get("config", {}).get("endpoint", {})
    for key in ("provider", "model"):
        if key in prev_ep and prev_ep[key] != getattr(config.endpoint, key):
            raise ConfigurationError(
                f"output_dir {str(out)!r} holds results for {key} {prev_ep[key]!r}, not "
                f"{getattr(config.endpoint, key)!r}: use another output_dir for a different model"
            )


def _same_input(recorded: Mapping[str, Any], row: Row) -> bool:
    """Whether a recorded sample's input is this row (compared as the JSON it was written as)."""
    if recorded == row:
        return True
    try:
        return json.loads(json.dumps(dict(row), default=str)) == recorded
    except (TypeError, ValueError):
        return False


async def _redraw_every_second(progress: ProgressBar) -> None:
    """Keep the progress line live (rate, ETA) while no sample finishes."""
    while True:
        await trio.sleep(1.0)
        progress.redraw()


def _is_cancellation(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return all(_is_cancellation(x) for x in e.exceptions)
    return isinstance(e, trio.Cancelled | KeyboardInterrupt)


async def evaluate(dataset: Dataset, config: EvalConfig) -> EvalReport:
    """Evaluate every row of `dataset` (any iterable or async iterable of dicts, read lazily).

    Returns an EvalReport with samples in dataset order. See the module docstring for
    concurrency, failure isolation, persistence and resume."""
    started_at, t0 = now_iso(), time.perf_counter()
    out = Path(config.output_dir) if config.output_dir is not None else None
    previous: dict[str, Sample] = {}
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        _check_resumable(out, config)
        previous = {s.id: s for s in iter_sample_log(out / SAMPLES_FILE) if s.status == "completed"}

    rc = config.run_config or RunConfig()
    rc = replace(
        rc,
        max_turns=config.effective_max_turns,
        # A limiter given in run_config is kept: several evaluations can share one.
        model_limiter=rc.model_limiter
        or trio.CapacityLimiter(config.max_concurrent_model_calls or config.max_concurrent),
        tool_limiter=rc.tool_limiter or trio.CapacityLimiter(config.max_concurrent_tools or config.max_concurrent),
    )
    run_cfg = replace(config, run_config=rc)

    order: list[str] = []
    first_index: dict[str, int] = {}
    results: dict[str, Sample] = {}
    reused = 0
    slots = trio.CapacityLimiter(config.max_concurrent)
    progress = ProgressBar(
        _dataset_len(dataset, config.max_samples),
        enabled=None if config.show_progress else False,
        label=config.eval_name,
    )
    log = SampleLog(out / SAMPLES_FILE) if out is not None else None

    fatal: list[BaseException] = []  # an error that ends the whole evaluation (raised after the nursery)

    async def run_one(row: Row, sid: str, token: object, cancel_all: trio.CancelScope) -> None:
        try:
            sample = await evaluate_sample(row, sid, run_cfg)
        except AuthenticationError as e:
            fatal.append(e)
            cancel_all.cancel()
            return
        finally:
            slots.release_on_behalf_of(token)
        record(sid, sample)

    @trio.lowlevel.enable_ki_protection
    def record(sid: str, sample: Sample) -> None:
        # Protected from Ctrl-C (deferred to the next checkpoint): a sample is in the results
        # and on disk, or neither; a line is never torn by KeyboardInterrupt.
        results[sid] = sample
        if log is not None:
            log.write(sample)
        progress.update(sample)

    async def feed(nursery: trio.Nursery) -> None:
        nonlocal reused
        rows = _Rows(dataset)
        index = 0
        while config.max_samples is None or index < config.max_samples:
            token = object()
            await slots.acquire_on_behalf_of(token)
            try:
                row = await rows.next()
                if row is _END:
                    slots.release_on_behalf_of(token)
                    return
                if not isinstance(row, Mapping):
                    raise ConfigurationError(
                        f"dataset row {index} is a {type(row).__name__}; every row must be a dict "
                        "(for a pandas DataFrame pass df.to_dict('records'))"
                    )
                sid = sample_id_for(row, index)
                if sid in first_index:
                    raise ConfigurationError(
                        f"dataset rows {first_index[sid]} and {index} have the same id {sid!r}; "
                        "sample ids must be unique (remove the 'id' field to use row indices)"
                    )
            except BaseException:
                slots.release_on_behalf_of(token)
                raise
            first_index[sid] = index
            order.append(sid)
            index += 1
            done = previous.get(sid)
            if done is not None and not _same_input(done.input, row):
                done = None  # the row changed since it was recorded: run it again
            if done is None:
                nursery.start_soon(run_one, row, sid, token, nursery.cancel_scope)
                continue
            slots.release_on_behalf_of(token)
            results[sid] = done
            reused += 1
            progress.update(done, reused=True)

    async def run_samples() -> None:
        async with trio.open_nursery() as nursery:
            try:
                await feed(nursery)
            except Exception as e:  # the dataset itself is broken: stop everything
                fatal.append(e)
                nursery.cancel_scope.cancel()

    @trio.lowlevel.enable_ki_protection
    def finish(status: ReportStatus, error: str | None) -> EvalReport:
        # Synchronous (no checkpoint, so cancellation cannot interrupt it) and protected from a
        # second Ctrl-C: report.json is always written, atomically.
        progress.close()
        if log is not None:
            log.close()
        samples = tuple(results[sid] for sid in order if sid in results)
        report = EvalReport(
            eval_name=config.eval_name,
            samples=samples,
            config=config.to_dict,  # it and the summary are computed when first read (or written)
            status=status,
            started_at=started_at,
            finished_at=now_iso(),
            duration_s=round(time.perf_counter() - t0, 6),
            reused=reused,
            error=error,
            output_dir=str(out) if out is not None else None,
        )
        if out is not None:
            write_json_atomic(out / REPORT_FILE, report.to_dict())
        return report

    status: ReportStatus = "failed"
    error: str | None = None
    try:
        async with client_scope():
            if progress.enabled:
                async with trio.open_nursery() as outer:
                    outer.start_soon(_redraw_every_second, progress)
                    await run_samples()
                    outer.cancel_scope.cancel()
            else:
                await run_samples()
        if fatal:
            raise fatal[0]
        status = "completed"
    except BaseException as e:
        if _is_cancellation(e):
            status = "cancelled"
        else:
            error = _error_text("evaluate", e)
        raise
    finally:
        report = finish(status, error)
    return report
