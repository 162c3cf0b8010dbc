"""A service database with something to look at: two workspaces, agents with versions, batches
with finished and pending tasks (one trajectory carries a `<script>`), GEPA jobs (one with a
checkpoint). Written through the service's own SQL functions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from _view_data import gepa_result

from rollouts.dtypes import Message, Trajectory, Usage
from rollouts.gepa.budget import Budget
from rollouts.gepa.state import GEPAState
from rollouts.service import accounts, jobs, queue
from rollouts.service.accounts import VersionSpec
from rollouts.service.store import Store

XSS = "<script>alert('pwned')</script>"
ENDPOINT = {"model": "openai-compatible/fake", "api_base": "http://127.0.0.1:9/v1", "api_key_env": "NONE"}


@dataclass
class UiData:
    token_a: str
    token_b: str
    ws_a: str
    ws_b: str
    agent_a: str
    agent_b: str
    batch: str  # workspace a: t0..t2 completed, t3 failed, t4 and t5 queued
    batch2: str  # workspace a: the same task ids, other scores (compare)
    batch_b: str  # workspace b
    job: str  # workspace a, with a checkpoint of 4 candidates
    job_b: str  # workspace b


def result(reward: float, text: str, tokens: int = 10, turns: int = 1) -> dict[str, Any]:
    traj = Trajectory(messages=(Message(role="user", content="q"), Message(role="assistant", content=text)))
    return {
        "trajectory": traj.to_dict(),
        "score": {
            "metrics": [{"name": "exact_match", "value": reward, "weight": 1.0, "metadata": {}}],
            "reward": reward,
        },
        "stop_reason": "completed",
        "usage": Usage(input_tokens=tokens, output_tokens=tokens, cost_usd=tokens / 1000).to_dict(),
        "turns": turns,
    }


async def finish(store: Store, batch: str, task: str, reward: float, text: str, **kw: Any) -> None:
    await store.call(queue.finish, batch, task, status="completed", result=result(reward, text, **kw), error=None,
                     execution_time_ms=100 + int(reward * 10))  # fmt: skip


def gepa_checkpoint(n: int) -> str:
    r = gepa_result(n)
    state = GEPAState(valset_size=4, candidates=list(r.candidates), history=list(r.history), iteration=n - 1,
                      budget=Budget(spent=r.metric_calls))  # fmt: skip
    return json.dumps(state.to_dict())


async def new_batch(store: Store, ws: str, agent: str, n: int, key: str) -> str:
    tasks = [(f"t{i}", {"user_message": f"what is {i} + {i}?", "context": {"answer": str(2 * i), "level": str(i % 2)}})
             for i in range(n)]  # fmt: skip
    summary, _ = await store.call(
        queue.create_batch, workspace_id=ws, agent_id=agent, agent_version=1, system_prompt=f"Be brief. {XSS}",
        tasks=tasks, config={"score": "exact_match_tag"}, parallelism=2, timeout_per_task_ms=30_000,
        deadline_s=3600.0, idempotency_key=key,
    )  # fmt: skip
    return str(summary["batch_id"])


async def make_ui_data(store: Store) -> UiData:
    _, token_a = await store.call(accounts.create_token, "alpha")
    _, token_b = await store.call(accounts.create_token, "beta")
    ws_a = await store.call(accounts.ensure_workspace, "alpha")
    ws_b = await store.call(accounts.ensure_workspace, "beta")
    spec = VersionSpec(endpoint=ENDPOINT, system_prompt="Be brief.")
    agent_a = (await store.call(accounts.create_agent, ws_a, "solver", spec))["agent_id"]
    agent_b = (await store.call(accounts.create_agent, ws_b, "other", spec))["agent_id"]
    better = VersionSpec(endpoint=ENDPOINT, system_prompt=f"Be brief and exact. {XSS}")
    await store.call(accounts.add_version, ws_a, agent_a, better, source="gepa", parent_version=1)

    batch = await new_batch(store, ws_a, agent_a, 6, "one")
    await finish(store, batch, "t0", 1.0, f"The answer is <answer>0</answer> {XSS}", tokens=30, turns=3)
    await finish(store, batch, "t1", 0.0, "The answer is <answer>3</answer>", tokens=5)
    await finish(store, batch, "t2", 1.0, "The answer is <answer>4</answer>", tokens=20, turns=2)
    await store.call(queue.finish, batch, "t3", status="failed", result=None, error="provider error 500",
                     execution_time_ms=7)  # fmt: skip
    batch2 = await new_batch(store, ws_a, agent_a, 6, "two")
    for i, reward in enumerate([0.0, 1.0, 1.0, 1.0, 0.0, 0.0]):
        await finish(store, batch2, f"t{i}", reward, "x")
    batch_b = await new_batch(store, ws_b, agent_b, 2, "b")

    cfg = {"trainset": [{"task_id": "0", "user_message": "1 + 1"}], "score": "exact_match_tag"}
    job = (await store.call(jobs.create_job, ws_a, agent_a, 1, cfg, 100, False))["job_id"]
    claimed = await store.call(jobs.claim_job, "test-owner", 3600.0)
    assert claimed is not None and claimed["job_id"] == job
    await store.call(jobs.save_progress, job, "test-owner", metric_calls=22, best_score=1.0, candidates=4,
                     checkpoint=gepa_checkpoint(4))  # fmt: skip
    job_b = (await store.call(jobs.create_job, ws_b, agent_b, 1, cfg, 50, False))["job_id"]
    return UiData(token_a, token_b, ws_a, ws_b, agent_a, agent_b, batch, batch2, batch_b, job, job_b)
