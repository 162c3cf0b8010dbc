"""How evaluate() runs the samples it decides to run: an `Executor`.

evaluate() reads and admits the rows, decides for each (run it, re-score its record, reuse it)
and records every finished sample (samples.jsonl, summary, progress, report.json): that is the
same whatever runs the samples. The executor only runs the rows it is handed, and hands each
finished sample back:

    report = await evaluate(rows, config)                                 # InProcess(): this process
    report = await evaluate(rows, config, executor=WorkerPool(4))         # 4 worker processes

`InProcess` runs `evaluate_sample` in this trio run. The worker pool
(`rollouts.service.eval_workers.WorkerPool`) queues each row in an embedded queue database and
awaits its result from worker processes; it is handed in by the caller, so nothing under eval/
imports the service.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import trio

from rollouts.errors import AuthenticationError
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.run_sample import evaluate_sample
from rollouts.eval.sample import Sample
from rollouts.run_config import RunConfig

__all__ = ["Executor", "Feed", "InProcess", "Record", "Submit", "with_limiters"]

Submit = Callable[[Row, str], Awaitable[None]]
"""Hand a row (and its sample id) to the executor to run; returns once it is taken (a pool may
make the caller wait while its queue is full)."""
Feed = Callable[[Submit], Awaitable[None]]
"""evaluate()'s side: submits every row it decides to run, then returns."""
Record = Callable[[Sample], Awaitable[None]]
"""evaluate()'s side: records a finished sample (called once per submitted row that finishes)."""


class Executor(Protocol):
    """Runs the rows evaluate() submits and hands back each finished sample."""

    def prepare(self, config: EvalConfig) -> None:
        """Check, before anything starts (no file written), that `config` can run here; a
        ConfigurationError names the field and the fix."""

    def capacity(self, config: EvalConfig) -> int:
        """How many rows evaluate() keeps submitted and not yet recorded (the rows it reads ahead)."""

    async def run(self, config: EvalConfig, feed: Feed, record: Record) -> None:
        """Run `feed` (it submits rows), run each submitted row with `config` and `record` the
        sample, as `evaluate_sample` returns it (on_sample_end called); return once `feed` has
        returned and every submitted row is recorded. An exception of `feed` ends the run and is
        raised as itself, as is an AuthenticationError (every sample would fail the same way).
        Cancelled: samples already finished may still be recorded (shielded, bounded)."""


def with_limiters(config: EvalConfig) -> EvalConfig:
    """`config` with the model-call and tool limiters every sample of one process shares."""
    rc = config.run_config or RunConfig()
    model_limiter, tool_limiter = config.limiters()
    rc = replace(rc, max_turns=config.effective_max_turns, model_limiter=model_limiter, tool_limiter=tool_limiter)
    return replace(config, run_config=rc)


@dataclass(frozen=True)
class InProcess:
    """The default executor: each submitted row runs `evaluate_sample` in a task of this trio
    run, `config.max_concurrent` at once; with `limiter`, also under that limiter, which other
    evaluations may share (an eval set's pairs together run at most its total)."""

    limiter: trio.CapacityLimiter | None = None

    def prepare(self, config: EvalConfig) -> None:
        """Anything runs in this process."""

    def capacity(self, config: EvalConfig) -> int:
        return config.max_concurrent

    async def run(self, config: EvalConfig, feed: Feed, record: Record) -> None:
        fatal: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def run_one(row: Row, sample_id: str) -> None:
                async with self.limiter if self.limiter is not None else contextlib.nullcontext():
                    try:
                        sample = await evaluate_sample(row, sample_id, config)
                    except AuthenticationError as e:  # every sample would fail alike
                        fatal.append(e)
                        nursery.cancel_scope.cancel()
                        return
                await record(sample)

            async def submit(row: Row, sample_id: str) -> None:
                nursery.start_soon(run_one, row, sample_id)

            try:
                await feed(submit)
            except Exception as e:  # (raised after the nursery: as itself, not in an exception group)
                fatal.append(e)
                nursery.cancel_scope.cancel()
        if fatal:
            raise fatal[0]
