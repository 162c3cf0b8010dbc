"""The rollout service, end to end, on both databases: SQLite (embedded) and a real PostgreSQL
started here from the system's binaries (`apt-get install -y postgresql`; missing binaries fail
the run, they never skip it).

The provider is the fake server (rollouts.testing) on 127.0.0.1, reached by workers as an
OpenAI-compatible endpoint whose key they read from their own environment. Faults use separate
worker processes (`rollouts service worker`) and a separate API server process."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from rollouts.service import accounts, queue
from rollouts.service.api import ApiLimits
from rollouts.service.batch_tasks import BatchTasks
from rollouts.service.client import ServiceClient, ServiceError
from rollouts.service.policy import POLICY_ENV, ServicePolicy
from rollouts.service.server import DB_ENV, serve
from rollouts.service.store import Store
from rollouts.service.worker import Worker
from rollouts.testing import FakeTurn, RecordedRequest, http_error, open_fake_server

KEY_ENV = "ROLLOUTS_TEST_PROVIDER_KEY"
PROVIDER_KEY = "sk-test-" + secrets.token_hex(16)


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(KEY_ENV, PROVIDER_KEY)
    policy = tmp_path / "policy.toml"
    policy.write_text("")
    monkeypatch.setenv(POLICY_ENV, str(policy))  # (read by serve and every worker, here and in subprocesses)


def allow(base_url: str, extra: str = "") -> None:
    """The operator's policy: credential `fake` (the key in KEY_ENV) may be sent to the fake
    provider at `base_url` (and `extra` TOML)."""
    Path(os.environ[POLICY_ENV]).write_text(
        f'[credentials.fake]\nkey_env = "{KEY_ENV}"\nbase_urls = ["{base_url}"]\n{extra}'
    )


def new_worker(store: Store, **kw: Any) -> Worker:
    """A worker under the operator's policy (the file in $ROLLOUTS_SERVICE_POLICY)."""
    return Worker(store, run_task=BatchTasks(store, ServicePolicy.from_env()), **kw)


# ---- the fake provider --------------------------------------------------------------------------


class Provider:
    """Replies `The answer is <answer>X</answer>` to a user message ending in X; messages can be
    held at a gate, or answered with scripted errors first."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.keys: set[str] = set()
        self.gates: dict[str, trio.Event] = {}
        self.entered: dict[str, trio.Event] = {}
        self.errors: dict[str, list[FakeTurn]] = {}
        self.always_fail: set[str] = set()

    def arrived(self, msg: str) -> trio.Event:
        return self.entered.setdefault(msg, trio.Event())

    async def __call__(self, request: RecordedRequest) -> Any:
        msg = request.json["messages"][-1]["content"]
        self.calls[msg] += 1
        self.keys.add(request.headers.get("authorization", ""))
        self.arrived(msg).set()
        gate = self.gates.get(msg)
        if gate is not None:
            await gate.wait()
        if msg in self.always_fail:
            return http_error(500, retry_after=0.01)
        errors = self.errors.get(msg, [])
        if self.calls[msg] <= len(errors):
            return errors[self.calls[msg] - 1]
        return f"The answer is <answer>{msg.split()[-1]}</answer>"

    def release_all(self) -> None:
        for gate in self.gates.values():
            gate.set()


def endpoint(base_url: str, **over: Any) -> dict[str, Any]:
    return {
        "model": "openai-compatible/fake",
        "api_base": base_url,
        "credential": "fake",
        "max_retries": 3,
        "transport": "http",
        **over,
    }


def tasks(n: int, prefix: str = "q") -> list[dict[str, Any]]:
    return [{"task_id": f"t{i}", "user_message": f"{prefix} {i}", "context": {"answer": str(i)}} for i in range(n)]


class Service:
    def __init__(self, url: str, db_url: str, store: Store, token: str, srv: Any, provider: Provider) -> None:
        self.url, self.db_url, self.store, self.token, self.srv, self.provider = (
            url,
            db_url,
            store,
            token,
            srv,
            provider,
        )
        self.client = ServiceClient(url, token, reconnect_s=60)

    async def agent(self, **over: Any) -> str:
        agent = await self.client.create_agent("calc", endpoint(self.srv.base_url, **over), system_prompt="Be brief.")
        return str(agent["agent_id"])


@asynccontextmanager
async def service(
    db_url: str, *, workers: int = 1, limits: ApiLimits | None = None, lease_s: float = 30.0, policy: str = ""
) -> AsyncIterator[Service]:
    """The API in this process and `workers` workers; `policy` is TOML added to the operator's
    policy (which lets credential `fake` reach the fake provider)."""
    provider = Provider()
    async with open_fake_server(provider) as srv, trio.open_nursery() as nursery:
        allow(srv.base_url, policy)
        url = await nursery.start(
            lambda task_status: serve(db_url, port=0, limits=limits, job_lease_s=lease_s, task_status=task_status)
        )
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "main")
        for _ in range(workers):
            await nursery.start(new_worker(store, concurrency=8, lease_s=lease_s, max_poll_s=0.2).run)
        svc = Service(url, db_url, store, token, srv, provider)
        try:
            yield svc
        finally:
            provider.release_all()
            await svc.client.aclose()
            nursery.cancel_scope.cancel()
            store.close()


# ---- processes ----------------------------------------------------------------------------------


def _env(db_url: str) -> dict[str, str]:
    return {**os.environ, DB_ENV: db_url, KEY_ENV: PROVIDER_KEY, "PYTHONUNBUFFERED": "1"}


async def worker_process(db_url: str, log: Path, *, lease_s: float, concurrency: int = 4) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "rollouts.cli", "service", "worker", "--concurrency", str(concurrency), "--lease", str(lease_s)],
        env=_env(db_url),
        stderr=log.open("ab"),
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def api_process(db_url: str, port: int, log: Path, extra: list[str] | None = None) -> trio.Process:
    """`rollouts service serve` in another process (clients retry until it accepts connections)."""
    return await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "rollouts.cli",
            "service",
            "serve",
            "--port",
            str(port),
            "--workers",
            "0",
            *(extra or []),
        ],
        env=_env(db_url),
        stderr=log.open("ab"),
    )


async def kill(proc: trio.Process) -> None:
    proc.send_signal(signal.SIGKILL)
    await proc.wait()


# ---- the basics ---------------------------------------------------------------------------------


async def test_batch_runs_scores_and_streams_progress(db_url: str) -> None:
    async with service(db_url) as svc:
        agent_id = await svc.agent()
        created = await svc.client.create_batch(agent_id, tasks(5), config={"score": "exact_match_tag"})
        assert created["status"] == "queued" and created["task_count"] == 5
        events = [e async for e, _ in svc.client.events(f"/v1/batches/{created['batch_id']}/events")]
        assert events[-1] == "done"
        batch = await svc.client.batch_results(created["batch_id"], page=2)
        assert batch["status"] == "completed"
        assert batch["progress"] == {
            "total": 5,
            "completed": 5,
            "failed": 0,
            "timeout": 0,
            "cancelled": 0,
            "pending": 0,
        }
        assert [r["task_id"] for r in batch["results"]] == [f"t{i}" for i in range(5)]
        for r in batch["results"]:
            assert r["score"]["reward"] == 1.0
            messages = r["trajectory"]["messages"]
            assert messages[0] == {"role": "system", "content": "Be brief."}
            assert messages[-1]["role"] == "assistant"
            assert r["execution_time_ms"] >= 0 and r["attempts"] == 1
        assert batch["completed_at"] is not None
        assert svc.provider.keys == {f"Bearer {PROVIDER_KEY}"}  # the key came from the worker's environment


async def test_serve_runs_local_worker_processes(db_url: str) -> None:
    provider = Provider()
    async with open_fake_server(provider) as srv, trio.open_nursery() as nursery:
        allow(srv.base_url)
        url = await nursery.start(
            lambda task_status: serve(db_url, port=0, workers=2, worker_concurrency=2, task_status=task_status)
        )
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "main")
        async with ServiceClient(url, token) as client:
            agent = await client.create_agent("calc", endpoint(srv.base_url))
            batch = await client.create_batch(agent["agent_id"], tasks(6), config={"score": "exact_match_tag"})
            done = await client.wait_batch(batch["batch_id"])
        owners = await store.read(lambda tx: tx.execute("SELECT DISTINCT lease_owner FROM tasks"))
        store.close()
        nursery.cancel_scope.cancel()
    assert done["status"] == "completed" and [r["score"]["reward"] for r in done["results"]] == [1.0] * 6
    assert owners == [(None,)]  # (leases are cleared when a result is recorded)
    assert f"Bearer {PROVIDER_KEY}" in provider.keys  # read by the worker processes from their environment


async def test_agent_versions_and_batch_system_prompt(db_url: str) -> None:
    async with service(db_url) as svc:
        agent_id = await svc.agent()
        v2 = await svc.client.create_version(agent_id, system_prompt="Version two.", tags=["b"])
        assert v2["version"] == 2 and v2["parent_version"] == 1 and not v2["active"]
        assert (await svc.client.get_agent(agent_id))["active_version"] == 1
        assert (await svc.client.promote(agent_id, 2))["active"]
        batch = await svc.client.create_batch(agent_id, tasks(1))
        done = await svc.client.wait_batch(batch["batch_id"])
        assert done["results"][0]["trajectory"]["messages"][0]["content"] == "Version two."
        batch = await svc.client.create_batch(agent_id, tasks(1), system_prompt="Override.", agent_version=1)
        done = await svc.client.wait_batch(batch["batch_id"])
        assert done["results"][0]["trajectory"]["messages"][0]["content"] == "Override."
        assert [v["version"] for v in await svc.client.list_versions(agent_id)] == [1, 2]


async def test_idempotency_key_returns_the_same_batch(db_url: str) -> None:
    async with service(db_url, workers=0) as svc:
        agent_id = await svc.agent()
        a = await svc.client.create_batch(agent_id, tasks(2), idempotency_key="k1")
        b = await svc.client.create_batch(agent_id, tasks(2), idempotency_key="k1")
        assert a["batch_id"] == b["batch_id"]


async def test_concurrent_requests_with_one_idempotency_key_make_one_batch(db_url: str) -> None:
    store = await Store.open(db_url)
    try:
        ws = await store.call(accounts.ensure_workspace, "w")
        agent = await store.call(accounts.create_agent, ws, "a", accounts.VersionSpec({"model": "openai/x"}))
        made: list[tuple[dict[str, Any], bool]] = []

        async def create() -> None:
            made.append(
                await store.call(
                    queue.create_batch, workspace_id=ws, agent_id=agent["agent_id"], agent_version=1,
                    system_prompt="", tasks=[("t", {"user_message": "hi"})], config={}, parallelism=1,
                    timeout_per_task_ms=1000, deadline_s=60, idempotency_key="same",
                )
            )  # fmt: skip

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(create)
        assert len({m[0]["batch_id"] for m in made}) == 1
        assert sorted(created for _, created in made) == [False] * 7 + [True]
        count = await store.read(lambda tx: tx.one("SELECT COUNT(*) FROM tasks"))
        assert count == (1,)
    finally:
        store.close()


async def _queue_batch(store: Store, task_ids: list[str], parallelism: int) -> tuple[str, str]:
    """(workspace id, batch id) of a new batch of `task_ids` (user_message: the id's number) in
    workspace "w", for an agent of its own; straight into the database."""
    ws = await store.call(accounts.ensure_workspace, "w")
    agent = await store.call(accounts.create_agent, ws, "a", accounts.VersionSpec({"model": "openai/x"}))
    summary, _ = await store.call(
        queue.create_batch, workspace_id=ws, agent_id=agent["agent_id"], agent_version=1, system_prompt="",
        tasks=[(t, {"user_message": t.removeprefix("t") or "hi"}) for t in task_ids], config={},
        parallelism=parallelism, timeout_per_task_ms=1000, deadline_s=60,
    )  # fmt: skip
    return str(ws), str(summary["batch_id"])


async def test_a_task_finished_twice_is_recorded_once(db_url: str) -> None:
    store = await Store.open(db_url)
    try:
        ws, bid = await _queue_batch(store, ["t"], parallelism=1)
        (task,) = await store.call(queue.claim, "w1", 4, 30.0)
        assert await store.call(queue.sweep) == {"timeout": 0, "failed": 0, "requeued": 0}  # lease held
        await store.call(lambda tx: tx.execute("UPDATE tasks SET lease_expires_at = 0"))  # the worker vanished
        assert await store.call(queue.sweep) == {"timeout": 0, "failed": 0, "requeued": 1}
        (again,) = await store.call(queue.claim, "w2", 4, 30.0)
        assert again.attempts == 2
        first = {"status": "completed", "result": {"n": 1}, "error": None, "execution_time_ms": 5}
        assert await store.call(queue.finish, task.batch_id, task.task_id, **first)
        second = {"status": "failed", "result": None, "error": "late", "execution_time_ms": 9}
        assert not await store.call(queue.finish, again.batch_id, again.task_id, **second)
        batch = await store.read(queue.get_batch, ws, bid)
        assert batch is not None
        assert [(r["status"], r["error"]) for r in batch["results"]] == [("completed", None)]
    finally:
        store.close()


async def test_claims_take_queued_tasks_in_order_within_each_batch_parallelism(db_url: str) -> None:
    """A claim takes a batch's first queued tasks (seq order), never more than its parallelism
    running at once, and says when a batch at its parallelism still has queued tasks (capped);
    a batch whose parallelism is at least its task count is never capped."""
    store = await Store.open(db_url)
    try:
        tasks = [f"t{i}" for i in range(5)]
        _, wide = await _queue_batch(store, tasks, parallelism=100)  # parallelism >= tasks: never at it
        got = await store.call(queue.claim_tasks, "w1", 2, 30.0)
        assert [(t.batch_id, t.task_id) for t in got.tasks] == [(wide, "t0"), (wide, "t1")] and not got.capped
        assert [t.input["user_message"] for t in got.tasks] == ["0", "1"]
        got = await store.call(queue.claim_tasks, "w1", 10, 30.0)
        assert [t.task_id for t in got.tasks] == ["t2", "t3", "t4"] and not got.capped
        _, narrow = await _queue_batch(store, tasks, parallelism=2)
        got = await store.call(queue.claim_tasks, "w2", 10, 30.0)
        assert [(t.batch_id, t.task_id) for t in got.tasks] == [(narrow, "t0"), (narrow, "t1")] and got.capped
        got = await store.call(queue.claim_tasks, "w2", 10, 30.0)
        assert got.tasks == [] and got.capped  # two running: none more until one finishes
        done = queue.Outcome(narrow, "t0", "completed", {"n": 0}, None, 1)
        assert await store.call(queue.finish_many, [done]) == 1
        got = await store.call(queue.claim_tasks, "w2", 10, 30.0)
        assert [t.task_id for t in got.tasks] == ["t2"] and got.capped
    finally:
        store.close()


async def test_outcomes_recorded_together_are_each_recorded_once(db_url: str) -> None:
    """finish_many (a worker's outcomes in one statement): a task already finished keeps its
    first result; the others are recorded with their figures; NULL figures stay NULL."""
    store = await Store.open(db_url)
    try:
        ws, bid = await _queue_batch(store, ["t0", "t1", "t2"], parallelism=3)
        assert len(await store.call(queue.claim, "w1", 4, 30.0)) == 3
        early = {"status": "completed", "result": {"n": 0}, "error": None, "execution_time_ms": 1}
        assert await store.call(queue.finish, bid, "t0", **early)
        scored = {"score": {"reward": 0.5}, "usage": {"input_tokens": 3, "output_tokens": 4}, "turns": 1}
        outcomes = [
            queue.Outcome(bid, "t0", "failed", None, "late", 9),  # finished already: ignored
            queue.Outcome(bid, "t1", "completed", scored, None, 7),
            queue.Outcome(bid, "t2", "timeout", None, "too slow", 1000),
        ]
        assert await store.call(queue.finish_many, outcomes) == 2
        assert await store.call(queue.finish_many, outcomes) == 0  # all finished: nothing changes
        rows = await store.read(
            lambda tx: tx.execute(
                "SELECT task_id, status, error, execution_time_ms, reward, tokens, turns, result, lease_owner "
                "FROM tasks ORDER BY seq"
            )
        )
        assert [r[:7] for r in rows] == [
            ("t0", "completed", None, 1, None, None, None),
            ("t1", "completed", None, 7, 0.5, 7, 1),
            ("t2", "timeout", "too slow", 1000, None, None, None),
        ]
        assert json.loads(rows[1][7]) == scored and rows[2][7] is None
        assert {r[8] for r in rows} == {None}
        batch = await store.read(queue.get_batch, ws, bid)
        assert batch is not None and batch["progress"]["pending"] == 0
    finally:
        store.close()


async def test_event_stream_is_woken_by_the_workers_writes(db_url: str) -> None:
    """PostgreSQL: a worker NOTIFYs when the outcomes it records finish a batch, so its event stream reaches
    `done` without waiting for its poll (here 10 minutes away). SQLite has no notification
    between processes: the stream polls."""
    poll_s = 600.0 if db_url.startswith("postgresql") else 0.05
    async with service(db_url, limits=ApiLimits(sse_poll_s=poll_s)) as svc:
        agent_id = await svc.agent()
        batch = await svc.client.create_batch(agent_id, tasks(3))
        seen = []
        with trio.fail_after(120):  # (a guard: without the NOTIFY the stream would wait for its poll)
            async for event, data in svc.client.events(f"/v1/batches/{batch['batch_id']}/events"):
                seen.append((event, data["progress"]["pending"]))
        assert seen[-1] == ("done", 0) and all(e == "progress" for e, _ in seen[:-1])


async def test_cancel_stops_running_tasks(db_url: str) -> None:
    async with service(db_url, workers=0) as svc:
        # PostgreSQL: the cancellation's NOTIFY makes the worker check its leases at once (its
        # lease, 10 minutes, would not come round); SQLite: the next heartbeat (lease / 3).
        worker = new_worker(svc.store, concurrency=4, lease_s=600.0 if svc.store.is_postgres else 0.6)
        svc.provider.gates["q 0"] = trio.Event()
        agent_id = await svc.agent()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            batch = await svc.client.create_batch(agent_id, tasks(3), config={"parallelism": 1})
            await svc.provider.arrived("q 0").wait()
            cancelled = await svc.client.cancel_batch(batch["batch_id"])
            assert cancelled["status"] == "cancelled"
            with trio.fail_after(120):  # (a guard: without the NOTIFY this would wait for the lease)
                await worker.wait_idle()
            nursery.cancel_scope.cancel()
        done = await svc.client.wait_batch(batch["batch_id"])
        assert [r["status"] for r in done["results"]] == ["cancelled"] * 3
        assert svc.provider.calls["q 1"] == 0  # never started


async def test_a_stopped_worker_puts_its_tasks_back_at_once(db_url: str) -> None:
    async with service(db_url, workers=0) as svc:
        svc.provider.gates["q 0"] = trio.Event()
        agent_id = await svc.agent()
        batch = await svc.client.create_batch(agent_id, tasks(1))
        async with trio.open_nursery() as nursery:
            await nursery.start(new_worker(svc.store, concurrency=2, lease_s=600.0).run)
            await svc.provider.arrived("q 0").wait()
            nursery.cancel_scope.cancel()
        row = await svc.store.read(lambda tx: tx.one("SELECT status, attempts, lease_owner FROM tasks"))
        assert row == ("queued", 0, None)  # not held for the 10-minute lease
        svc.provider.gates["q 0"].set()
        async with trio.open_nursery() as nursery:
            await nursery.start(new_worker(svc.store, concurrency=2).run)
            done = await svc.client.wait_batch(batch["batch_id"])
            nursery.cancel_scope.cancel()
        assert [r["status"] for r in done["results"]] == ["completed"]


# ---- faults -------------------------------------------------------------------------------------


async def test_provider_429_and_500_are_retried_within_bounds(db_url: str) -> None:
    async with service(db_url) as svc:
        svc.provider.errors["q 0"] = [http_error(429, retry_after=0.01), http_error(500, retry_after=0.01)]
        svc.provider.always_fail.add("q 1")
        agent_id = await svc.agent(max_retries=2)
        batch = await svc.client.create_batch(agent_id, tasks(2), config={"score": "exact_match_tag"})
        done = await svc.client.wait_batch(batch["batch_id"])
        by_id = {r["task_id"]: r for r in done["results"]}
        assert by_id["t0"]["status"] == "completed" and by_id["t0"]["score"]["reward"] == 1.0
        assert svc.provider.calls["q 0"] == 3
        assert by_id["t1"]["status"] == "failed" and "500" in by_id["t1"]["error"]
        # 3 attempts per call (max_retries=2) x 3 runs (the run is continued twice after a provider error)
        assert svc.provider.calls["q 1"] == 9
        assert done["status"] == "partial"


async def test_batch_deadline_marks_remaining_tasks_timeout(db_url: str) -> None:
    async with service(db_url, workers=0) as svc:
        worker = new_worker(svc.store, concurrency=4, lease_s=5.0, max_poll_s=0.2)
        for i in range(4):
            svc.provider.gates[f"q {i}"] = trio.Event()
        agent_id = await svc.agent()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            batch = await svc.client.create_batch(agent_id, tasks(4), config={"parallelism": 2, "deadline_s": 1.0})
            done = await svc.client.wait_batch(batch["batch_id"])
            assert [r["status"] for r in done["results"]] == ["timeout"] * 4
            assert done["status"] == "failed" and done["progress"]["timeout"] == 4
            assert svc.provider.calls["q 2"] == svc.provider.calls["q 3"] == 0  # never started
            await worker.wait_idle()  # the worker stops the ones it ran (which wait at the gate forever)
            assert svc.provider.gates["q 0"].is_set() is False
            nursery.cancel_scope.cancel()


async def test_timeout_per_task(db_url: str) -> None:
    async with service(db_url) as svc:
        svc.provider.gates["q 1"] = trio.Event()
        agent_id = await svc.agent()
        batch = await svc.client.create_batch(agent_id, tasks(2), config={"timeout_per_task_ms": 300})
        done = await svc.client.wait_batch(batch["batch_id"])
        by_id = {r["task_id"]: r for r in done["results"]}
        assert by_id["t0"]["status"] == "completed"
        assert by_id["t1"]["status"] == "timeout" and "timeout_per_task_ms" in by_id["t1"]["error"]
        assert done["status"] == "partial"


async def test_sigkilled_worker_task_is_rerun_and_recorded_once(db_url: str, tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    async with service(db_url, workers=0) as svc:
        svc.provider.gates["q 0"] = trio.Event()
        agent_id = await svc.agent()
        first = await worker_process(db_url, log, lease_s=4.0)
        try:
            batch = await svc.client.create_batch(agent_id, tasks(6), config={"score": "exact_match_tag"})
            await svc.provider.arrived("q 0").wait()  # the first worker is in the middle of task t0
            await kill(first)
            second = await worker_process(db_url, log, lease_s=4.0)
            svc.provider.gates["q 0"].set()
            done = await svc.client.wait_batch(batch["batch_id"])
        finally:
            for proc in (first, second):
                if proc.returncode is None:
                    await kill(proc)
        assert [r["status"] for r in done["results"]] == ["completed"] * 6, done["results"]
        assert [r["score"]["reward"] for r in done["results"]] == [1.0] * 6
        by_id = {r["task_id"]: r for r in done["results"]}
        assert by_id["t0"]["attempts"] == 2 and svc.provider.calls["q 0"] == 2
        assert len(done["results"]) == 6  # nothing lost, nothing duplicated


async def test_api_server_restart_mid_batch_the_batch_completes(db_url: str, tmp_path: Path) -> None:
    provider = Provider()
    provider.gates["q 3"] = trio.Event()
    log = tmp_path / "service.log"
    port = free_port()
    async with open_fake_server(provider) as srv:
        allow(srv.base_url)
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "main")
        api = await api_process(db_url, port, log)
        worker = await worker_process(db_url, log, lease_s=2.0)
        client = ServiceClient(f"http://127.0.0.1:{port}", token, reconnect_s=120)
        try:
            agent = await client.create_agent("calc", endpoint(srv.base_url))
            batch = await client.create_batch(agent["agent_id"], tasks(8), config={"parallelism": 2})
            await provider.arrived("q 3").wait()
            await kill(api)
            api = await api_process(db_url, port, log)
            provider.gates["q 3"].set()
            done = await client.wait_batch(batch["batch_id"])
        finally:
            await client.aclose()
            for proc in (api, worker):
                if proc.returncode is None:
                    await kill(proc)
            store.close()
    assert done["status"] == "completed"
    assert [r["status"] for r in done["results"]] == ["completed"] * 8
    assert sum(provider.calls.values()) == 8


# ---- bad input ----------------------------------------------------------------------------------


async def _post(http: httpx2.AsyncClient, url: str, token: str, body: Any, raw: bytes | None = None) -> httpx2.Response:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    content = raw if raw is not None else json.dumps(body).encode()
    return await http.post(url, content=content, headers=headers)


async def test_bad_input_is_a_4xx_naming_the_field_and_loses_nothing(db_url: str) -> None:
    limits = ApiLimits(max_body_bytes=64 * 1024, max_tasks=3)
    async with service(db_url, workers=0, limits=limits) as svc, httpx2.AsyncClient() as http:
        agent_id = await svc.agent()
        kept = await svc.client.create_batch(agent_id, tasks(2))
        url = f"{svc.url}/v1/batches"

        async def error(body: Any = None, raw: bytes | None = None) -> tuple[int, str | None, str]:
            r = await _post(http, url, svc.token, body, raw)
            err = r.json()["error"]
            return r.status_code, err.get("field"), err["message"]

        ok_tasks = tasks(1)
        assert (await error(raw=b'{"agent_id": "x", '))[:2] == (400, "body")
        assert (await error(raw=b"[1, 2]"))[:2] == (400, "body")
        assert (await error({"agent_id": "ag_nope", "tasks": ok_tasks}))[:2] == (404, "agent_id")
        assert (await error({"agent_id": agent_id, "agent_version": 9, "tasks": ok_tasks}))[:2] == (
            404,
            "agent_version",
        )
        assert (await error({"agent_id": agent_id, "tasks": []}))[:2] == (422, "tasks")
        assert (await error({"agent_id": agent_id, "tasks": tasks(4)}))[:2] == (422, "tasks")
        dup = [{"task_id": "a", "user_message": "x"}, {"task_id": "a", "user_message": "y"}]
        assert (await error({"agent_id": agent_id, "tasks": dup}))[:2] == (422, "tasks[1].task_id")
        assert (await error({"agent_id": agent_id, "tasks": [{"task_id": "a"}]}))[:2] == (422, "tasks[0]")
        assert (await error({"agent_id": 5, "tasks": ok_tasks}))[:2] == (422, "agent_id")
        bad = {"agent_id": agent_id, "tasks": ok_tasks, "config": {"parallelism": "many"}}
        assert (await error(bad))[:2] == (422, "config.parallelism")
        bad = {"agent_id": agent_id, "tasks": ok_tasks, "config": {"score": "no_such_scorer"}}
        assert (await error(bad))[:2] == (422, "config.score")
        bad = {"agent_id": agent_id, "tasks": [{"task_id": "a", "messages": [{"nope": 1}]}]}
        assert (await error(bad))[:2] == (422, "tasks[0].messages[0]")
        huge = {"agent_id": agent_id, "tasks": [{"task_id": "a", "user_message": "x" * 100_000}]}
        assert (await error(huge))[:2] == (413, "body")
        r = await _post(
            http,
            f"{svc.url}/v1/agents",
            svc.token,
            {"name": "k", "endpoint": {"model": "openai/x", "api_key": "sk-123"}},
        )
        assert r.status_code == 422 and r.json()["error"]["field"] == "endpoint.api_key" and "sk-123" not in r.text
        # nothing accepted before is lost
        batch = await svc.client.get_batch(kept["batch_id"])
        assert batch["progress"]["total"] == 2 and batch["progress"]["pending"] == 2


# ---- security -----------------------------------------------------------------------------------


async def _dump(db_url: str, store: Store) -> str:
    """Everything the database holds, as text (and the SQLite files' raw bytes)."""
    tables = ["workspaces", "tokens", "agents", "agent_versions", "batches", "tasks", "gepa_jobs"]

    def dump(tx: Any) -> str:
        return "\n".join(repr(tx.execute(f"SELECT * FROM {t}")) for t in tables)

    text = await store.read(dump)
    path = store.db.sqlite_path
    if path is not None:
        for f in path.parent.glob(path.name + "*"):
            text += f.read_bytes().decode("latin-1")
    return text


async def test_security_battery(db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "workers.log"
    async with service(db_url, workers=0) as svc, httpx2.AsyncClient() as http:
        worker = await worker_process(db_url, log, lease_s=5.0)
        try:
            agent_id = await svc.agent()
            batch = await svc.client.create_batch(agent_id, tasks(2), config={"score": "exact_match_tag"})
            done = await svc.client.wait_batch(batch["batch_id"])
        finally:
            await kill(worker)
        assert done["status"] == "completed"
        _, other_token = await svc.store.call(accounts.create_token, "other")
        other = ServiceClient(svc.url, other_token)
        bid = batch["batch_id"]
        try:
            # another workspace sees nothing, and can change nothing
            for call in (
                other.get_batch(bid),
                other.cancel_batch(bid),
                other.get_agent(agent_id),
                other.list_versions(agent_id),
                other.create_version(agent_id, system_prompt="x"),
                other.promote(agent_id, 1),
                other.create_batch(agent_id, tasks(1)),
            ):
                with pytest.raises(ServiceError) as e:
                    await call
                assert e.value.status == 404
            assert await other.list_agents() == []
            with pytest.raises(ServiceError) as e:
                await other.request("GET", f"/v1/batches/{bid}/events")
            assert e.value.status == 404
        finally:
            await other.aclose()
        assert (await svc.client.get_batch(bid))["status"] == "completed"  # untouched

        # 401s, all alike
        revoked_id, revoked = await svc.store.call(accounts.create_token, "main", "old")
        await svc.store.call(accounts.revoke_token, revoked_id)
        _, expired = await svc.store.call(accounts.create_token, "main", "expired", -1.0)
        bodies = set()
        for headers in (
            {},
            {"authorization": "Bearer"},
            {"authorization": "Basic abc"},
            {"authorization": "Bearer rlt_" + "x" * 43},
            {"authorization": f"Bearer {revoked}"},
            {"authorization": f"Bearer {expired}"},
            {"authorization": f"bearer {svc.token}x"},
        ):
            r = await http.get(f"{svc.url}/v1/batches/{bid}", headers=headers)
            assert r.status_code == 401, headers
            bodies.add(r.text)
        assert len(bodies) == 1

        # tokens are stored hashed; no token or provider key anywhere
        dump = await _dump(db_url, svc.store)
        results = json.dumps(done)
        logs = log.read_text(errors="replace") + caplog.text
        for secret in (svc.token, other_token, revoked, expired, PROVIDER_KEY):
            assert secret not in dump
            assert secret not in results
            assert secret not in logs
        from rollouts.service.auth import hash_token

        assert hash_token(svc.token) in dump


async def test_token_cli_create_list_revoke(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from rollouts.cli import main

    assert main(["service", "token", "create", "--db", db_url, "--workspace", "cli", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["token"].startswith("rlt_")
    assert main(["service", "token", "list", "--db", db_url, "--json"]) == 0
    listed = capsys.readouterr().out
    assert created["token_id"] in listed and created["token"] not in listed
    store = await Store.open(db_url)
    try:
        assert await store.read(accounts.workspace_for_token, created["token"]) is not None
        assert main(["service", "token", "revoke", "--db", db_url, created["token_id"]]) == 0
        assert await store.read(accounts.workspace_for_token, created["token"]) is None
    finally:
        store.close()
    assert main(["service", "token", "revoke", "--db", db_url, created["token_id"]]) == 2


# ---- GEPA ---------------------------------------------------------------------------------------

_TAG = "[T:{}]"


class TagProvider(Provider):
    """The "tags" task: the agent answers `OK <topic>` when its system prompt holds [T:<topic>],
    else `NO`; the reflection model adds the tag of the first topic the feedback says was
    wrong. Reflection calls can be held at `reflection_gate` from call `gate_from` on."""

    def __init__(self) -> None:
        super().__init__()
        self.reflections = 0
        self.reflection_gate: trio.Event | None = None
        self.gate_from = 0
        self.reflection_arrived = trio.Event()

    async def __call__(self, request: RecordedRequest) -> Any:
        messages = request.json["messages"]
        text = messages[-1]["content"]
        if text.startswith("I gave an assistant"):
            self.reflections += 1
            if self.reflection_gate is not None and self.reflections >= self.gate_from:
                self.reflection_arrived.set()
                await self.reflection_gate.wait()
            current = text.split("```")[1].strip("\n")
            for topic in re_findall(r"expected 'OK (\w+)', got", text):
                if _TAG.format(topic) not in current:
                    return f"```\n{current}\n{_TAG.format(topic)}\n```"
            return f"```\n{current}\n```"
        self.calls[text] += 1
        self.arrived(text).set()
        gate = self.gates.get(text)
        if gate is not None:
            await gate.wait()
        system = messages[0]["content"] if messages[0]["role"] == "system" else ""
        topic = text.split("topic: ")[-1]
        return f"OK {topic}" if _TAG.format(topic) in system else "NO"


def re_findall(pattern: str, text: str) -> list[str]:
    import re

    return re.findall(pattern, text)


def tag_rows(topics: str) -> list[dict[str, Any]]:
    return [{"user_message": f"topic: {t}", "context": {"answer": f"OK {t}"}} for t in topics]


async def test_optimize_through_the_service_with_an_exact_budget(db_url: str) -> None:
    from rollouts import Endpoint
    from rollouts.gepa import optimize
    from rollouts.service.gepa_adapter import ServiceAdapter

    async with service(db_url) as svc:
        svc.provider.__class__ = TagProvider  # (the same server, the tags task's replies)
        TagProvider.__init__(svc.provider)  # type: ignore[misc]
        agent_id = await svc.agent()
        adapter = ServiceAdapter.over_client(svc.client, agent_id, score="exact_match", parallelism=8)
        reflector = Endpoint("openai-compatible", "reflect", api_base=svc.srv.base_url, api_key="x", transport="http")
        result = await optimize(
            "Answer.", tag_rows("abcab"), tag_rows("abc"), adapter=adapter, reflection_endpoint=reflector,
            max_metric_calls=40, reflection_minibatch_size=2,
        )  # fmt: skip
        assert result.best_score == 1.0
        assert all(_TAG.format(t) in result.best_candidate["system_prompt"] for t in "abc")
        assert result.metric_calls <= 40
        assert adapter.tasks_run == result.metric_calls  # every metric call is one task, run once


async def test_adapter_reports_timeouts_as_failed_instances_with_feedback(db_url: str) -> None:
    from rollouts.service.gepa_adapter import ServiceAdapter

    async with service(db_url) as svc:
        svc.provider.gates["late 1"] = trio.Event()
        agent_id = await svc.agent()
        adapter = ServiceAdapter.over_client(svc.client, agent_id, score="exact_match_tag", poll_timeout_s=1.0)
        rows = [
            {"user_message": "late 0", "context": {"answer": "0"}},
            {"user_message": "late 1", "context": {"answer": "1"}},
        ]
        batch = await adapter.evaluate(rows, {"system_prompt": "x"}, capture_traces=True)
        assert list(batch.scores) == [1.0, 0.0]
        assert batch.feedback is not None and "did not complete (timeout)" in batch.feedback[1]
        records = adapter.make_reflective_dataset({"system_prompt": "x"}, batch, ["system_prompt"])
        assert "timeout" in records["system_prompt"][1]["Feedback"]


async def test_gepa_job_through_the_api_creates_and_promotes_a_version(db_url: str) -> None:
    async with service(db_url) as svc:
        svc.provider.__class__ = TagProvider
        TagProvider.__init__(svc.provider)  # type: ignore[misc]
        agent_id = await svc.agent()
        job = await svc.client.start_gepa(
            agent_id, trainset=tag_rows("abcab"), valset=tag_rows("abc"), score="exact_match", max_metric_calls=40,
            minibatch_size=2, parallelism=8, reflection_model=endpoint(svc.srv.base_url), promote=True,
        )  # fmt: skip
        assert job["status"] == "queued"
        events = [(e, data) async for e, data in svc.client.events(f"/v1/gepa/{job['job_id']}/events")]
        assert events[-1][0] == "done" and events[-1][1]["status"] == "completed"
        assert all(e == "progress" for e, _ in events[:-1])
        done = await svc.client.wait_gepa(job["job_id"])
        assert done["status"] == "completed", done
        assert done["best_score"] == 1.0 and done["metric_calls"] <= 40
        assert done["created_version"] == 2 and done["lineage"][0]["parents"] == []
        agent = await svc.client.get_agent(agent_id)
        assert agent["active_version"] == 2
        version = agent["version"]
        assert version["source"] == "gepa" and version["parent_version"] == 1
        assert all(_TAG.format(t) in version["system_prompt"] for t in "abc")
        ran = await svc.store.read(
            lambda tx: tx.one("SELECT COUNT(*) FROM tasks WHERE batch_id IN (SELECT id FROM batches WHERE config LIKE ?)", (f'%{job["job_id"]}%',))
        )  # fmt: skip
        assert ran is not None and ran[0] == done["metric_calls"]  # the budget, exactly


async def test_gepa_job_cancel(db_url: str) -> None:
    async with service(db_url, lease_s=1.5) as svc:
        svc.provider.__class__ = TagProvider
        TagProvider.__init__(svc.provider)  # type: ignore[misc]
        assert isinstance(svc.provider, TagProvider)
        svc.provider.reflection_gate = trio.Event()
        svc.provider.gate_from = 1
        agent_id = await svc.agent()
        job = await svc.client.start_gepa(
            agent_id, trainset=tag_rows("ab"), score="exact_match", max_metric_calls=40,
            reflection_model=endpoint(svc.srv.base_url),
        )  # fmt: skip
        await svc.provider.reflection_arrived.wait()
        cancelled = await svc.client.cancel_gepa(job["job_id"])
        assert cancelled["status"] == "cancelled"  # (issue 33 item 15: it answered "running")
        done = await svc.client.wait_gepa(job["job_id"])
        assert done["status"] == "cancelled" and done["created_version"] is None
        assert [v["version"] for v in await svc.client.list_versions(agent_id)] == [1]


async def test_gepa_job_resumes_after_the_server_restarts(db_url: str, tmp_path: Path) -> None:
    provider = TagProvider()
    provider.reflection_gate = trio.Event()
    provider.gate_from = 2
    log = tmp_path / "service.log"
    port = free_port()
    async with open_fake_server(provider) as srv:
        allow(srv.base_url)
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "main")
        serve_cmd = ["--job-lease", "2", "--data-dir"]
        api = await api_process(db_url, port, log, [*serve_cmd, str(tmp_path / "first")])
        worker = await worker_process(db_url, log, lease_s=4.0, concurrency=8)
        client = ServiceClient(f"http://127.0.0.1:{port}", token, reconnect_s=120)
        try:
            agent = await client.create_agent("calc", endpoint(srv.base_url), system_prompt="Answer.")
            job = await client.start_gepa(
                agent["agent_id"], trainset=tag_rows("abcab"), valset=tag_rows("abc"), score="exact_match",
                max_metric_calls=40, minibatch_size=2, parallelism=8, reflection_model=endpoint(srv.base_url),
            )  # fmt: skip
            await provider.reflection_arrived.wait()  # iteration 1 is checkpointed, iteration 2 reflecting
            await kill(api)
            api = await api_process(db_url, port, log, [*serve_cmd, str(tmp_path / "second")])  # (no run dir)
            provider.reflection_gate.set()
            done = await client.wait_gepa(job["job_id"])
        finally:
            await client.aclose()
            for proc in (api, worker):
                if proc.returncode is None:
                    await kill(proc)
        ran = await store.read(lambda tx: tx.one("SELECT COUNT(*) FROM tasks"))
        store.close()
    assert done["status"] == "completed", (done["error"], log.read_text())
    assert done["best_score"] == 1.0 and done["created_version"] == 2
    assert ran is not None and ran[0] == done["metric_calls"] <= 40  # nothing paid for twice
    assert sum(provider.calls.values()) == done["metric_calls"]


async def test_migrations_apply_once_and_in_order(db_url: str) -> None:
    from rollouts.service.schema import SCHEMA_VERSION, migrate

    store = await Store.open(db_url)
    try:
        async with trio.open_nursery() as nursery:  # several processes starting at once
            for _ in range(3):
                nursery.start_soon(trio.to_thread.run_sync, migrate, store.db)
        rows = await store.read(lambda tx: tx.execute("SELECT version FROM schema_migrations ORDER BY version"))
        assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    finally:
        store.close()


async def test_a_batch_at_its_parallelism_keeps_its_worker_busy(db_url: str) -> None:
    """Tasks of a batch limited to 1 at a time run back to back: each one ending lets the worker
    claim the next at once (not at its next idle poll)."""
    async with service(db_url, workers=0) as svc:
        agent_id = await svc.agent()
        worker = new_worker(svc.store, concurrency=8, max_poll_s=600.0)  # (a poll would never come)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            batch = await svc.client.create_batch(agent_id, tasks(5), config={"parallelism": 1})
            if not svc.store.is_postgres:
                worker.wake()  # (SQLite has no NOTIFY: stands for the first poll)
            with trio.fail_after(120):  # (a guard: a worker waiting for its poll would hang here)
                done = await svc.client.wait_batch(batch["batch_id"])
            nursery.cancel_scope.cancel()
        assert [r["status"] for r in done["results"]] == ["completed"] * 5
        assert svc.srv.max_in_flight == 1


def test_cli_reports_a_database_it_cannot_use_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rollouts.cli import main

    port = free_port()  # (nothing listens there)
    assert main(["service", "token", "list", "--db", f"postgresql://nobody:pw-{port}@127.0.0.1:{port}/x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rollouts: error: the database cannot be used:") and len(err.strip().splitlines()) == 1
    assert f"pw-{port}" not in err
    (tmp_path / "dir.db").mkdir()
    assert main(["service", "token", "list", "--db", str(tmp_path / "dir.db")]) == 1
    assert "the database cannot be used" in capsys.readouterr().err
