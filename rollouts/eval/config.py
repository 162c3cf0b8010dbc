"""EvalConfig: how evaluate() runs a dataset (model, hooks, limits, retries, output)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias

import trio

from rollouts.dtypes import Endpoint, Message
from rollouts.environments.base import Environment
from rollouts.errors import ConfigurationError
from rollouts.eval.fingerprint import Fingerprint, output_hash, task_fingerprint
from rollouts.eval.io import redact_secrets
from rollouts.eval.sample import Sample, Score
from rollouts.events import StreamEvent
from rollouts.run_config import RunConfig

Row: TypeAlias = Mapping[str, Any]
ScoreFn: TypeAlias = Callable[[Sample], Score | Awaitable[Score]]
PrepareMessages: TypeAlias = Callable[[Row], Sequence[Message] | Awaitable[Sequence[Message]]]
EnvironmentFactory: TypeAlias = Callable[..., Environment | Awaitable[Environment]]
OnSampleStart: TypeAlias = Callable[[str, Row], Awaitable[None] | None]
OnSampleEvent: TypeAlias = Callable[[str, StreamEvent], Awaitable[None] | None]
OnSampleEnd: TypeAlias = Callable[[Sample], Awaitable[None] | None]
Dataset: TypeAlias = Iterable[Row] | AsyncIterable[Row]

_DEFAULT_MAX_TURNS = 10
DEFAULT_MAX_CONCURRENT = 8  # the one place this default is written (the CLI leaves it to us)


def default_prepare_messages(row: Row) -> list[Message]:
    """Messages from a row: its `messages` (dicts or Messages), else a user message from
    `prompt`, `question` or `input` (after a `system` message if the row has one)."""
    if "messages" in row:
        msgs = row["messages"]
        return [m if isinstance(m, Message) else Message.from_dict(m) for m in msgs]
    for key in ("prompt", "question", "input"):
        if isinstance(row.get(key), str):
            out = [Message("system", row["system"])] if isinstance(row.get("system"), str) else []
            out.append(Message("user", row[key]))
            return out
    raise ConfigurationError(
        f"cannot build messages from a row with keys {sorted(row)}: give it a 'messages', 'prompt', "
        "'question' or 'input' field, or your own row -> messages function (--prepare MODULE:FUNCTION on "
        "the command line; prepare_messages= in EvalConfig or GRPOConfig)"
    )


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate a dataset. Only `endpoint` is required.

    endpoint: the model under evaluation.
    score_fn: `Sample -> Score`, sync or async (None: samples are not scored).
    prepare_messages: `row -> messages`, sync or async.
    environment_factory: builds a fresh Environment per sample; called with the row if it has a
        required positional parameter, else with none (so a class like `CalculatorEnvironment`
        works). Sync or async.
    run_config: handlers for the agent loop (evaluate() gives each sample its own cancel scope
        and, unless run_config already has them, the model/tool limiters below).
    max_turns: bound on model turns per sample (default: run_config.max_turns if given, else 10).
    max_samples: evaluate only the first N rows.
    max_concurrent: samples in flight at once (default 8).
    max_concurrent_model_calls / max_concurrent_tools: limits on concurrent model calls / tool
        executions across all samples (default: max_concurrent; see `model_call_limit` /
        `tool_limit`). A `model_limiter` / `tool_limiter` already set in `run_config` is used
        instead, so concurrent evaluations (e.g. GEPA's) can share one limit.
    sample_timeout_s: time limit per sample (including retries and scoring); a sample over it
        fails with its partial trajectory kept.
    provider_error_retries: how many times a run that ended in a provider error is continued
        (after the Endpoint's own per-call retries), waiting `retry_backoff_s * 2**k` (jittered,
        at most `retry_backoff_max_s`) in between.
    output_dir: where `samples.jsonl` and `report.json` go; also enables resume. A recorded
        sample is reused only when its fingerprint (endpoint, environment, max_turns, score
        function, prepared messages: see rollouts.eval.fingerprint) matches; any other
        difference is a ConfigurationError naming what changed, unless:
    rescore: only the score function changed: keep the recorded trajectories and run the new
        score function on them (no model calls).
    overwrite: delete the previous samples.jsonl and report.json in output_dir and start over.
    keep_samples: hold every finished Sample in memory for `EvalReport.samples` (default: only
        without output_dir; with one, `report.samples` is read back from samples.jsonl when
        first used, so a 100,000-row run does not hold 100,000 trajectories). False: never
        (the report has its summary; samples go to on_sample_end and samples.jsonl only).
    eval_name: names the evaluation in the report and the viewer (resume refuses a different
        name). Default: `<task>-<model>-<UTC time>`, the task being the output_dir's name (else
        the environment's, else "eval"), e.g. `gsm8k-gpt-4.1-mini-20261127-013000`; resuming
        an output_dir keeps the name it has.
    show_progress: progress on stderr: a live bar on a terminal, else a line every 30 seconds.
    on_sample_start(sample_id, row) / on_sample_event(sample_id, event) / on_sample_end(sample):
        callbacks, sync or async; an exception in one fails that sample.
    metadata: free-form JSON-safe data recorded in report.json.
    epochs: run every row this many times (sample ids `<row id>#1`..`#k`) and reduce each row's
        epochs (rollouts.eval.epochs): mean, max, majority vote over `answer_fn`'s answers, and
        unbiased pass@k for each k of `pass_at` (default: 1 and `epochs`); in
        `report.summary["epochs"]`. `max_samples` counts rows.
    pass_at: the k values of pass@k (each 1 <= k <= epochs).
    pass_threshold: the reward at or above which a sample counts as correct for pass@k (default 1.0).
    answer_fn: `Sample -> str | None`, the answer majority vote counts (default: the response text).
    """

    endpoint: Endpoint
    score_fn: ScoreFn | None = None
    prepare_messages: PrepareMessages = default_prepare_messages
    environment_factory: EnvironmentFactory | None = None
    run_config: RunConfig | None = None
    max_turns: int | None = None
    max_samples: int | None = None
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    max_concurrent_model_calls: int | None = None
    max_concurrent_tools: int | None = None
    sample_timeout_s: float | None = None
    provider_error_retries: int = 2
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 30.0
    output_dir: str | Path | None = None
    rescore: bool = False
    overwrite: bool = False
    keep_samples: bool | None = None
    eval_name: str | None = None
    show_progress: bool = True
    on_sample_start: OnSampleStart | None = None
    on_sample_event: OnSampleEvent | None = None
    on_sample_end: OnSampleEnd | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    epochs: int = 1
    pass_at: tuple[int, ...] | None = None
    pass_threshold: float = 1.0
    answer_fn: Callable[[Sample], str | None] | None = None

    def __post_init__(self) -> None:
        def positive(name: str, value: float | None, allow_none: bool = True) -> None:
            if value is None and allow_none:
                return
            if value is None or value <= 0:
                raise ConfigurationError(f"EvalConfig.{name} must be > 0, got {value!r}")

        if not isinstance(self.endpoint, Endpoint):
            raise ConfigurationError(f"EvalConfig.endpoint must be an Endpoint, got {type(self.endpoint).__name__}")
        positive("max_concurrent", self.max_concurrent, allow_none=False)
        positive("max_concurrent_model_calls", self.max_concurrent_model_calls)
        positive("max_concurrent_tools", self.max_concurrent_tools)
        positive("max_turns", self.max_turns)
        positive("sample_timeout_s", self.sample_timeout_s)
        if self.max_samples is not None and self.max_samples < 0:
            raise ConfigurationError(f"EvalConfig.max_samples must be >= 0, got {self.max_samples}")
        if not 0 <= self.provider_error_retries <= 100:
            raise ConfigurationError(
                f"EvalConfig.provider_error_retries must be between 0 and 100, got {self.provider_error_retries}"
            )
        if self.retry_backoff_s < 0 or self.retry_backoff_max_s < 0:
            raise ConfigurationError("EvalConfig.retry_backoff_s and retry_backoff_max_s must be >= 0")
        if self.rescore and self.overwrite:
            raise ConfigurationError("EvalConfig: give rescore or overwrite, not both")
        if self.eval_name is not None and not self.eval_name:
            raise ConfigurationError("EvalConfig.eval_name must not be empty (None: named by task, model and time)")
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or not 1 <= self.epochs <= 10_000:
            raise ConfigurationError(f"EvalConfig.epochs must be a whole number from 1 to 10000, got {self.epochs!r}")
        if self.pass_at is not None:
            object.__setattr__(self, "pass_at", tuple(self.pass_at))
            bad = [
                k for k in self.pass_at if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.epochs
            ]
            if bad or not self.pass_at:
                raise ConfigurationError(
                    f"EvalConfig.pass_at must list k values from 1 to epochs ({self.epochs}), got {self.pass_at!r}"
                )
        if self.run_config is not None and self.run_config.cancel_scope is not None:
            raise ConfigurationError(
                "EvalConfig.run_config.cancel_scope must be None: evaluate() gives each sample its own "
                "(use sample_timeout_s for a time limit, or cancel the surrounding scope to stop the eval)"
            )

    @property
    def pass_at_k(self) -> tuple[int, ...]:
        """The k values pass@k is reported for: `pass_at`, else 1 and `epochs` (only 1 for one epoch)."""
        if self.pass_at is not None:
            return tuple(sorted(set(self.pass_at)))
        return tuple(sorted({1, self.epochs}))

    @property
    def effective_max_turns(self) -> int:
        """`max_turns`, else `run_config.max_turns`, else 10."""
        if self.max_turns is not None:
            return self.max_turns
        return self.run_config.max_turns if self.run_config is not None else _DEFAULT_MAX_TURNS

    @property
    def model_call_limit(self) -> int:
        """Concurrent model calls across all samples: `max_concurrent_model_calls`, else
        `max_concurrent` (the one place this fallback is written)."""
        return self.max_concurrent_model_calls or self.max_concurrent

    @property
    def tool_limit(self) -> int:
        """Concurrent tool executions across all samples: `max_concurrent_tools`, else `max_concurrent`."""
        return self.max_concurrent_tools or self.max_concurrent

    def limiters(self) -> tuple[trio.CapacityLimiter, trio.CapacityLimiter]:
        """The (model-call, tool) limiters to run under: those in `run_config`, else new ones
        sized by `model_call_limit` / `tool_limit`."""
        rc = self.run_config
        return (
            (rc.model_limiter if rc is not None else None) or trio.CapacityLimiter(self.model_call_limit),
            (rc.tool_limiter if rc is not None else None) or trio.CapacityLimiter(self.tool_limit),
        )

    @functools.cached_property
    def fingerprint(self) -> Fingerprint:
        """The task-level fingerprint (see rollouts.eval.fingerprint); each sample adds its messages."""
        return task_fingerprint(self)

    def named(self, previous: str | None = None) -> EvalConfig:
        """This config with its `eval_name` set: as given, else `previous` (the name an
        output_dir's report has), else `<task>-<model>-<UTC time>`."""
        if self.eval_name is not None:
            return self
        if previous:
            return replace(self, eval_name=previous)
        factory = self.environment_factory
        task = (
            Path(self.output_dir).name
            if self.output_dir is not None
            else getattr(factory, "__name__", None)
            if factory is not None
            else None
        ) or "eval"
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        return replace(self, eval_name=f"{task}-{self.endpoint.model}-{stamp}")

    @property
    def keeps_samples(self) -> bool:
        """Whether evaluate() holds finished samples in memory (see `keep_samples`)."""
        return self.keep_samples if self.keep_samples is not None else self.output_dir is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe description without secrets (functions recorded by name)."""
        return {
            "eval_name": self.eval_name,
            "endpoint": redact_secrets(self.endpoint.to_dict()),
            "score_fn": _callable_name(self.score_fn),
            "prepare_messages": _callable_name(self.prepare_messages),
            "environment_factory": _callable_name(self.environment_factory),
            "max_turns": self.effective_max_turns,
            "max_samples": self.max_samples,
            "max_concurrent": self.max_concurrent,
            "max_concurrent_model_calls": self.model_call_limit,
            "max_concurrent_tools": self.tool_limit,
            "sample_timeout_s": self.sample_timeout_s,
            "provider_error_retries": self.provider_error_retries,
            "retry_backoff_s": self.retry_backoff_s,
            "retry_backoff_max_s": self.retry_backoff_max_s,
            "output_dir": str(self.output_dir) if self.output_dir is not None else None,
            "metadata": redact_secrets(dict(self.metadata)),
            "epochs": self.epochs,
            "pass_at": list(self.pass_at_k),
            "pass_threshold": self.pass_threshold,
            "answer_fn": _callable_name(self.answer_fn),
            "fingerprint": self.fingerprint.to_dict(),
            "output_hash": output_hash(self),
        }


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"
