"""A batch through every fault at once, on PostgreSQL (issue 25, defect 4): the database
restarts, a worker is SIGKILLed, a `serve` is SIGKILLed, and no process is restarted by hand;
every task ends exactly once."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections import Counter
from typing import Any

import trio
from test_service_e2e import (
    allow,
    endpoint,
    provider_key,  # noqa: F401  (the autouse fixture: the provider key and the policy file)
    tasks,
)
from test_service_serve import _children, _drain, _gone, _serve_cli

from rollouts.service import accounts
from rollouts.service.client import ServiceClient
from rollouts.service.store import Store
from rollouts.service.testing import TemporaryPostgres
from rollouts.testing import RecordedRequest, open_fake_server


class _Slow:
    """Answers `<answer>N</answer>` for `q N` after `latency_s` (so the batch is still running
    when the faults come); counts calls per message."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.calls: Counter[str] = Counter()

    async def __call__(self, request: RecordedRequest) -> Any:
        msg = request.json["messages"][-1]["content"]
        self.calls[msg] += 1
        await trio.sleep(self.latency_s)
        return f"The answer is <answer>{msg.split()[-1]}</answer>"


async def _finished(store: Store, batch_id: str, at_least: int) -> None:
    """Return once `at_least` of the batch's tasks are finished (the store rides out outages)."""
    while True:
        row = await store.read(
            lambda tx: tx.one("SELECT COUNT(*) FROM tasks WHERE batch_id = ? AND finished_at IS NOT NULL", (batch_id,))
        )
        if row is not None and row[0] >= at_least:
            return
        await trio.sleep(0.1)


async def test_a_batch_survives_a_database_restart_a_worker_sigkill_and_a_serve_sigkill(
    nursery: trio.Nursery,
) -> None:
    root = tempfile.mkdtemp(prefix="rollouts-pg-faults-")  # (under /tmp: the postgres user must reach it)
    pg = TemporaryPostgres(root).start()
    provider = _Slow(0.4)
    try:
        async with open_fake_server(provider) as srv:
            allow(srv.base_url)
            store = await Store.open(pg.url)
            _, token = await store.call(accounts.create_token, "main")
            a, _, log_a = await _serve_cli(pg.url, 1, "--worker-lease", "3")
            b, url_b, log_b = await _serve_cli(pg.url, 1, "--worker-lease", "3")
            nursery.start_soon(_drain, a, log_a)
            nursery.start_soon(_drain, b, log_b)
            client = ServiceClient(url_b, token, reconnect_s=120)
            try:
                agent = await client.create_agent("calc", endpoint(srv.base_url), system_prompt="Be brief.")
                batch = await client.create_batch(
                    agent["agent_id"], tasks(200), config={"parallelism": 200, "score": "exact_match_tag"}
                )
                bid = batch["batch_id"]
                with trio.fail_after(300):
                    await _finished(store, bid, 20)
                    victim = next(iter(_children(a.pid)))  # a worker SIGKILLed (serve restarts it)
                    os.kill(victim, signal.SIGKILL)
                    await _gone(victim)
                    await _finished(store, bid, 60)
                    await trio.to_thread.run_sync(pg.stop, "fast")  # the database restarts: 3 s down
                    await trio.sleep(3.0)
                    await trio.to_thread.run_sync(pg.restart_stopped)
                    await _finished(store, bid, 110)
                    a_workers = _children(a.pid)
                    a.kill()  # serve SIGKILLed: its worker sees its stdin close, puts its tasks back
                    await a.wait()
                    for pid in a_workers:
                        await _gone(pid)
                    done = await client.wait_batch(bid)
                rows = await store.read(
                    lambda tx: tx.execute("SELECT task_id, status, finished_at FROM tasks WHERE batch_id = ?", (bid,))
                )
                assert b.returncode is None  # serve B rode the outage out
            finally:
                await client.aclose()
                for proc in (a, b):
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
                store.close()
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)
    logs = "".join(log_a + log_b)
    assert done["status"] == "completed", logs[-3000:]
    results = done["results"]
    assert sorted(r["task_id"] for r in results) == sorted(f"t{i}" for i in range(200))  # each once
    assert all(r["status"] == "completed" and r["score"]["reward"] == 1.0 for r in results), [
        (r["task_id"], r["status"], r["error"]) for r in results if r["status"] != "completed"
    ]
    for r in results:  # each result is its own task's
        user = next(m for m in r["trajectory"]["messages"] if m["role"] == "user")["content"]
        assert user == f"q {r['task_id'][1:]}"
    assert len(rows) == 200 and all(status == "completed" and at is not None for _, status, at in rows)
    assert set(provider.calls) == {f"q {i}" for i in range(200)}  # (some ran twice: their workers died)
    assert "database is unreachable" in logs  # (the outage was seen, and ridden out)
