"""`optimize()`: evolve an agent's prompts with GEPA over the datasets and score functions you
already use with `evaluate()`.

    result = await optimize(
        "You are a careful calculator.",               # or {"system_prompt": ..., "other": ...}
        trainset=rows[:50], valset=rows[50:100],
        task=EvalConfig(endpoint=Endpoint("openai", "gpt-4.1-mini"), score_fn=score, max_concurrent=32),
        reflection_endpoint=Endpoint("anthropic", "claude-sonnet-4-5"),
        max_metric_calls=500,
        run_dir="runs/gepa-calc",                       # checkpoint + rollouts; rerun to resume
    )
    print(result.best_candidate["system_prompt"], result.best_score)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import trio

from rollouts._exception_groups import single_error
from rollouts._sync import run_sync
from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError
from rollouts.eval.config import EvalConfig
from rollouts.gepa.adapter import GEPAAdapter
from rollouts.gepa.checkpoint import ROLLOUTS_FILE, write_result_files
from rollouts.gepa.config import GEPAConfig
from rollouts.gepa.engine import GEPAEngine
from rollouts.gepa.events import GEPACallback, ProgressPrinter
from rollouts.gepa.result import GEPAResult
from rollouts.gepa.rollouts_adapter import RolloutsAdapter
from rollouts.gepa.stoppers import (
    FileStopper,
    MaxIterationsStopper,
    NoImprovementStopper,
    ScoreThresholdStopper,
    Stopper,
)
from rollouts.providers import client_scope

__all__ = ["optimize", "optimize_sync", "search_config"]


def _rows(data: Iterable[Mapping[str, Any]], what: str) -> list[Mapping[str, Any]]:
    rows = list(data)
    for n, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ConfigurationError(f"{what} row {n} is a {type(row).__name__}; every row must be a dict")
    return rows


def _digest(rows: Sequence[Mapping[str, Any]]) -> str:
    text = json.dumps([dict(r) for r in rows], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _task_fingerprint(adapter: GEPAAdapter) -> dict[str, Any]:
    """The task's fingerprint (endpoint, environment, max_turns, score function) for a
    RolloutsAdapter: a run_dir made with another task is refused at once, by name."""
    if not isinstance(adapter, RolloutsAdapter):
        return {}
    return {f"task.{k}": v for k, v in adapter.config.fingerprint.to_dict().items()}


_SHORTCUTS = ("score_threshold", "no_improvement_iterations", "max_iterations", "stop_file")


def search_config(config: GEPAConfig | None, settings: Mapping[str, Any]) -> GEPAConfig:
    """`config` (else GEPAConfig's defaults) with `settings` applied: GEPAConfig field names
    (a None value means "not given"; `stoppers` are added to the config's own), plus the stopper
    shortcuts `score_threshold`, `no_improvement_iterations`, `max_iterations`, `stop_file`.
    An unknown name is a TypeError listing the valid ones."""
    known = {f.name for f in fields(GEPAConfig)}
    unknown = sorted(set(settings) - known - set(_SHORTCUTS))
    if unknown:
        raise TypeError(
            f"optimize() got unknown setting(s) {', '.join(unknown)}; GEPA settings are GEPAConfig's fields "
            f"({', '.join(sorted(known))}) and the stop shortcuts ({', '.join(_SHORTCUTS)})"
        )
    cfg = config or GEPAConfig()
    given = {k: v for k, v in settings.items() if k in known and k != "stoppers" and v is not None}
    cfg = replace(cfg, **given)
    extra: list[Stopper] = list(settings.get("stoppers") or ())
    if settings.get("score_threshold") is not None:
        extra.append(ScoreThresholdStopper(settings["score_threshold"]))
    if settings.get("no_improvement_iterations") is not None:
        extra.append(NoImprovementStopper(settings["no_improvement_iterations"]))
    if settings.get("max_iterations") is not None:
        extra.append(MaxIterationsStopper(settings["max_iterations"]))
    if settings.get("stop_file") is not None:
        extra.append(FileStopper(settings["stop_file"]))
    return replace(cfg, stoppers=(*cfg.stoppers, *extra)) if extra else cfg


async def optimize(
    seed_candidate: Mapping[str, str] | str,
    trainset: Iterable[Mapping[str, Any]],
    valset: Iterable[Mapping[str, Any]] | None = None,
    *,
    task: EvalConfig | None = None,
    adapter: GEPAAdapter | None = None,
    reflection_endpoint: Endpoint | None = None,
    config: GEPAConfig | None = None,
    run_dir: str | Path | None = None,
    callbacks: Sequence[GEPACallback] = (),
    show_progress: bool = False,
    cancel_scope: trio.CancelScope | None = None,
    **settings: Any,
) -> GEPAResult:
    """Evolve `seed_candidate` (a system prompt, or a dict of component name -> text).

    The task is either `task` (an EvalConfig: its agent runs every instance through
    `evaluate()`, scored by its `score_fn`; see RolloutsAdapter for how components are applied)
    or your own `adapter`. `valset` defaults to `trainset`. `reflection_endpoint` is the model
    that proposes new texts.

    Search settings: `config` (a GEPAConfig, else its defaults), with any GEPAConfig field given
    here by name overriding it — `max_metric_calls=500`, `reflection_minibatch_size`,
    `candidate_selection`, `use_merge`, `proposals_in_flight`, `seed`, `timeout_s`, ... (see
    GEPAConfig for every field, its default and meaning; `stoppers` are added to the config's).
    Stop shortcuts: `score_threshold`, `no_improvement_iterations`, `max_iterations`,
    `stop_file` (a file that stops the run when it appears; one left from an earlier run is
    removed at the start, with a message). An unknown name is a TypeError.

    Budget and stopping: `max_metric_calls` (evaluations of one instance) is never exceeded;
    the stoppers end the run after the iterations in flight; `timeout_s` and cancelling
    `cancel_scope` end it at once. Every way returns the best candidate so far.

    With `run_dir`, the state is checkpointed after every iteration and every rollout and
    reflection is logged; calling optimize() again with the same arguments resumes and ends
    with the result an uninterrupted run gives. The best texts and the result are written there.
    """
    if (task is None) == (adapter is None):
        raise ConfigurationError("give optimize() either task=EvalConfig(...) or adapter=..., not both or neither")
    seed_map = {"system_prompt": seed_candidate} if isinstance(seed_candidate, str) else dict(seed_candidate)
    train = _rows(trainset, "trainset")
    val = _rows(valset, "valset") if valset is not None else train
    cfg = search_config(config, settings)
    out = Path(run_dir) if run_dir is not None else None
    owned: RolloutsAdapter | None = None
    if task is not None:
        owned = RolloutsAdapter(task, log_path=out / ROLLOUTS_FILE if out else None)
        the_adapter: GEPAAdapter = owned
    else:
        assert adapter is not None
        if isinstance(adapter, RolloutsAdapter) and out is not None:
            owned = adapter.with_log(out / ROLLOUTS_FILE)
            the_adapter = owned
        else:
            the_adapter = adapter
    try:
        if isinstance(the_adapter, RolloutsAdapter) and train:
            await the_adapter.check_candidate(seed_map, train[0])
        all_callbacks: list[GEPACallback] = list(callbacks)
        if show_progress:
            all_callbacks.append(ProgressPrinter())
        engine = GEPAEngine(
            the_adapter,
            seed_map,
            train,
            val,
            cfg,
            reflection_endpoint=reflection_endpoint,
            run_dir=out,
            callbacks=all_callbacks,
            data_fingerprint={"trainset": _digest(train), "valset": _digest(val), **_task_fingerprint(the_adapter)},
        )
        try:
            async with client_scope():
                result = await engine.run(cancel_scope)
        except BaseExceptionGroup as group:
            single = single_error(group)
            if single is group:
                raise
            raise single from None
        if out is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(write_result_files, out, result)
        return result
    finally:
        if owned is not None:
            owned.close()


def optimize_sync(
    seed_candidate: Mapping[str, str] | str, trainset: Iterable[Mapping[str, Any]], *args: Any, **kwargs: Any
) -> GEPAResult:
    """`optimize()` for code that is not async: the same arguments, run in its own trio event
    loop; returns the GEPAResult. Raises ConfigurationError when called inside a running event
    loop (trio or asyncio, e.g. a Jupyter cell): there, `await optimize(...)`.

        result = optimize_sync("You are ...", train, val, task=cfg, reflection_endpoint=ep, max_metric_calls=200)
    """
    return run_sync("optimize_sync", optimize, seed_candidate, trainset, *args, **kwargs)
