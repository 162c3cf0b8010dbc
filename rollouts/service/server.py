"""`serve()`: the API under hypercorn's trio worker, plus (optionally) local worker processes,
the lease sweeper and the GEPA job runner, in one trio run.

    await serve(db_url, host="127.0.0.1", port=8321, workers=2)

Worker processes are `python -m rollouts.cli service worker`, given the database URL through the
environment (`ROLLOUTS_SERVICE_DB`, never the command line, which other users can read); a
worker process that exits is restarted, always (a task that crashes it is failed by the queue after its
attempts; serve itself never stops because a worker did). Cancelling `serve` (the CLI does on
SIGTERM) stops the workers with SIGTERM: they put their running tasks back and exit. A worker
also stops when serve dies without stopping it (SIGKILL): its stdin is a pipe only serve holds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import trio

from rollouts.service import queue
from rollouts.service.api import ApiLimits, create_app
from rollouts.service.policy import POLICY_ENV, ServicePolicy
from rollouts.service.progress import BatchChanges
from rollouts.service.store import Store

__all__ = ["DB_ENV", "serve", "worker_command"]

DB_ENV = "ROLLOUTS_SERVICE_DB"
_log = logging.getLogger("rollouts.service.server")


def worker_command(concurrency: int, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "rollouts.cli", "service", "worker", "--concurrency", str(concurrency), *extra]


async def _worker_process(
    db_url: str, concurrency: int, n: int, policy_file: str | None = None, lease_s: float | None = None
) -> None:
    """Run local worker `n`, restarting it whenever it exits (a task may crash it: the task's
    lease runs out and the sweep reruns it, then fails it after its attempts), after a pause
    that grows with the exits in a row (at most 30 s). Never raises for an exit: serve stays up."""
    env = {**os.environ, DB_ENV: db_url}
    if policy_file:
        env[POLICY_ENV] = policy_file  # (an absolute path: the CLI makes it one)
    # (--exit-with-parent: the worker stops when its stdin, a pipe only this process holds,
    # closes -- when serve dies, even by SIGKILL, the workers put their tasks back and exit)
    extra = ("--exit-with-parent", *(("--lease", str(lease_s)) if lease_s else ()))
    failures = 0
    while True:
        started = trio.current_time()
        proc = await trio.lowlevel.open_process(worker_command(concurrency, extra), env=env, stdin=subprocess.PIPE)
        try:
            code = await proc.wait()
        finally:
            if proc.returncode is None:  # serve is stopping: the worker puts its tasks back and exits
                with trio.CancelScope(shield=True):
                    proc.terminate()
                    with trio.move_on_after(10):
                        await proc.wait()
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
            if proc.stdin is not None:
                with trio.CancelScope(shield=True):
                    await proc.stdin.aclose()
        failures = failures + 1 if trio.current_time() - started < 60 else 1
        _log.warning("worker process %d exited with %s (%d in a row): restarting it", n, code, failures)
        await trio.sleep(min(0.25 * 2 ** min(failures - 1, 7), 30.0))


async def _sweeper(store: Store, every_s: float) -> None:
    while True:
        await store.call(queue.sweep)
        await trio.sleep(every_s)


def with_ui(api: Any, store: Store, jobs: Any, limits: ApiLimits, prefix: str = "/ui", live_poll_s: float = 1.0) -> Any:
    """The API with the web UI (rollouts.service.ui) mounted under `prefix`."""
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Mount, Route

    from rollouts.service.ui import create_ui

    async def to_ui(request: Any) -> Any:
        return RedirectResponse(f"{prefix}/batches", status_code=303)

    async def to_ui_root(request: Any) -> Any:
        # (`/ui`, the address serve prints, is not under the mount `/ui/`: the UI's root, query kept)
        query = request.url.query
        return RedirectResponse(f"{prefix}/" + (f"?{query}" if query else ""), status_code=307)

    ui_app = create_ui(store, gepa=jobs, prefix=prefix, max_tasks=limits.max_tasks, live_poll_s=live_poll_s)
    return Starlette(
        routes=[Route("/", to_ui), Route(prefix, to_ui_root), Mount(prefix, app=ui_app), Mount("", app=api)]
    )


async def serve(
    db_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8321,
    workers: int = 0,
    worker_concurrency: int = 16,
    limits: ApiLimits | None = None,
    gepa_jobs: bool = True,
    data_dir: str | None = None,
    job_lease_s: float = 30.0,
    ui: bool = True,
    policy_file: str | None = None,
    worker_lease_s: float | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. `task_status.started(url)` reports the bound address. GEPA jobs
    keep their run directories under `data_dir` (the engine's logs; the checkpoint is also in
    the database) and hold a lease of `job_lease_s` seconds. `ui` mounts the web UI (the viewer
    over this database, behind the same tokens) under /ui. `policy_file` is the operator's
    policy (rollouts.service.policy; default `$ROLLOUTS_SERVICE_POLICY`, else the built-in
    one), given to the local workers too, as is `worker_lease_s` (their task lease)."""
    from hypercorn.trio import serve as hypercorn_serve

    from rollouts.view.server import hypercorn_config

    policy = ServicePolicy.from_env(policy_file)
    store = await Store.open(db_url, max_connections=16)
    try:
        async with trio.open_nursery() as nursery:
            changes = BatchChanges(store)
            await nursery.start(changes.run)
            jobs: Any = None
            if gepa_jobs:
                from rollouts.service.gepa_jobs import GEPAJobs

                jobs = GEPAJobs(store, data_dir=data_dir, lease_s=job_lease_s, policy=policy, changes=changes)
                nursery.start_soon(jobs.run)
            app: Any = create_app(store, limits=limits, gepa=jobs, changes=changes, policy=policy)
            if ui:
                app = with_ui(app, store, jobs, limits or ApiLimits())
            # (errors are logged by the app, without request details)
            config = hypercorn_config(host, port, access_log=None, error_log=None)
            binds = await nursery.start(hypercorn_serve, app, config)
            nursery.start_soon(_sweeper, store, 5.0)
            for n in range(workers):
                nursery.start_soon(_worker_process, db_url, worker_concurrency, n, policy_file, worker_lease_s)
            task_status.started(binds[0])
    finally:
        store.close()
