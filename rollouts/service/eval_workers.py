"""`WorkerPool`, evaluate()'s executor over N worker processes on this machine, coordinated
through the service's queue on an embedded SQLite database. evaluate() keeps everything else
exactly as in-process (rollouts.eval.executor): rows are read and admitted in this (parent)
process, resume decisions (reuse, rescore) are made here, and every finished sample is recorded
here (samples.jsonl, summary, progress bar, on_sample_end, report.json). evaluate() never
imports this module: the caller hands the pool in.

    report = await evaluate(rows, config, executor=WorkerPool(4))

How it runs:
* The queue lives in `<output_dir>/.workers/queue.sqlite` (a temporary directory without an
  output_dir), with the workers' stderr logs next to it; the directory is deleted when
  evaluate() returns or raises, and a stale one (a parent killed with SIGKILL) is deleted at
  the start. samples.jsonl stays the one record of results: resume works as in-process.
* Rows the parent decides to run are inserted as tasks of one batch (JSON rows, at most
  `2 * max_concurrent` waiting or running at once, so a lazy dataset stays lazy). Each worker
  (rollouts.service.eval_worker) claims tasks under a lease, runs `evaluate_sample` on them,
  `ceil(max_concurrent / N)` at a time, and records each result idempotently
  (rollouts.service.queue.finish). The parent takes finished results out of the queue
  (queue.take_finished: DELETE ... RETURNING, so a late duplicate finish of a task finds
  nothing) and records them. Every task row is written by rollouts.service.queue.
* A worker process that dies (SIGKILL, a crash) is noticed by the parent at once (it waits on
  the process): the tasks it held go back in the queue and a new worker takes its place. A task
  whose worker died 3 times is recorded as failed, naming that. Leases (30 s, renewed by
  heartbeats) cover a worker that hangs without dying.
* Ctrl-C / cancellation: the workers are told to stop (their stdin is closed; they put their
  tasks back and exit), results already finished are recorded, the rest reruns on resume.

What crosses to the workers: the EvalConfig, pickled (through the worker's stdin: the API key
in the endpoint never touches the disk), so its callables (score_fn, prepare_messages,
environment_factory, run_config's handlers) must be importable by reference: module-level
functions or classes (`module:qualname`), or instances of module-level classes. Lambdas,
nested functions and functions of the `__main__` script are refused with an error naming the
callable. Alternatively `worker_config` is a picklable zero-argument callable (e.g.
`functools.partial(module_level_factory, args)`) that builds the EvalConfig in each worker; it
must give the same fingerprint as the parent's config (the CLI's `--workers` uses this).
Hooks: `on_sample_end` runs in the parent, as each sample is recorded; `on_sample_start` and
`on_sample_event` happen inside a running sample, in a worker, and are refused by the pool.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from rollouts.errors import AuthenticationError, ConfigurationError
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.executor import Feed, Record
from rollouts.eval.run_sample import finish_sample
from rollouts.eval.sample import Sample
from rollouts.service import queue
from rollouts.service.store import Store

__all__ = ["WORKERS_DIR", "WorkerPayload", "WorkerPool", "check_workers"]

WORKERS_DIR = ".workers"  # inside output_dir: the queue database and the workers' logs
QUEUE_FILE = "queue.sqlite"
ERROR_PREFIX = "rollouts worker error: "  # the last stderr line of a worker that could not start
CONFIG_ERROR_EXIT = 3  # a worker could not build its config: restarting it would not help
MAX_ATTEMPTS = 3  # a task whose worker died this many times is recorded as failed
_BATCH = "eval"  # the local batch (queue.create_local_batch)
_STOP_GRACE_S = 10.0  # how long a stopping worker may take to put its tasks back


@dataclass(frozen=True)
class WorkerPayload:
    """What a worker process receives on stdin (pickled, behind an 8-byte length)."""

    sys_path: tuple[str, ...]
    db_path: str
    worker_id: str
    concurrency: int
    lease_s: float
    config: bytes  # pickled EvalConfig, or pickled zero-argument callable building it
    is_factory: bool
    fingerprint: dict[str, Any]


# --------------------------------------------------------------------------------------------
# What may cross to the workers
# --------------------------------------------------------------------------------------------

_CALLABLE_FIELDS = ("score_fn", "prepare_messages", "environment_factory")


def _fix(field_name: str) -> str:
    return (
        f"with a WorkerPool, EvalConfig.{field_name} must be importable by reference: define it at module level "
        "in a module (not in the __main__ script, not a lambda or nested function), or pass "
        "WorkerPool(n, worker_config=functools.partial(module_level_factory, ...)) that builds the EvalConfig in "
        "each worker, or run the samples in this process (no WorkerPool)"
    )


def _reference_problem(obj: Any) -> str | None:
    """Why `obj` cannot be pickled by reference into another process (None: it can)."""
    if isinstance(obj, functools.partial):
        return _reference_problem(obj.func) or next(
            (p for p in (_reference_problem(a) for a in obj.args if callable(a)) if p), None
        )
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismethod(obj) else type(obj)
    target = getattr(target, "__func__", target)
    module = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", "")
    name = f"{module}:{qualname}"
    if "<lambda>" in qualname:
        return f"{name} is a lambda"
    if "<locals>" in qualname:
        return f"{name} is defined inside a function"
    if module == "__main__":
        return f"{name} is defined in the __main__ script, which worker processes do not import"
    try:
        pickle.dumps(obj)
    except Exception as e:
        return f"{name} cannot be pickled ({type(e).__name__}: {e})"
    return None


def _picklable_config(config: EvalConfig) -> EvalConfig:
    """`config` as a worker runs it: no hooks (on_sample_end runs in the parent), no output,
    no progress bar, no limiters (each worker makes its own)."""
    rc = config.run_config
    if rc is not None:
        rc = replace(rc, model_limiter=None, tool_limiter=None, cancel_scope=None)
    return replace(
        config,
        run_config=rc,
        on_sample_start=None,
        on_sample_event=None,
        on_sample_end=None,
        output_dir=None,
        show_progress=False,
        keep_samples=False,
        rescore=False,
        overwrite=False,
    )


def check_workers(config: EvalConfig, worker_config: Callable[[], EvalConfig] | None) -> tuple[bytes, bool]:
    """The pickled config (or config factory) the workers receive; ConfigurationError naming
    the callable and the fix when something cannot cross to another process."""
    for hook in ("on_sample_start", "on_sample_event"):
        if getattr(config, hook) is not None:
            raise ConfigurationError(
                f"EvalConfig.{hook} runs inside a sample, which with a WorkerPool runs in another process: "
                f"run the samples in this process (no WorkerPool) to keep {hook}, or use on_sample_end (it runs "
                "in this process with a WorkerPool)"
            )
    if worker_config is not None:
        problem = _reference_problem(worker_config)
        if problem is not None:
            raise ConfigurationError(
                f"WorkerPool(worker_config=...): {problem}; it must be a module-level function (or a "
                "functools.partial of one with picklable arguments) that returns the EvalConfig"
            )
        return pickle.dumps(worker_config), True
    for name in _CALLABLE_FIELDS:
        value = getattr(config, name)
        if value is None:
            continue
        problem = _reference_problem(value)
        if problem is not None:
            raise ConfigurationError(f"EvalConfig.{name}: {problem}; {_fix(name)}")
    try:
        return pickle.dumps(_picklable_config(config)), False
    except Exception as e:
        raise ConfigurationError(
            f"EvalConfig cannot be sent to worker processes ({type(e).__name__}: {e}); "
            f"{_fix('run_config (its handlers)')}"
        ) from None


# --------------------------------------------------------------------------------------------
# Worker processes
# --------------------------------------------------------------------------------------------


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return text[-limit:].strip()


@dataclass
class _Pool:
    """The worker processes: started, watched (a dead one is replaced), stopped."""

    directory: Path
    store: Store
    payload: WorkerPayload
    workers: int
    fatal: Callable[[BaseException], None]
    procs: dict[int, trio.Process] = field(default_factory=dict)
    ready: dict[int, trio.Process] = field(default_factory=dict)  # payload sent: may be woken
    results: trio.Event = field(default_factory=trio.Event)  # a worker recorded a result
    stopping: bool = False
    restarts: int = 0
    generations: dict[int, int] = field(default_factory=dict)

    def wake(self) -> None:
        """Tell the workers that tasks arrived (a byte on their stdin: SQLite has no NOTIFY)."""
        for proc in list(self.ready.values()):
            assert proc.stdin is not None
            try:
                # (synchronous on the non-blocking pipe, which the worker keeps reading)
                os.write(proc.stdin.fileno(), b".")  # type: ignore[attr-defined]
            except (BlockingIOError, BrokenPipeError, OSError, ValueError):
                pass  # full (it has wake-ups pending anyway), or it died: watch() sees it

    async def _signals(self, proc: trio.Process) -> None:
        """Each byte a worker writes on stdout means "results recorded": wake the collector."""
        assert proc.stdout is not None
        while await proc.stdout.receive_some(4096):
            self.results.set()

    async def _start(self, slot: int, nursery: trio.Nursery) -> tuple[trio.Process, str, Path]:
        gen = self.generations.get(slot, 0)
        self.generations[slot] = gen + 1
        worker_id = f"eval-{os.getpid()}-{slot}-{gen}"
        log = self.directory / f"worker-{slot}.log"
        with log.open("ab") as stderr:
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "rollouts.service.eval_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
            )
        self.procs[slot] = proc
        self.ready.pop(slot, None)
        nursery.start_soon(self._signals, proc)
        data = pickle.dumps(replace(self.payload, worker_id=worker_id))
        assert proc.stdin is not None
        try:
            await proc.stdin.send_all(struct.pack(">Q", len(data)) + data)
        except trio.BrokenResourceError:
            pass  # it died at once: watch() sees it
        self.ready[slot] = proc
        return proc, worker_id, log

    async def watch(
        self, slot: int, nursery: trio.Nursery, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run a worker in `slot`, replacing it each time it dies (bounded), until stopped."""
        proc, worker_id, log = await self._start(slot, nursery)
        task_status.started()
        while True:
            code = await proc.wait()
            if self.stopping:
                return
            how = _how_it_ended(code)
            if code == CONFIG_ERROR_EXIT:
                tail = _log_tail(log)
                said = [line for line in tail.splitlines() if line.startswith(ERROR_PREFIX)]
                reason = said[-1][len(ERROR_PREFIX) :] if said else tail
                self.fatal(ConfigurationError(f"a worker process could not build its EvalConfig: {reason}"))
                return
            await self.store.call(queue.requeue_lost, worker_id, how, MAX_ATTEMPTS)
            self.restarts += 1
            if self.restarts > 3 * self.workers:
                self.fatal(
                    RuntimeError(
                        f"WorkerPool({self.workers}): worker processes keep dying ({self.restarts} times, last: "
                        f"{how}); the last one's stderr ({log}): {_log_tail(log)}"
                    )
                )
                return
            proc, worker_id, log = await self._start(slot, nursery)
            self.wake()  # the dead one's tasks are queued again

    async def stop(self) -> None:
        """Tell every worker to stop (close its stdin), wait for it (bounded), then kill it.
        Shielded: runs to the end even when the evaluation is cancelled."""
        self.stopping = True
        self.ready.clear()
        with trio.CancelScope(shield=True):
            for proc in self.procs.values():
                if proc.stdin is not None:
                    with trio.move_on_after(1):
                        await proc.stdin.aclose()
            for proc in self.procs.values():
                with trio.move_on_after(_STOP_GRACE_S):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


# --------------------------------------------------------------------------------------------
# The parent's loop
# --------------------------------------------------------------------------------------------


def _queue_dir(config: EvalConfig) -> Path:
    """The directory for the queue and logs (a stale one removed)."""
    if config.output_dir is None:
        return Path(tempfile.mkdtemp(prefix="rollouts-eval-workers-"))
    directory = Path(config.output_dir) / WORKERS_DIR
    if directory.exists():
        shutil.rmtree(directory)  # left by a parent that was killed: samples.jsonl says what is done
    directory.mkdir(parents=True)
    return directory


def _row_json(row: Row, sid: str) -> str:
    try:
        return json.dumps(dict(row), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigurationError(
            f"row {sid!r}: with a WorkerPool rows go to the worker processes as JSON, and this one is not "
            f"JSON ({e}); convert its values to JSON types, or run the samples in this process (no WorkerPool)"
        ) from None


def _sample_of(config: EvalConfig, task: queue.FinishedTask) -> Sample:
    if task.status == "completed" and task.result:
        data = json.loads(task.result)
        if "auth_error" in data:
            raise AuthenticationError(data["auth_error"])
        return Sample.from_dict(data["sample"])
    return Sample(
        id=task.task_id,
        input=json.loads(task.input),
        status="failed",
        error=task.error or f"the task ended {task.status} in the worker queue",
        fingerprint=config.fingerprint.to_dict(),
    )


@dataclass(frozen=True)
class WorkerPool:
    """evaluate()'s executor over `workers` worker processes on this machine (see the module
    docstring); `worker_config`, a picklable zero-argument callable, builds the EvalConfig in
    each worker instead of receiving it pickled.

        report = await evaluate(rows, config, executor=WorkerPool(4))
    """

    workers: int
    worker_config: Callable[[], EvalConfig] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1:
            raise ConfigurationError(f"WorkerPool: workers must be an integer >= 1, got {self.workers!r}")

    def prepare(self, config: EvalConfig) -> None:
        """ConfigurationError naming the callable and the fix when something cannot cross to
        another process (before evaluate() writes anything)."""
        check_workers(config, self.worker_config)

    def capacity(self, config: EvalConfig) -> int:
        return 2 * config.max_concurrent  # (queued rows waiting for a free worker slot)

    async def run(self, config: EvalConfig, feed: Feed, record: Record) -> None:
        """Start the workers, queue what `feed` submits, record what they finish; stop them."""
        config_bytes, is_factory = check_workers(config, self.worker_config)
        directory = _queue_dir(config)
        store: Store | None = None
        fatal: list[BaseException] = []
        try:
            store = await Store.open(str(directory / QUEUE_FILE), max_connections=4)
            await store.call(queue.create_local_batch, _BATCH, config.effective_max_turns)
            payload = WorkerPayload(
                sys_path=tuple(sys.path),
                db_path=str(directory / QUEUE_FILE),
                worker_id="",
                concurrency=max(1, math.ceil(config.max_concurrent / self.workers)),
                lease_s=30.0,
                config=config_bytes,
                is_factory=is_factory,
                fingerprint=config.fingerprint.to_dict(),
            )
            async with trio.open_nursery() as nursery:

                def stop_all(e: BaseException) -> None:
                    fatal.append(e)
                    nursery.cancel_scope.cancel()

                pool = _Pool(directory, store, payload, self.workers, stop_all)
                try:
                    for slot in range(self.workers):
                        await nursery.start(pool.watch, slot, nursery)
                    await _feed_and_collect(config, feed, record, store, pool)
                except Exception as e:  # (raised here, not through the nursery: no exception group)
                    fatal.append(e)
                finally:
                    await pool.stop()
                    nursery.cancel_scope.cancel()
            if fatal:
                raise fatal[0]
        finally:
            if store is not None:
                store.close()
            shutil.rmtree(directory, ignore_errors=True)


async def _feed_and_collect(config: EvalConfig, feed: Feed, record: Record, store: Store, pool: _Pool) -> None:
    """Queue the rows `feed` submits (in batches of up to 256 per transaction) and record the
    results the workers finish, until every submitted row is recorded."""
    outstanding: set[str] = set()  # submitted rows not yet recorded, by sample id
    send, receive = trio.open_memory_channel[tuple[str, int, str]](config.max_concurrent)
    fed = trio.Event()
    seq = 0

    async def deliver(sample: Sample) -> None:
        await record(await finish_sample(config, sample))  # (on_sample_end, in this process)
        outstanding.discard(sample.id)

    async def submit(row: Row, sample_id: str) -> None:
        nonlocal seq
        outstanding.add(sample_id)
        await send.send((sample_id, seq, _row_json(row, sample_id)))
        seq += 1

    async def feed_all() -> None:
        async with send:
            await feed(submit)
        fed.set()
        pool.results.set()  # (the collector re-checks whether anything is left)

    async def insert() -> None:
        async with receive:
            async for first in receive:
                batch = [first]
                while len(batch) < 256:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await store.call(queue.enqueue, _BATCH, batch)
                pool.wake()

    async def collect() -> None:
        while not (fed.is_set() and not outstanding):
            pool.results = signal = trio.Event()  # (before the query: no signal is missed)
            finished = await store.call(queue.take_finished, _BATCH)
            for task in finished:
                if task.task_id in outstanding:  # (always: a task is taken out of the queue once)
                    await deliver(_sample_of(config, task))
            if not finished:
                # a worker signals each result it records; the timeout covers tasks the
                # queue itself finishes (a worker lost MAX_ATTEMPTS times)
                with trio.move_on_after(1.0):
                    await signal.wait()

    errors: list[Exception] = []

    async def guarded(nursery: trio.Nursery, part: Callable[[], Awaitable[None]]) -> None:
        """`part`, its error ending the others and raised once, after the nursery (so an
        AuthenticationError or a bad row comes out as itself, not in an exception group)."""
        try:
            await part()
        except Exception as e:
            errors.append(e)
            nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(guarded, nursery, insert)
            nursery.start_soon(guarded, nursery, collect)
            await guarded(nursery, feed_all)
        if errors:
            raise errors[0]
    finally:
        if outstanding:  # cancelled or failed: keep what the workers finished before they stopped
            await pool.stop()
            with trio.CancelScope(shield=True) as drain:
                drain.deadline = trio.current_time() + _STOP_GRACE_S
                for task in await store.call(queue.take_finished, _BATCH):
                    if task.task_id not in outstanding or task.status != "completed":
                        continue
                    try:
                        sample = _sample_of(config, task)
                    except AuthenticationError:
                        continue
                    await deliver(sample)
