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
  samples (same id, same row, same fingerprint: see rollouts.eval.resume) and reruns missing,
  failed and provider-error ones and rows whose content changed; the report covers them all.
  Samples recorded under other settings are never reused silently: that is an error naming
  what changed, unless `rescore` (only the scorer changed) or `overwrite` is set. One run
  writes an output_dir at a time: it is locked (an OS file lock, `.rollouts.lock`, released
  when the run ends or its process dies) and a second run is refused, naming the holder.
* Memory stays flat however long the dataset: rows are read one at a time, the summary is
  accumulated as samples finish, and with an `output_dir` finished samples are not held
  (`report.samples` reads them back from samples.jsonl when first used; `keep_samples`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel

from rollouts._dirlock import DirectoryLock
from rollouts.dtypes import now_iso
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
from rollouts.eval.epochs import EpochReducer, EpochRow, epoch_reducer, epoch_rows, with_epochs, write_epochs
from rollouts.eval.executor import Executor, InProcess, Submit, with_limiters
from rollouts.eval.fingerprint import messages_hash
from rollouts.eval.ids import SampleIds
from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, SampleLog, StreamedList, read_json, write_json_atomic
from rollouts.eval.progress import ProgressBar
from rollouts.eval.report import EvalReport, ReportStatus, load_report, read_samples
from rollouts.eval.resume import Decision, PreviousSamples, check_report, remove_previous
from rollouts.eval.run_sample import error_text, evaluate_sample, rescore_sample
from rollouts.eval.sample import Sample
from rollouts.eval.summary import SummaryBuilder
from rollouts.providers import client_scope

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
    "rescore_sample",
    "sample_id_for",
]


def sample_id_for(row: Row, index: int) -> str:
    """A row's stable id: its own `id` field if it has one, else its index in the dataset."""
    if isinstance(row, EpochRow):
        return row.sample_id
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


async def _redraw_every_second(progress: ProgressBar) -> None:
    """Keep the progress line live (rate, ETA) while no sample finishes."""
    while True:
        await trio.sleep(1.0)
        progress.redraw()


def _is_cancellation(e: BaseException) -> bool:
    if isinstance(e, BaseExceptionGroup):
        return all(_is_cancellation(x) for x in e.exceptions)
    return isinstance(e, trio.Cancelled | KeyboardInterrupt)


async def _prepared_hash(config: EvalConfig, row: Row) -> str | None:
    """The hash of the messages `config` prepares for `row` (None if preparing fails: the row
    then runs, and its sample records the error)."""
    try:
        out = config.prepare_messages(row)
        if hasattr(out, "__await__"):
            out = await out
        return messages_hash(tuple(out))
    except Exception:
        return None


@dataclass
class _Run:
    """The state of one evaluate() call: rows seen (ids in dataset order), results kept,
    the running summary, and its output files."""

    config: EvalConfig
    out: Path | None
    progress: ProgressBar
    log: SampleLog | None
    previous: PreviousSamples | None
    summary: SummaryBuilder | None = None  # accumulated as samples finish when they are not kept
    order: SampleIds = field(default_factory=SampleIds)
    results: dict[str, Sample] | None = None
    reused: int = 0
    rescored: int = 0
    epochs: EpochReducer | None = None  # EvalConfig.epochs > 1: each row's epochs, reduced
    fatal: list[BaseException] = field(default_factory=list)  # ends the whole evaluation
    in_flight: set[str] = field(default_factory=set)  # admitted, not yet recorded (<= max_concurrent)

    @trio.lowlevel.enable_ki_protection
    def record(self, sample: Sample, *, reused: bool = False) -> None:
        # Protected from Ctrl-C (deferred to the next checkpoint): a sample is counted and on
        # disk, or neither; a line is never torn by KeyboardInterrupt.
        self.in_flight.discard(sample.id)
        if self.log is not None and not reused:
            sample = self.log.write(sample)  # (failed instead, if it cannot be written)
        if self.results is not None:
            self.results[sample.id] = sample
        if self.summary is not None:
            self.summary.add(sample)
        if self.epochs is not None:
            self.epochs.add(sample)
        self.progress.update(sample, reused=reused)

    def admit(self, row: Any, index: int) -> str:
        """The id of the next dataset row (ConfigurationError for a bad row or a repeated id)."""
        if not isinstance(row, Mapping):
            raise ConfigurationError(
                f"dataset row {index} is a {type(row).__name__}; every row must be a dict "
                "(for a pandas DataFrame pass df.to_dict('records'))"
            )
        sid = sample_id_for(row, index)
        self.order.add(index, sid, explicit=sid != str(index))
        self.in_flight.add(sid)
        return sid

    def report(self, status: ReportStatus, error: str | None, started_at: str, t0: float) -> EvalReport:
        order, out = self.order, self.out
        samples: Any
        ids: Sequence[str]
        summary: Any = None  # kept samples: summarize(samples) when first read (GEPA's minibatches never do)
        if self.results is not None:
            results = self.results
            samples = tuple(results[sid] for sid in order if sid in results)
            ids = tuple(s.id for s in samples)
        else:
            assert self.summary is not None
            summary = self.summary.result()
            assert out is not None or not self.config.keeps_samples
            ids = self._finished_ids(order) if self.in_flight else order
            samples = (lambda: read_samples(out, ids)) if out is not None else ()
        if self.epochs is not None:
            summary = with_epochs(summary, samples, self.epochs)
        return EvalReport(
            eval_name=self.config.eval_name or "eval",
            samples=samples,
            summary=summary,
            config=self.config.to_dict,  # computed when first read (or written)
            status=status,
            started_at=started_at,
            finished_at=now_iso(),
            duration_s=round(time.perf_counter() - t0, 6),
            reused=self.reused,
            error=error,
            output_dir=str(out) if out is not None else None,
            sample_ids=ids,
            rescored=self.rescored,
        )

    def _finished_ids(self, order: SampleIds) -> tuple[str, ...]:
        # A cancelled run: the rows admitted but not finished are left out of the report.
        return tuple(sid for sid in order if sid not in self.in_flight)


def _previous_name(config: EvalConfig) -> str | None:
    """The eval_name of the report in `config.output_dir`, if there is one (resume keeps it)."""
    if config.eval_name is not None or config.output_dir is None or config.overwrite:
        return None
    try:
        name = read_json(Path(config.output_dir) / REPORT_FILE).get("eval_name")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True)
class _Output:
    """An output directory opened for this run: locked for it, its samples log, and what an
    earlier run recorded there."""

    path: Path
    lock: DirectoryLock
    log: SampleLog
    previous: PreviousSamples | None


def _open(config: EvalConfig) -> _Output | None:
    """The output directory, locked for this run (DirectoryInUseError if another run writes it)."""
    if config.output_dir is None:
        return None
    out = Path(config.output_dir)
    lock = DirectoryLock.acquire(out, "evaluate() output_dir")  # (creates the directory)
    log: SampleLog | None = None
    try:
        if config.overwrite:
            remove_previous(out)
        check_report(out, config)
        log = SampleLog(out / SAMPLES_FILE)  # (drops a torn last line before the index is read)
        previous = PreviousSamples(out, config)
    except BaseException:
        if log is not None:
            log.close()
        lock.release()
        raise
    return _Output(out, lock, log, previous if len(previous) else None)


async def _feed(run: _Run, dataset: Dataset, run_cfg: EvalConfig, executor: Executor) -> None:
    """Pull rows while a slot is free and decide for each: the executor runs it, or its record
    is re-scored (here) or reused. Returns when every row is recorded."""
    slots = trio.CapacityLimiter(executor.capacity(run.config))
    tokens: dict[str, object] = {}  # rows handed to the executor, not yet recorded: their slots

    async def record(sample: Sample) -> None:
        run.record(sample)
        token = tokens.pop(sample.id, None)
        if token is not None:
            slots.release_on_behalf_of(token)

    async def feed(submit: Submit) -> None:
        failed: list[Exception] = []  # (raised after the nursery: as itself, not in an exception group)
        async with trio.open_nursery() as rescoring:

            async def rescore_one(sample: Sample, token: object) -> None:
                try:
                    done = await rescore_sample(sample, run_cfg)
                except AuthenticationError as e:  # (an LLM judge's key: every sample would fail)
                    failed.append(e)
                    rescoring.cancel_scope.cancel()
                    return
                finally:
                    slots.release_on_behalf_of(token)
                run.record(done)

            try:
                async with aclosing(admitted_rows(run, dataset, slots)) as admitted:
                    async for token, sid, row, decision in admitted:
                        if decision == "run":
                            tokens[sid] = token
                            await submit(row, sid)
                        elif decision == "rescore":
                            assert run.previous is not None
                            run.rescored += 1
                            rescoring.start_soon(rescore_one, run.previous.load(sid), token)
                        else:
                            assert run.previous is not None
                            slots.release_on_behalf_of(token)
                            run.reused += 1
                            run.record(run.previous.load(sid), reused=True)
            except Exception as e:
                failed.append(e)
                rescoring.cancel_scope.cancel()
        if failed:
            raise failed[0]

    await executor.run(run_cfg, feed, record)


async def admitted_rows(
    run: _Run, dataset: Dataset, slots: trio.CapacityLimiter
) -> AsyncGenerator[tuple[object, str, Row, Decision], None]:
    """The dataset's rows (up to max_samples), each admitted once a slot is free: yields the
    token the slot is held for (the caller releases it when the row is done), the sample id,
    the row and what resume decided for it (run it, re-score its record or reuse it)."""
    config = run.config
    rows = _Rows(dataset)
    index = 0
    limit = config.max_samples * config.epochs if config.max_samples is not None else None
    while limit is None or index < limit:
        token = object()
        await slots.acquire_on_behalf_of(token)
        try:
            row = await rows.next()
            if row is _END:
                slots.release_on_behalf_of(token)
                return
            sid = run.admit(row, index)
            index += 1
            decision: Decision = "run"
            if run.previous is not None and run.previous.needs_messages(sid, row):
                decision = run.previous.decide(sid, row, await _prepared_hash(config, row))
        except BaseException:
            slots.release_on_behalf_of(token)
            raise
        yield token, sid, row, decision


async def evaluate(
    dataset: Dataset,
    config: EvalConfig,
    *,
    executor: Executor | None = None,
) -> EvalReport:
    """Evaluate every row of `dataset` (any iterable or async iterable of dicts, read lazily).

    Returns an EvalReport with samples in dataset order. See the module docstring for
    concurrency, failure isolation, persistence and resume.

    `executor` runs the samples (rollouts.eval.executor); by default `InProcess()`, in this
    process. `executor=WorkerPool(N)` (rollouts.service.eval_workers) runs them in N worker
    processes on this machine, through an embedded queue database, with the same output
    directory, resume and report (its callables must then be importable by reference, or built
    in each worker by its `worker_config`)."""
    started_at, t0 = now_iso(), time.perf_counter()
    executor = executor if executor is not None else InProcess()
    config = config.named(_previous_name(config))  # (by task, model and time unless given or resumed)
    executor.prepare(config)  # (refuses what cannot run there before any file is written)
    run_cfg = with_limiters(config)
    run_cfg.fingerprint  # noqa: B018 (computed once, before any sample: it reads source files)
    output = _open(config)
    out, log = (output.path, output.log) if output is not None else (None, None)
    previous = output.previous if output is not None else None
    length = _dataset_len(dataset, config.max_samples)
    if config.epochs > 1:
        dataset = epoch_rows(dataset, config.epochs, config.max_samples)
        length = length * config.epochs if length is not None else None
    progress = ProgressBar(
        length,
        enabled=None if config.show_progress else False,
        label=config.eval_name or "eval",
    )
    keep = config.keeps_samples
    run = _Run(config, out, progress, log, previous, None if keep else SummaryBuilder(), results={} if keep else None)
    run.epochs = epoch_reducer(config)

    async def run_samples() -> None:
        try:
            await _feed(run, dataset, run_cfg, executor)
        except Exception as e:  # the dataset is broken, a resume mismatch, an AuthenticationError: stop
            run.fatal.append(e)

    @trio.lowlevel.enable_ki_protection
    def finish(status: ReportStatus, error: str | None) -> EvalReport:
        # Synchronous (no checkpoint, so cancellation cannot interrupt it) and protected from a
        # second Ctrl-C: report.json is always written, atomically.
        progress.close()
        try:
            if log is not None:
                log.close()
            report = run.report(status, error, started_at, t0)
            if out is not None:
                data = report.to_dict(include_ids=False)
                data["sample_ids"] = StreamedList(report.ids)  # (written one by one: flat at 100,000 rows)
                write_json_atomic(out / REPORT_FILE, data)
                if run.epochs is not None:
                    write_epochs(out, run.epochs)
        finally:
            if output is not None:
                output.lock.release()  # the directory's last write is done
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
        if run.fatal:
            raise run.fatal[0]
        status = "completed"
    except BaseException as e:
        if _is_cancellation(e):
            status = "cancelled"
        else:
            error = error_text("evaluate", e)
        raise
    finally:
        report = finish(status, error)
    return report
