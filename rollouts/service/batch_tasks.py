"""How the service's workers run a task of an API batch: with its batch's spec (the agent
version's endpoint and environment, the batch's system prompt, score function and time limits),
read once per batch, through `execution.run_task`.

    await Worker(store, run_task=BatchTasks(store, policy)).run()   # (the Worker's default: the built-in policy)

`policy` is the operator's (rollouts.service.policy): a batch whose endpoint, environment or
score it does not allow fails its tasks with the reason, without reading a key or importing.
"""

from __future__ import annotations

import time

import trio

from rollouts.errors import RolloutsError
from rollouts.service import queue
from rollouts.service.execution import (
    TaskOutcome,
    TaskSetting,
    endpoint_from_spec,
    resolve_environment,
    resolve_score,
    run_task,
    task_setting,
)
from rollouts.service.policy import ServicePolicy
from rollouts.service.queue import BatchSpec, ClaimedTask
from rollouts.service.store import Store

__all__ = ["BatchTasks"]


class BatchTasks:
    """Runs claimed tasks of API batches (a `Worker`'s `run_task`): each batch's spec is read
    once, and its `TaskSetting` (the EvalConfig its tasks share) made at its first task."""

    def __init__(self, store: Store, policy: ServicePolicy | None = None) -> None:
        self.store = store
        self.policy = policy or ServicePolicy()
        self._specs: dict[str, BatchSpec] = {}
        self._spec_reads: dict[str, trio.Event] = {}  # batches whose spec is being read
        self._settings: dict[str, TaskSetting] = {}  # per batch: made at its first task

    async def spec(self, batch_id: str) -> BatchSpec:
        """The batch's spec, read once per batch: the tasks of a claim start together, and all
        but the first wait for its read (each reading it too cost a query per task)."""
        spec = self._specs.get(batch_id)
        while spec is None:
            reading = self._spec_reads.get(batch_id)
            if reading is not None:
                await reading.wait()  # (if that read failed, this task reads it itself)
                spec = self._specs.get(batch_id)
                continue
            reading = self._spec_reads[batch_id] = trio.Event()
            try:
                found = await self.store.read(queue.batch_spec, batch_id)
                assert found is not None, f"claimed a task of batch {batch_id}, which does not exist"
                spec = self._specs[batch_id] = found
                if len(self._specs) > 1024:
                    self._specs.pop(next(iter(self._specs)))
            finally:
                del self._spec_reads[batch_id]
                reading.set()
        return spec

    async def __call__(self, task: ClaimedTask, deadline: float) -> TaskOutcome:
        """Run `task` within its batch's per-task limit, cut to `deadline` (the batch deadline,
        on trio's clock)."""
        started = time.perf_counter()
        spec = await self.spec(task.batch_id)
        per_task = spec.timeout_per_task_ms / 1000
        to_deadline = deadline - trio.current_time()
        limit, reason = (
            (per_task, "timeout_per_task_ms") if per_task <= to_deadline else (to_deadline, "batch deadline")
        )
        setting = self._settings.get(task.batch_id)
        if setting is None:
            try:
                setting = task_setting(
                    endpoint=endpoint_from_spec(spec.endpoint, spec.config.get("model"), self.policy),
                    system_prompt=spec.system_prompt,
                    max_turns=spec.max_turns,
                    time_limit_s=per_task,
                    score_fn=resolve_score(spec.config.get("score"), self.policy),
                    environment_factory=resolve_environment(spec.environment, self.policy),
                )
            except (RolloutsError, ValueError, TypeError) as e:
                ms = int((time.perf_counter() - started) * 1000)
                return TaskOutcome("failed", None, f"cannot run the agent on this worker: {e}", ms)
            self._settings[task.batch_id] = setting
            if len(self._settings) > 64:
                self._settings.pop(next(iter(self._settings)))
        return await run_task(task.input, task.task_id, setting, time_limit_s=limit, timeout_reason=reason)
