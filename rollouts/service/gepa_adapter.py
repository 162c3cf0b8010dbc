"""GEPA over the rollout service: a GEPA adapter whose rollouts run as service batches.

    async with ServiceClient(url, token) as client:
        adapter = ServiceAdapter.over_client(client, agent_id, score="exact_match_tag")
        result = await optimize("You are ...", trainset, valset, adapter=adapter,
                                reflection_endpoint=reflector, max_metric_calls=200)

Each evaluation is one batch (one task per instance, the candidate's `system_prompt` as the
batch's system prompt), scored by the workers with the batch's score function. The budget is
exact: every instance is one task, run once (a batch is sent with an idempotency key derived
from the evaluation, so a retried request or a resumed run reuses it instead of running it
again). A task that did not complete (failed, timeout, cancelled, or still unfinished at the
batch deadline) scores 0.0 with feedback saying so, never a silent zero.

An instance (a row of the trainset or valset) is a task: `{"user_message": ...}` or
`{"messages": [...]}`, with an optional `context` (where scorers find `answer`); other fields go
into the context.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from rollouts.dtypes import Message, Trajectory
from rollouts.gepa.adapter import Candidate, EvaluationBatch, ReflectiveDataset
from rollouts.gepa.rollouts_adapter import render_trajectory

__all__ = ["RunBatch", "ServiceAdapter", "as_task"]

RunBatch = Callable[[list[dict[str, Any]], str, str], Awaitable[list[dict[str, Any] | None]]]
"""(tasks, system prompt, idempotency key) -> one result per task (None: no result)."""


def as_task(row: Mapping[str, Any], position: int) -> dict[str, Any]:
    """The batch task for a dataset row (task_id = its position in the evaluation)."""
    task: dict[str, Any] = {"task_id": str(position)}
    if "messages" in row:
        task["messages"] = list(row["messages"])
    else:
        text = row.get("user_message", row.get("question", row.get("prompt", row.get("input"))))
        if not isinstance(text, str):
            raise ValueError(
                f"instance {position} has no user_message (or messages, question, prompt, input) string: "
                f"keys {sorted(row)}"
            )
        task["user_message"] = text
    context = dict(row.get("context") or {})
    context.update({k: v for k, v in row.items() if k not in ("messages", "user_message", "context", "task_id")})
    if context:
        task["context"] = context
    return task


def _feedback(result: Mapping[str, Any] | None) -> str:
    if result is None:
        return "The run did not complete (no result before the batch deadline)"
    if result["status"] != "completed":
        return f"The run did not complete ({result['status']}): {result.get('error') or 'no error recorded'}"
    score = result.get("score")
    if not score:
        return "(no score: the batch has no score function)"
    texts = [str(m["metadata"]["feedback"]) for m in score.get("metrics", []) if m.get("metadata", {}).get("feedback")]
    return "\n".join(texts) or "(the score function gave no feedback)"


def _messages(result: Mapping[str, Any] | None) -> list[Message]:
    traj = (result or {}).get("trajectory")
    return list(Trajectory.from_dict(traj).messages) if traj else []


class ServiceAdapter:
    """A GEPA adapter running evaluations as service batches (see the module docstring).

    run_batch: runs one batch and returns its results in task order (`over_client` builds one
    from a ServiceClient; the server's GEPA jobs build one over the store).
    key_prefix: makes idempotency keys unique to this run (a resumed run must use the same).
    """

    def __init__(
        self, run_batch: RunBatch, *, system_component: str = "system_prompt", key_prefix: str = "gepa"
    ) -> None:
        self.run_batch = run_batch
        self.system_component = system_component
        self.key_prefix = key_prefix
        self.batches = 0
        self.tasks_run = 0

    @classmethod
    def over_client(
        cls,
        client: Any,
        agent_id: str,
        *,
        score: str,
        agent_version: int | None = None,
        parallelism: int = 5,
        timeout_per_task_ms: int = 30_000,
        poll_timeout_s: float = 600.0,
        key_prefix: str | None = None,
    ) -> ServiceAdapter:
        """An adapter whose batches go through `client` (a ServiceClient) to agent `agent_id`."""
        import secrets

        async def run_batch(tasks: list[dict[str, Any]], system_prompt: str, key: str) -> list[dict[str, Any] | None]:
            created = await client.create_batch(
                agent_id,
                tasks,
                system_prompt=system_prompt,
                agent_version=agent_version,
                config={
                    "parallelism": parallelism,
                    "timeout_per_task_ms": timeout_per_task_ms,
                    "deadline_s": poll_timeout_s,
                    "score": score,
                },
                idempotency_key=key,
            )
            done = await client.wait_batch(created["batch_id"], timeout_s=poll_timeout_s + 30.0)
            by_id = {r["task_id"]: r for r in done["results"]}
            return [by_id.get(t["task_id"]) for t in tasks]

        return cls(run_batch, key_prefix=key_prefix or f"gepa-{secrets.token_hex(6)}")

    async def evaluate(
        self,
        batch: Sequence[Mapping[str, Any]],
        candidate: Candidate,
        capture_traces: bool = False,
        *,
        eval_id: str | None = None,
    ) -> EvaluationBatch:
        extra = sorted(set(candidate) - {self.system_component})
        if extra:
            raise ValueError(
                f"ServiceAdapter evolves only the {self.system_component!r} component; the candidate also has {extra}"
            )
        tasks = [as_task(row, i) for i, row in enumerate(batch)]
        prompt = candidate.get(self.system_component, "")
        digest = hashlib.sha256(json.dumps([prompt, tasks], sort_keys=True).encode()).hexdigest()[:24]
        key = f"{self.key_prefix}:{eval_id or 'eval'}:{digest}"
        results = await self.run_batch(tasks, prompt, key)
        assert len(results) == len(tasks), "run_batch must return one result (or None) per task"
        self.batches += 1
        self.tasks_run += len(tasks)
        scores = [
            float((r.get("score") or {}).get("reward", 0.0)) if r is not None and r["status"] == "completed" else 0.0
            for r in results
        ]
        outputs = []
        for r in results:
            msgs = _messages(r)
            outputs.append(next((m.text for m in reversed(msgs) if m.role == "assistant"), ""))
        traces = [{"task": task, "result": r, "feedback": _feedback(r)} for task, r in zip(tasks, results, strict=True)]
        objectives = [
            {m["name"]: float(m["value"]) for m in ((r or {}).get("score") or {}).get("metrics", [])} for r in results
        ]
        return EvaluationBatch(
            outputs=outputs,
            scores=scores,
            trajectories=traces if capture_traces else None,
            objective_scores=objectives,
            feedback=[_feedback(r) for r in results],
        )

    def make_reflective_dataset(
        self, candidate: Candidate, eval_batch: EvaluationBatch, components_to_update: Sequence[str]
    ) -> ReflectiveDataset:
        assert eval_batch.trajectories is not None, "make_reflective_dataset needs an evaluation with traces"
        records = []
        for trace, score in zip(eval_batch.trajectories, eval_batch.scores, strict=True):
            task, result = trace["task"], trace["result"]
            msgs = _messages(result)
            first_reply = next((i for i, m in enumerate(msgs) if m.role == "assistant"), len(msgs))
            inputs = task.get("user_message") or render_trajectory([Message.from_dict(m) for m in task["messages"]])
            records.append(
                {
                    "Inputs": inputs,
                    "Agent trajectory": render_trajectory(msgs[first_reply:]) or "(no reply)",
                    "Score": f"{score:.4g}",
                    "Feedback": trace["feedback"],
                }
            )
        return {name: records for name in components_to_update}
