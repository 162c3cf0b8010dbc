"""`rollouts service serve` as a process: the address it prints, how it stops, what it leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx2
import trio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from test_service_e2e import (
    _env,
    free_port,
    provider_key,  # noqa: F401  (the autouse fixture: the provider key and the policy file)
    service,
    tasks,
)

from rollouts.service.server import serve
from rollouts.view.server import serve as view_serve


async def test_ui_without_a_trailing_slash_redirects_to_the_ui(db_url: str, nursery: trio.Nursery) -> None:
    """Issue 33, item 11: `http://127.0.0.1:8321/ui`, the address serve prints, was a JSON 404."""
    url = await nursery.start(lambda task_status: serve(db_url, port=0, gepa_jobs=False, task_status=task_status))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/ui")
        assert (r.status_code, r.headers["location"]) == (307, "/ui/")
        r = await client.get("/ui?next=x")
        assert r.headers["location"] == "/ui/?next=x"
        r = await client.get("/ui", follow_redirects=True)
        assert r.status_code == 200 and str(r.url).endswith("/ui/login")


async def test_serve_on_an_ipv6_address_with_or_without_brackets(db_url: str, nursery: trio.Nursery) -> None:
    """Issue 32 item 5: the service and the viewer built hypercorn's config each their own way
    (only the viewer's put an IPv6 host in brackets); one builder now, view.server.hypercorn_config,
    and both serve an IPv6 host written either way."""
    for host in ("::1", "[::1]"):
        url = await nursery.start(
            lambda task_status, host=host: serve(
                db_url, host=host, port=0, gepa_jobs=False, ui=False, task_status=task_status
            )
        )
        assert url.startswith("http://[::1]:")
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.get("/v1/health")
            assert r.status_code == 200 and r.json()["status"] == "ok"
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("viewer"))])
    for host in ("::1", "[::1]"):
        url = await nursery.start(lambda task_status, host=host: view_serve(app, host, 0, task_status=task_status))
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            assert (await client.get("/")).text == "viewer"


# ---- stopping: SIGTERM, SIGKILL ------------------------------------------------------------------


def _children(pid: int) -> set[int]:
    """The processes whose parent is `pid`."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


async def _gone(pid: int) -> None:
    """Return when process `pid` (not our child) has exited: its pidfd becomes readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


async def _serve_cli(db_url: str, workers: int, *extra: str) -> tuple[trio.Process, str, list[str]]:
    """`rollouts service serve --workers N` in a process; returns once it listens and its N
    workers are ready (their lines on its stderr, which they share), with its URL and log."""
    port = free_port()
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "rollouts.cli", "service", "serve", "--port", str(port), "--workers", str(workers),
         "--worker-concurrency", "2", "--no-ui", *extra],
        env=_env(db_url), stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    seen = ""
    with trio.fail_after(120):
        while seen.count(" ready (") < workers or "listening on" not in seen:
            chunk = await proc.stderr.receive_some()
            assert chunk, f"serve exited: {seen}"
            seen += chunk.decode(errors="replace")
    return proc, f"http://127.0.0.1:{port}", [seen]


async def _drain(proc: trio.Process, log: list[str]) -> None:
    assert proc.stderr is not None
    while chunk := await proc.stderr.receive_some():
        log.append(chunk.decode(errors="replace"))


async def test_sigterm_stops_serve_and_its_workers_which_put_their_tasks_back(
    db_url: str, nursery: trio.Nursery
) -> None:
    """Issue 25, defect 10: after `kill -TERM` (systemd's and Docker's stop) the --workers
    children lived on with parent PID 1, and a restarted serve started N more."""
    async with service(db_url, workers=0) as svc:
        svc.provider.gates["q 0"] = trio.Event()
        agent_id = await svc.agent()
        proc, _, log = await _serve_cli(db_url, 1)
        nursery.start_soon(_drain, proc, log)
        workers = _children(proc.pid)
        assert len(workers) == 1
        batch = await svc.client.create_batch(agent_id, tasks(1))
        await svc.provider.arrived("q 0").wait()  # the worker is running the task
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            code = await proc.wait()
            for pid in workers:
                await _gone(pid)
        assert code == 0, "".join(log)
        row = await svc.store.read(
            lambda tx: tx.one(
                "SELECT status, lease_owner, attempts FROM tasks WHERE batch_id = ?", (batch["batch_id"],)
            )
        )
        assert row == ("queued", None, 0)  # put back, not lost and not counted as an attempt
        assert "SIGTERM, stopping" in "".join(log)


async def test_serve_killed_with_sigkill_takes_its_workers_along(db_url: str, nursery: trio.Nursery) -> None:
    """Issue 25, defect 10: after SIGKILL the workers notice that their parent is gone (their
    stdin is a pipe only serve held) and exit."""
    async with service(db_url, workers=0):
        proc, _, log = await _serve_cli(db_url, 2)
        nursery.start_soon(_drain, proc, log)
        workers = _children(proc.pid)
        assert len(workers) == 2
        proc.kill()
        await proc.wait()
        with trio.fail_after(60):
            for pid in workers:
                await _gone(pid)
        assert "parent process is gone" in "".join(log)
