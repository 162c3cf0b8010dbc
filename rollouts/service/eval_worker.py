"""A worker process of evaluate()'s WorkerPool (see rollouts.service.eval_workers): started by the
parent as `python -m rollouts.service.eval_worker`, it reads its WorkerPayload from stdin,
rebuilds the EvalConfig, and runs the service's Worker loop (claim under a lease, heartbeats,
idempotent results) with `evaluate_sample` as the task. It stops when its stdin closes (the
parent is done, interrupted or gone), putting the tasks it holds back in the queue.

SIGINT is ignored (Ctrl-C in a terminal reaches the whole process group; the parent handles
it). Exit status: 0 stopped by the parent; 3 the config could not be built (the message is on
stderr; the parent reports it instead of restarting the worker).
"""

from __future__ import annotations

import functools
import io
import os
import pickle
import signal
import struct
import sys
import time
import traceback
from dataclasses import replace
from typing import Any, cast

import trio
import trio.lowlevel

from rollouts.errors import AuthenticationError
from rollouts.eval.config import EvalConfig
from rollouts.eval.executor import with_limiters
from rollouts.eval.run_sample import evaluate_sample
from rollouts.service.eval_workers import CONFIG_ERROR_EXIT, ERROR_PREFIX, WorkerPayload
from rollouts.service.execution import TaskOutcome
from rollouts.service.queue import ClaimedTask
from rollouts.service.store import Store
from rollouts.service.worker import Worker

__all__ = ["main", "run_sample"]


async def run_sample(config: EvalConfig, task: ClaimedTask, deadline: float) -> TaskOutcome:
    """A Worker's `run_task`: the claimed row through `evaluate_sample` with `config` (its own
    time limit, sample_timeout_s; the local batch has no deadline); the result holds the
    Sample's JSON."""
    started = time.perf_counter()
    try:
        sample = await evaluate_sample(task.input, task.task_id, config)
    except AuthenticationError as e:  # every sample would fail: the parent stops the evaluation
        ms = int((time.perf_counter() - started) * 1000)
        return TaskOutcome("completed", {"auth_error": str(e)}, None, ms)
    ms = int((time.perf_counter() - started) * 1000)
    return TaskOutcome("completed", {"sample": sample.to_dict()}, None, ms)


def _tell_parent(count: int) -> None:
    os.write(1, b".")  # outcomes were written: the parent collects them (a pipe it keeps reading)


def _read_exactly(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError("the parent closed stdin before sending the worker's payload")
        data += chunk
    return data


def _build_config(payload: WorkerPayload) -> EvalConfig:
    loaded = pickle.loads(payload.config)
    config = loaded() if payload.is_factory else loaded
    if not isinstance(config, EvalConfig):
        raise TypeError(f"worker_config must return an EvalConfig, got {type(config).__name__}")
    from rollouts.service.eval_workers import _picklable_config

    config = _picklable_config(config)
    got = config.fingerprint.to_dict()
    if got != payload.fingerprint:
        differs = sorted(k for k in got if got[k] != payload.fingerprint.get(k))
        raise ValueError(
            f"the EvalConfig built in the worker differs from the parent's in {', '.join(differs)}: "
            "worker_config must build the same config"
        )
    return replace(with_limiters(config), max_concurrent=payload.concurrency)


async def _work(payload: WorkerPayload, config: EvalConfig) -> None:
    store = await Store.open(payload.db_path, max_connections=4)
    try:
        worker = Worker(
            store,
            run_task=functools.partial(run_sample, config),
            on_recorded=_tell_parent,
            concurrency=payload.concurrency,
            worker_id=payload.worker_id,
            lease_s=payload.lease_s,
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.run)
            # a byte on stdin: tasks were queued; end of stdin: the parent wants us to stop (or is gone)
            stdin = cast(io.BufferedReader, sys.stdin.buffer)
            while await trio.to_thread.run_sync(stdin.read1, 4096, abandon_on_cancel=True):
                worker.wake()
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def main() -> int:
    """The worker process's entry point."""
    # Ctrl-C in a terminal reaches the whole process group: the parent handles it and stops
    # the workers by closing their stdin (they put their tasks back and write what finished).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        (size,) = struct.unpack(">Q", _read_exactly(sys.stdin.buffer, 8))
        payload: WorkerPayload = pickle.loads(_read_exactly(sys.stdin.buffer, size))
        for entry in reversed(payload.sys_path):  # the parent's imports resolve the same way here
            if entry not in sys.path:
                sys.path.insert(0, entry)
        config = _build_config(payload)
    except EOFError:
        return 0
    except Exception as e:
        traceback.print_exc()
        print(f"{ERROR_PREFIX}{type(e).__name__}: {e}", file=sys.stderr)
        return CONFIG_ERROR_EXIT
    trio.run(_work, payload, config)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is recorded and closed: skip the interpreter's teardown (modules, GC), which
    # takes most of a second on a loaded machine and delays the parent's return.
    os._exit(code)
