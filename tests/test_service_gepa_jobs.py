"""GEPA jobs run by the service, where they end (issue 25 defect 5, issue 33 item 10): a job
cancelled while its server is down, a cancelled job's evaluation batch, a reflection model
that always fails, a run that improves nothing, tasks that time out, a local model's time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from test_service_e2e import (
    TagProvider,
    allow,
    api_process,
    endpoint,
    free_port,
    kill,
    provider_key,  # noqa: F401  (the autouse fixture: the provider key and the policy file)
    service,
    tag_rows,
    tasks,
    worker_process,
)

from rollouts.service import accounts, jobs
from rollouts.service.accounts import VersionSpec
from rollouts.service.client import ServiceClient
from rollouts.service.store import Store
from rollouts.testing import RecordedRequest, http_error, open_fake_server


def _job(svc: Any, **over: Any) -> dict[str, Any]:
    return {
        "trainset": tag_rows("ab"), "score": "exact_match", "max_metric_calls": 20, "minibatch_size": 2,
        "reflection_model": endpoint(svc.srv.base_url), **over,
    }  # fmt: skip


def _tags(svc: Any) -> TagProvider:
    svc.provider.__class__ = TagProvider  # (the same server, the tags task's replies)
    TagProvider.__init__(svc.provider)
    assert isinstance(svc.provider, TagProvider)
    return svc.provider


async def _job_batches(store: Store, job_id: str) -> list[tuple[Any, ...]]:
    return await store.read(
        lambda tx: tx.execute(
            "SELECT b.cancelled_at, t.status FROM batches b JOIN tasks t ON t.batch_id = b.id "
            "WHERE b.idempotency_key LIKE ?",
            (f"gepa:{job_id}:%",),
        )
    )


async def test_a_job_cancelled_while_its_server_is_down_ends_cancelled(db_url: str, tmp_path: Path) -> None:
    """It stayed `running` forever: no server claims a job asked to stop, and its own was gone."""
    provider = TagProvider()
    provider.reflection_gate = trio.Event()
    provider.gate_from = 1
    log = tmp_path / "service.log"
    async with open_fake_server(provider) as srv:
        allow(srv.base_url)
        store = await Store.open(db_url)
        _, token = await store.call(accounts.create_token, "main")
        port_a, port_b = free_port(), free_port()
        runner = await api_process(db_url, port_a, log, ["--job-lease", "3", "--data-dir", str(tmp_path / "a")])
        other = await api_process(db_url, port_b, log, ["--job-lease", "3", "--data-dir", str(tmp_path / "b")])
        worker = await worker_process(db_url, log, lease_s=5.0, concurrency=8)
        a = ServiceClient(f"http://127.0.0.1:{port_a}", token, reconnect_s=120)
        b = ServiceClient(f"http://127.0.0.1:{port_b}", token, reconnect_s=120)
        try:
            agent = await a.create_agent("calc", endpoint(srv.base_url), system_prompt="Answer.")
            job = await a.start_gepa(
                agent["agent_id"], trainset=tag_rows("ab"), score="exact_match", max_metric_calls=20,
                reflection_model=endpoint(srv.base_url),
            )  # fmt: skip
            await b.request("GET", "/v1/health")  # (the other server is up)
            await provider.reflection_arrived.wait()  # the job runs on one of them; stop that one
            running = await store.read(lambda tx: tx.one("SELECT lease_owner FROM gepa_jobs"))
            assert running is not None and running[0] is not None
            pid = int(str(running[0]).split("-")[-2])
            victim, client = (runner, b) if pid == runner.pid else (other, a)
            await kill(victim)
            cancelled = await client.cancel_gepa(job["job_id"])  # (within the dead server's lease)
            assert cancelled["status"] in ("running", "cancelled")
            with trio.fail_after(60):
                done = await client.wait_gepa(job["job_id"])
        finally:
            provider.reflection_gate.set()
            for c in (a, b):
                await c.aclose()
            for proc in (runner, other, worker):
                if proc.returncode is None:
                    await kill(proc)
            store.close()
    assert done["status"] == "cancelled" and done["created_version"] is None


async def test_cancelling_a_running_job_cancels_its_evaluation_batch(db_url: str) -> None:
    """The batch ran on until its deadline."""
    async with service(db_url, lease_s=1.5) as svc:
        tags = _tags(svc)
        svc.provider.gates["topic: a"] = trio.Event()  # (the seed's evaluation never finishes)
        agent_id = await svc.agent()
        job = await svc.client.request("POST", f"/v1/agents/{agent_id}/gepa", _job(svc))
        await tags.arrived("topic: a").wait()
        await svc.client.cancel_gepa(job["job_id"])
        with trio.fail_after(60):
            done = await svc.client.wait_gepa(job["job_id"])
        rows = await _job_batches(svc.store, job["job_id"])
        svc.provider.gates["topic: a"].set()
    assert done["status"] == "cancelled"
    assert rows and all(cancelled_at is not None for cancelled_at, _ in rows)
    assert {status for _, status in rows} <= {"cancelled", "completed"} and "cancelled" in {s for _, s in rows}


class _Reflection(TagProvider):
    """The tags task; the reflection model fails (`fail`) or proposes the prompt unchanged."""

    fail = True

    async def __call__(self, request: RecordedRequest) -> Any:
        text = request.json["messages"][-1]["content"]
        if text.startswith("I gave an assistant"):
            self.reflections += 1
            if self.fail:
                return http_error(400, message="model overloaded")
            return f"```\n{text.split('```')[1].strip()}\n```"
        return await super().__call__(request)


async def test_a_job_whose_reflection_fails_on_every_call_fails_with_the_reason(db_url: str) -> None:
    """It ended `completed` with `error: null` and a version identical to the seed."""
    async with service(db_url) as svc:
        svc.provider.__class__ = _Reflection
        TagProvider.__init__(svc.provider)  # type: ignore[arg-type]
        agent_id = await svc.agent()
        job = await svc.client.request("POST", f"/v1/agents/{agent_id}/gepa", _job(svc))
        with trio.fail_after(120):
            done = await svc.client.wait_gepa(job["job_id"])
        versions = await svc.client.list_versions(agent_id)
    assert done["status"] == "failed" and done["created_version"] is None
    assert "reflection model failed on every call" in done["error"] and "model overloaded" in done["error"]
    assert [v["version"] for v in versions] == [1]


async def test_a_job_that_improves_nothing_creates_no_version_and_says_so(db_url: str) -> None:
    async with service(db_url) as svc:
        svc.provider.__class__ = _Reflection
        TagProvider.__init__(svc.provider)  # type: ignore[arg-type]
        svc.provider.fail = False  # type: ignore[attr-defined]
        agent_id = await svc.agent()
        job = await svc.client.request("POST", f"/v1/agents/{agent_id}/gepa", _job(svc))
        with trio.fail_after(120):
            done = await svc.client.wait_gepa(job["job_id"])
        versions = await svc.client.list_versions(agent_id)
    assert done["status"] == "completed" and done["error"] is None and done["created_version"] is None
    assert "no candidate beat the seed" in done["message"] and "no version was created" in done["message"]
    assert [v["version"] for v in versions] == [1]


async def test_a_job_reports_its_timeouts_and_a_local_model_gets_time_to_finish(db_url: str) -> None:
    """Issue 33 item 10: on a local model every task timed out at the 30 s default, the job
    reported `best_score 0.0`, and neither its status nor its events said why."""
    async with service(db_url) as svc:
        tags = _tags(svc)
        tags.gates["topic: b"] = trio.Event()  # (never answered: times out)
        agent_id = await svc.agent()
        job = await svc.client.request(
            "POST", f"/v1/agents/{agent_id}/gepa", _job(svc, timeout_per_task_ms=300, max_metric_calls=4)
        )
        events = [data async for _, data in svc.client.events(f"/v1/gepa/{job['job_id']}/events")]
        done = await svc.client.wait_gepa(job["job_id"])
        assert done["timeouts"] >= 1 and events[-1]["timeouts"] == done["timeouts"]
        assert "timed out (timeout_per_task_ms=300)" in done["message"]
        tags.gates["topic: b"].set()
    async with service(db_url, workers=0) as svc:  # (no worker: nothing tries to run the local model)
        agent_id = await svc.agent()
        local = await svc.client.create_agent("local", {"model": "local/qwen2.5-coder-0.5b-instruct"})
        job = await svc.client.request(
            "POST", f"/v1/agents/{local['agent_id']}/gepa", _job(svc) | {"max_metric_calls": 1}
        )
        await svc.client.cancel_gepa(job["job_id"])
        batch = await svc.client.create_batch(local["agent_id"], tasks(1))
        hosted = await svc.client.create_batch(agent_id, tasks(1))
        stored = await svc.store.read(
            lambda tx: (
                tx.one("SELECT config FROM gepa_jobs WHERE id = ?", (job["job_id"],)),
                tx.execute("SELECT id, timeout_per_task_ms FROM batches WHERE id IN (?, ?)",
                           (batch["batch_id"], hosted["batch_id"])),
            )
        )  # fmt: skip
    assert json.loads(stored[0][0])["timeout_per_task_ms"] == 600_000
    assert dict(stored[1]) == {batch["batch_id"]: 600_000, hosted["batch_id"]: 30_000}


async def test_a_job_leased_to_a_server_that_is_not_running_it_is_taken_back(db_url: str) -> None:
    """Issue 25, defect 4: a claim that committed while its answer was lost to a database outage
    left the job leased to a server that was not running it, which never took it back (a server
    skipped every job leased to it); now it skips only the jobs it runs."""
    store = await Store.open(db_url)
    try:
        ws = await store.call(accounts.ensure_workspace, "w")
        agent = await store.call(accounts.create_agent, ws, "a", VersionSpec(endpoint={"model": "scripted/echo"}))
        job = await store.call(jobs.create_job, ws, agent["agent_id"], 1, {"x": 1}, 10, False)
        first = await store.call(jobs.claim_job, "srv-a", -1.0, [])  # (its answer lost; the lease already over)
        assert first is not None and first["job_id"] == job["job_id"]
        assert await store.call(jobs.claim_job, "srv-a", 60.0, [job["job_id"]]) is None  # running it: never twice
        again = await store.call(jobs.claim_job, "srv-a", 60.0, [])  # not running it: takes it back
        assert again is not None and again["job_id"] == job["job_id"]
        row = await store.read(lambda tx: tx.one("SELECT lease_owner, status FROM gepa_jobs"))
        assert row == ("srv-a", "running")
    finally:
        store.close()
