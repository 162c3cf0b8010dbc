"""The service tried as an attacker with one ordinary workspace token would (issue 25): no secret
leaves, no code the operator did not allow runs, no request takes a worker or the server down.

Real `serve`, real worker processes (`rollouts service worker`), both databases; the provider
and the attacker's host are fake servers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx2
import trio
from test_service_e2e import (
    KEY_ENV,
    PROVIDER_KEY,
    _post,
    allow,
    endpoint,
    kill,
    provider_key,  # noqa: F401  (the autouse fixture: the provider key and the policy file)
    service,
    tasks,
    worker_process,
)

from rollouts.service import accounts, queue
from rollouts.service.accounts import VersionSpec
from rollouts.service.api import ApiLimits
from rollouts.service.client import ServiceClient
from rollouts.service.server import DB_ENV
from rollouts.testing import RecordedRequest, open_fake_server


class Attacker:
    """A host a token holder controls: records every request (and the key it carried)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []

    async def __call__(self, request: RecordedRequest) -> Any:
        self.requests.append(request)
        return "stolen"


async def _error(http: httpx2.AsyncClient, url: str, token: str, body: Any) -> tuple[int, str | None]:
    r = await _post(http, url, token, body)
    return r.status_code, r.json().get("error", {}).get("field")


async def test_secrets_never_leave_a_request_names_no_key_variable_and_no_host(db_url: str, tmp_path: Path) -> None:
    """Issue 25, defect 1: an endpoint (agent, version, GEPA reflection model) naming a key
    variable, an address its credential does not list, or client settings in extra_params is
    422 naming the field; a row written past the API anyway is refused by the worker, which
    sends nothing."""
    attacker = Attacker()
    async with (
        open_fake_server(attacker) as evil,
        service(db_url, workers=0) as svc,
        httpx2.AsyncClient() as http,
    ):
        agents = f"{svc.url}/v1/agents"
        refused: list[tuple[dict[str, Any], str]] = [
            ({"api_key_env": DB_ENV}, "endpoint.api_key_env"),
            ({"api_key_env": KEY_ENV, "credential": None}, "endpoint.api_key_env"),
            ({"api_base": evil.base_url}, "endpoint.api_base"),
            ({"credential": "openai", "model": "openai/gpt-4.1"}, "endpoint.api_base"),
            ({"credential": "nope"}, "endpoint.credential"),
            ({"extra_params": {"extra_headers": {"x": "1"}}}, "endpoint.extra_params.extra_headers"),
            ({"extra_params": {"http_options": {"base_url": evil.base_url}}}, "endpoint.extra_params.http_options"),
            ({"model": "transformers/gpt2"}, "endpoint.model"),
        ]
        for over, field in refused:
            spec = {k: v for k, v in endpoint(svc.srv.base_url, **over).items() if v is not None}
            assert await _error(http, agents, svc.token, {"name": "x", "endpoint": spec}) == (422, field), over
        # the built-in credential of a hosted provider goes to its own API only
        r = await _post(http, agents, svc.token, {"name": "ok", "endpoint": {"model": "openai/gpt-4.1"}})
        assert r.status_code == 201, r.text
        agent_id = await svc.agent()
        versions = f"{agents}/{agent_id}/versions"
        bad = {"endpoint": endpoint(evil.base_url)}
        assert await _error(http, versions, svc.token, bad) == (422, "endpoint.api_base")
        gepa: dict[str, Any] = {
            "trainset": tasks(1),
            "score": "exact_match",
            "max_metric_calls": 4,
            "reflection_model": {"model": "openai-compatible/x", "api_base": evil.base_url, "api_key_env": DB_ENV},
        }
        assert await _error(http, f"{agents}/{agent_id}/gepa", svc.token, gepa) == (422, "reflection_model.api_key_env")
        gepa["reflection_model"] = endpoint(evil.base_url)
        assert await _error(http, f"{agents}/{agent_id}/gepa", svc.token, gepa) == (422, "reflection_model.api_base")

        # a version written before the policy (or past the API) is refused by the worker
        ws = await svc.store.read(accounts.workspace_for_token, svc.token)
        assert ws is not None
        stolen = {"model": "openai-compatible/x", "api_base": evil.base_url, "api_key_env": DB_ENV, "transport": "http"}
        old = await svc.store.call(accounts.create_agent, ws, "old", VersionSpec(endpoint=stolen))
        summary, _ = await svc.store.call(
            queue.create_batch, workspace_id=ws, agent_id=old["agent_id"], agent_version=1, system_prompt="",
            tasks=[(t["task_id"], {"user_message": t["user_message"]}) for t in tasks(2)], config={},
            parallelism=2, timeout_per_task_ms=10_000, deadline_s=60.0, idempotency_key=None,
        )  # fmt: skip
        worker = await worker_process(db_url, tmp_path / "worker.log", lease_s=5.0)
        try:
            done = await svc.client.wait_batch(summary["batch_id"])
        finally:
            await kill(worker)
    assert [r["status"] for r in done["results"]] == ["failed", "failed"]
    assert all("api_key_env" in r["error"] for r in done["results"]), done["results"]
    assert attacker.requests == []  # nothing was sent to the attacker's host
    text = json.dumps(done) + (tmp_path / "worker.log").read_text()
    assert db_url not in text and PROVIDER_KEY not in text


async def test_a_request_imports_only_what_the_operator_allowed(db_url: str) -> None:
    """Issue 25, defect 2: `environment: "os:abort"` or `config.score: "sys:exit"` is 422 naming
    the field; modules the operator allows (and built-in names) are accepted."""
    async with service(db_url, workers=0) as svc, httpx2.AsyncClient() as http:
        agents = f"{svc.url}/v1/agents"
        spec = endpoint(svc.srv.base_url)
        for env in ("os:abort", "rollouts.environments.calculator:CalculatorEnvironment", "builtins:exec"):
            body: dict[str, Any] = {"name": "x", "endpoint": spec, "environment": env}
            assert await _error(http, agents, svc.token, body) == (422, "environment"), env
        agent_id = await svc.agent()
        for score in ("sys:exit", "os:_exit", "subprocess:run"):
            body = {"agent_id": agent_id, "tasks": tasks(1), "config": {"score": score}}
            assert await _error(http, f"{svc.url}/v1/batches", svc.token, body) == (422, "config.score"), score
        gepa: dict[str, Any] = {
            "trainset": tasks(1),
            "score": "os:system",
            "max_metric_calls": 4,
            "reflection_model": spec,
        }
        assert await _error(http, f"{agents}/{agent_id}/gepa", svc.token, gepa) == (422, "score")
    async with service(db_url, workers=1, policy='[imports]\nallow = ["rollouts.environments.calculator"]\n') as svc:
        agent = await svc.client.create_agent(
            "calc", endpoint(svc.srv.base_url), environment="rollouts.environments.calculator:CalculatorEnvironment"
        )
        batch = await svc.client.create_batch(agent["agent_id"], tasks(2), config={"score": "exact_match_tag"})
        done = await svc.client.wait_batch(batch["batch_id"])
    assert [r["status"] for r in done["results"]] == ["completed", "completed"]


_CRASH_MODULE = """
import os


def crash(sample):
    os._exit(70)  # the worker process dies at once, mid-task


def score_exit(sample):
    raise SystemExit(3)
"""


async def test_a_task_that_kills_its_worker_is_failed_and_serve_keeps_serving(db_url: str, tmp_path: Path) -> None:
    """Issue 25, defect 2: a task whose (allowed) code kills its worker process is recorded
    `failed` with the reason after its attempts; `serve --workers 1` restarts its worker every
    time and stays up; other batches complete."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "crashy.py").write_text(_CRASH_MODULE)
    from test_service_e2e import _env, free_port

    async with service(db_url, workers=0) as svc:
        allow(svc.srv.base_url, '[imports]\nallow = ["crashy"]\n')
        port = free_port()
        env = {**_env(db_url), "PYTHONPATH": os.pathsep.join([str(tmp_path / "mods"), *sys.path])}
        log = tmp_path / "serve.log"
        serve = await trio.lowlevel.open_process(
            [sys.executable, "-m", "rollouts.cli", "service", "serve", "--port", str(port), "--workers", "1",
             "--worker-concurrency", "4", "--worker-lease", "1", "--no-ui"],
            env=env, stderr=log.open("ab"),
        )  # fmt: skip
        from rollouts.service.client import ServiceClient

        client = ServiceClient(f"http://127.0.0.1:{port}", svc.token, reconnect_s=60)
        try:
            agent_id = await svc.agent()
            crash = await client.create_batch(agent_id, tasks(1, "c"), config={"score": "crashy:crash"})
            with trio.fail_after(120):
                crashed = await client.wait_batch(crash["batch_id"])
            # (after it: a task that crashes its worker takes the tasks running beside it along)
            exits = await client.create_batch(agent_id, tasks(1, "e"), config={"score": "crashy:score_exit"})
            with trio.fail_after(60):
                exited = await client.wait_batch(exits["batch_id"])
            fine = await client.create_batch(agent_id, tasks(3), config={"score": "exact_match_tag"})
            with trio.fail_after(60):
                after = await client.wait_batch(fine["batch_id"])
            assert serve.returncode is None  # serve is still up
        finally:
            await client.aclose()
            if serve.returncode is None:
                await kill(serve)
    result = crashed["results"][0]
    assert result["status"] == "failed" and result["attempts"] == 3, result
    assert "worker" in result["error"] and "3 times" in result["error"]
    assert exited["results"][0]["status"] == "failed" and "exit" in exited["results"][0]["error"]
    assert [r["status"] for r in after["results"]] == ["completed"] * 3


async def test_failed_authentications_are_rate_limited_per_client_address(db_url: str) -> None:
    """Issue 25: a token lookup is a database query, and one client made 250 guesses a second.
    Past its burst an address gets 429 with Retry-After (before any lookup); others are not
    affected."""
    limits = ApiLimits(auth_failure_burst=5, auth_failures_per_s=0.01)
    async with service(db_url, workers=0, limits=limits) as svc, httpx2.AsyncClient() as http:
        url = f"{svc.url}/v1/agents"
        codes = [(await http.get(url, headers={"authorization": f"Bearer rlt_guess{i}"})).status_code for i in range(5)]
        assert codes == [401] * 5
        r = await http.get(url, headers={"authorization": "Bearer rlt_guess6"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert (await http.get(url)).status_code == 429  # (no token at all: the same address)
        assert (await http.get(f"{svc.url}/v1/health")).status_code == 200  # public routes are not limited
        other = httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address="127.0.0.2"))
        async with other:
            r = await other.get(url, headers={"authorization": f"Bearer {svc.token}"})
            assert r.status_code == 200  # another address is not affected


async def test_revoking_a_token_ends_its_open_event_streams_and_streams_have_a_lifetime(db_url: str) -> None:
    """Issue 25, defect 6: a revoked token's event streams went on (one never ended on its own)."""
    limits = ApiLimits(sse_recheck_s=0.2, sse_max_s=3.0)
    async with service(db_url, workers=1, limits=limits) as svc:
        svc.provider.gates["q 0"] = trio.Event()  # (the batch never ends on its own)
        agent_id = await svc.agent()
        batch = await svc.client.create_batch(agent_id, tasks(1))
        token_id, token = await svc.store.call(accounts.create_token, "main", "short-lived")
        events: list[str] = []
        with trio.fail_after(60):
            async with ServiceClient(svc.url, token) as client:
                async for event, _ in client.events(f"/v1/batches/{batch['batch_id']}/events"):
                    events.append(event)
                    if len(events) == 1:
                        await svc.store.call(accounts.revoke_token, token_id)
        assert events[0] == "progress" and events[-1] == "error"
        with trio.fail_after(60):
            ended = [event async for event, _ in svc.client.events(f"/v1/batches/{batch['batch_id']}/events")]
        assert ended[-1] == "end"  # its maximum lifetime
        svc.provider.release_all()
