"""What a client may send the service (issue 25, defects 3, 7, 8, 9): any text a database can
store is stored and read back, on both; what none can store is a 4xx naming the field at the
door, never a 500; a reused idempotency key and a misshapen version are refused by name."""

from __future__ import annotations

import json
from typing import Any

import httpx2
from test_service_e2e import (
    _post,
    endpoint,
    provider_key,  # noqa: F401  (the autouse fixture: the provider key and the policy file)
    service,
    tasks,
)

from rollouts.service import accounts, queue
from rollouts.service.catalog import ServiceCatalog
from rollouts.view.catalog import SampleQuery


async def _status(http: httpx2.AsyncClient, url: str, token: str, raw: bytes) -> tuple[int, str | None]:
    r = await _post(http, url, token, None, raw)
    assert r.status_code < 500, r.text
    return r.status_code, r.json()["error"].get("field")


async def test_text_no_database_stores_and_malformed_numbers_are_4xx_naming_the_field(db_url: str) -> None:
    """Defects 3 and 8: lone surrogates, NUL in names/ids/keys/prompts, deep nesting, huge numbers,
    NaN and a version number of 10^23 were 201s that crashed a worker, or 500s."""
    async with service(db_url, workers=0) as svc, httpx2.AsyncClient() as http:
        agents, batches = f"{svc.url}/v1/agents", f"{svc.url}/v1/batches"
        spec = json.dumps(endpoint(svc.srv.base_url))
        agent_id = await svc.agent()
        task = '{"task_id": "a", "user_message": "hi"}'

        def batch(**fields: str) -> bytes:
            body = {"agent_id": json.dumps(agent_id), "tasks": f"[{task}]", **fields}
            return ("{" + ", ".join(f'"{k}": {v}' for k, v in body.items()) + "}").encode()

        cases: list[tuple[str, bytes, tuple[int, str | None]]] = [
            (agents, f'{{"name": "x\\ud800", "endpoint": {spec}}}'.encode(), (422, "name")),
            (agents, f'{{"name": "x\\u0000", "endpoint": {spec}}}'.encode(), (422, "name")),
            (agents, f'{{"name": "x", "endpoint": {spec}, "system_prompt": "a\\u0000"}}'.encode(), (422, "system_prompt")),
            (batches, batch(tasks='[{"task_id": "a", "user_message": "\\udc00"}]'), (422, "tasks[0].user_message")),
            (batches, batch(tasks='[{"task_id": "a\\u0000", "user_message": "x"}]'), (422, "tasks[0].task_id")),
            (batches, batch(idempotency_key='"k\\u0000"'), (422, "idempotency_key")),
            (batches, batch(tasks='[{"task_id": "a", "user_message": "x", "context": {"k\\ud83d": 1}}]'),
             (422, "tasks[0].context")),
            (batches, batch(config='{"deadline_s": NaN}'), (400, "body")),
            (batches, batch(config='{"deadline_s": 1e999}'), (400, "body")),
            (batches, batch(config='{"parallelism": ' + "9" * 5000 + "}"), (400, "body")),
            (batches, batch(config='{"parallelism": 1e3}'), (422, "config.parallelism")),
            (batches, batch(tasks='[{"task_id": "a", "user_message": "x", "context": ' + "[" * 70 + "]" * 70 + "}]"),
             (400, "body")),
            (batches, b"[" * 100_000 + b"]" * 100_000, (400, "body")),
            (batches, batch(agent_version="100000000000000000000000"), (422, "agent_version")),
        ]  # fmt: skip
        for url, raw, want in cases:
            assert await _status(http, url, svc.token, raw) == want, raw[:120]
        for path in (
            f"/v1/agents/{agent_id}/versions/100000000000000000000000",
            f"/v1/agents/{agent_id}/versions/\u0661",
        ):
            r = await http.get(svc.url + path, headers={"authorization": f"Bearer {svc.token}"})
            assert (r.status_code, r.json()["error"]["field"]) == (422, "version"), path
        r = await _post(http, batches, svc.token, None, batch(config='{"deadline_s": "soon"}'))
        assert r.json()["error"]["message"] == "config.deadline_s: must be a number, not a string"
        assert (await svc.client.list_agents())[0]["name"] == "calc"  # nothing else was stored


async def test_nul_and_lone_surrogates_in_tasks_are_stored_read_back_and_listed(db_url: str) -> None:
    """Defects 3 and 7: a NUL in a task (PostgreSQL's jsonb refuses `\\u0000`) broke the
    workspace's UI batch lists for good; a lone surrogate that got past the door (a row written
    directly) crashed the worker's fingerprint hashing. Both run and read back exactly."""
    async with service(db_url, workers=1) as svc:
        agent_id = await svc.agent()
        text = "nul \x00 here: 7"
        batch = await svc.client.create_batch(
            agent_id, [{"task_id": "n", "user_message": text, "context": {"answer": "7", "note\x00": "a\x00b"}}],
            config={"score": "exact_match_tag"},
        )  # fmt: skip
        done = await svc.client.wait_batch(batch["batch_id"])
        result = done["results"][0]
        assert result["status"] == "completed" and result["score"]["reward"] == 1.0
        assert result["trajectory"]["messages"][1]["content"] == text
        ws = await svc.store.read(accounts.workspace_for_token, svc.token)
        assert ws is not None
        summary, _ = await svc.store.call(
            queue.create_batch, workspace_id=ws, agent_id=agent_id, agent_version=1, system_prompt="",
            tasks=[("s", {"user_message": "half \ud83d 5", "context": {"answer": "5"}})],
            config={"score": "exact_match_tag"}, parallelism=1, timeout_per_task_ms=30_000, deadline_s=60.0,
        )  # fmt: skip
        past = await svc.client.wait_batch(summary["batch_id"])
        assert past["results"][0]["status"] == "completed", past["results"][0]
        user = [m for m in past["results"][0]["trajectory"]["messages"] if m["role"] == "user"]
        assert user[0]["content"] == "half \ud83d 5"
        catalog = ServiceCatalog(svc.store, ws)
        runs = await catalog.list_eval_runs()
        assert {r.run_id for r in runs} == {batch["batch_id"], summary["batch_id"]}
        for run in runs:
            for sort in ("reward", "tokens", "turns", "cost", "metric:exact_match_tag"):
                page = await catalog.list_samples(run.run_id, SampleQuery(sort=sort))
                assert len(page.items) == 1
            page = await catalog.list_samples(run.run_id, SampleQuery(meta=("answer", "7")))
            assert len(page.items) == (1 if run.run_id == batch["batch_id"] else 0)
            page = await catalog.list_samples(run.run_id, SampleQuery(text="answer"))
            assert len(page.items) == 1


async def test_an_idempotency_key_reused_with_another_body_is_409(db_url: str) -> None:
    """Defect 9: the key reused for a different request silently returned the first batch."""
    async with service(db_url, workers=0) as svc, httpx2.AsyncClient() as http:
        agent_id = await svc.agent()
        first = await svc.client.create_batch(agent_id, tasks(2), idempotency_key="k")
        again = await svc.client.create_batch(agent_id, tasks(2), idempotency_key="k")
        assert again["batch_id"] == first["batch_id"]  # a retry: the same batch
        body: dict[str, Any] = {"agent_id": agent_id, "tasks": tasks(3), "idempotency_key": "k"}
        r = await _post(http, f"{svc.url}/v1/batches", svc.token, body)
        assert r.status_code == 409 and r.json()["error"]["field"] == "idempotency_key" and "'k'" in r.text
        body["tasks"] = tasks(2)
        body["system_prompt"] = "other"
        assert (await _post(http, f"{svc.url}/v1/batches", svc.token, body)).status_code == 409


async def test_post_versions_refuses_unknown_fields_a_missing_parent_and_a_source(db_url: str) -> None:
    """Defect 9: a seed-shaped body got 201 and dropped the prompt; any parent_version and
    source were taken as given."""
    async with service(db_url, workers=0) as svc, httpx2.AsyncClient() as http:
        agent_id = await svc.agent()
        url = f"{svc.url}/v1/agents/{agent_id}/versions"
        cases: list[tuple[dict[str, Any], tuple[int, str]]] = [
            ({"seed_prompt": "Be brief."}, (422, "seed_prompt")),
            ({"system_prompt": "x", "source": "gepa"}, (422, "source")),
            ({"system_prompt": "x", "parent_version": 7}, (404, "parent_version")),
        ]
        for body, want in cases:
            r = await _post(http, url, svc.token, body)
            assert (r.status_code, r.json()["error"]["field"]) == want, body
        r = await _post(http, f"{svc.url}/v1/agents", svc.token, {"name": "n", "endpoint": {}, "prompt": "x"})
        assert (r.status_code, r.json()["error"]["field"]) == (422, "prompt")
        v2 = await svc.client.create_version(agent_id, system_prompt="Two.")
        v3 = await svc.client.create_version(agent_id, max_turns=3, parent_version=2)
        assert (v2["source"], v3["source"], v3["parent_version"]) == ("api", "api", 2)
        assert v3["system_prompt"] == "Two."  # the fields it does not give: its parent's
        assert [v["version"] for v in await svc.client.list_versions(agent_id)] == [1, 2, 3]
