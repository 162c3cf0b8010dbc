"""The viewer's `Catalog` over the service's database: batches as eval runs, GEPA jobs as GEPA runs.

    catalog = ServiceCatalog(store, workspace_id)    # the UI makes one per request (catalog_for)
    page = await catalog.list_samples(batch_id, SampleQuery(sort="reward", descending=True))

Every query is filtered by the catalog's workspace (the one the request's session names):
another workspace's batch or job is `NotFound`, as a missing one.

A batch's tasks are its samples: score (the result's reward), status, turns, tokens, cost and
execution time; filtering, sorting and paging run in SQL on both SQLite and PostgreSQL, compiled
by the viewer's one query compiler (rollouts.view.sql) from `sample_columns`, so a filter gives
the same rows here as in `rollouts view` (JSON fields of the stored result are read with each
dialect's JSON functions). A GEPA job's
candidates, lineage, Pareto front and history come from its checkpoint (the engine's state, kept
in the job row); reflections are not in the checkpoint: they are read from the job's run
directories under `gepa_dir` (the `data_dir` of the server's GEPA jobs: every run of the job on
this server, resumed ones included), so a job run by another server shows none. The service has
no sessions: the sessions list is empty (and the UI has no link to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import trio

from rollouts.eval.sample import Sample
from rollouts.service._batch_runs import (
    batch_detail,
    batch_runs,
    batch_sample,
    batch_samples,
    batch_version,
    batches_sharing_tasks,
    compare_batches,
    runs_version,
)
from rollouts.service._gepa_job_runs import job_detail, job_reflections, job_rows, job_version, jobs_version
from rollouts.service._task_sql import sample_columns
from rollouts.service.store import Store
from rollouts.view.catalog import (
    Comparison,
    EvalRunDetail,
    EvalRunRow,
    EvalSetDetail,
    EvalSetRow,
    GepaRunDetail,
    GepaRunRow,
    NotFound,
    Page,
    Reflection,
    SampleQuery,
    SampleRow,
    SessionDetail,
    SessionQuery,
    SessionRow,
    TrainingRunDetail,
    TrainingRunRow,
    clamp_page,
)

__all__ = ["ServiceCatalog", "sample_columns"]


class ServiceCatalog:
    """The viewer's `Catalog` over a service `Store`, for one workspace: every query is scoped
    to `workspace_id` (another workspace's batch or job is NotFound, as a missing one). The UI
    makes one per request, for the workspace its session cookie names."""

    def __init__(self, store: Store, workspace_id: str, *, gepa_dir: Path | None = None) -> None:
        if not workspace_id:
            raise ValueError("a ServiceCatalog needs the workspace it reads")
        self.store = store
        self.workspace_id = workspace_id
        self.gepa_dir = gepa_dir  # where this server's GEPA jobs keep their run directories

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]:
        offset, limit = clamp_page(query.offset, query.limit)
        return Page((), 0, offset, limit)

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail:
        raise NotFound(f"the service has no session {session_id}")

    async def list_eval_runs(self) -> Sequence[EvalRunRow]:
        return await self.store.read(batch_runs, self.workspace_id)

    async def get_eval_run(self, run_id: str) -> EvalRunDetail:
        return await self.store.read(batch_detail, self.workspace_id, run_id)

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]:
        return await self.store.read(batch_samples, self.workspace_id, run_id, query)

    async def get_sample(self, run_id: str, sample_id: str) -> Sample:
        return await self.store.read(batch_sample, self.workspace_id, run_id, sample_id)

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison:
        return await self.store.read(compare_batches, self.workspace_id, run_a, run_b, offset, limit)

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        return await self.store.read(batches_sharing_tasks, self.workspace_id, run_id)

    async def list_eval_sets(self) -> Sequence[EvalSetRow]:
        return ()  # (eval sets are directories of `rollouts eval-set`; the service keeps batches)

    async def get_eval_set(self, set_id: str) -> EvalSetDetail:
        raise NotFound(f"the service has no eval set {set_id}")

    async def list_training_runs(self) -> Sequence[TrainingRunRow]:
        return ()  # (training runs are directories of `rollouts train`)

    async def get_training_run(self, run_id: str) -> TrainingRunDetail:
        raise NotFound(f"the service has no training run {run_id}")

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]:
        return await self.store.read(job_rows, self.workspace_id)

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail:
        return await self.store.read(job_detail, self.workspace_id, run_id)

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]:
        await self.get_gepa_run(run_id)  # NotFound for another workspace's job
        if self.gepa_dir is None:
            return ()
        assert "/" not in run_id and not run_id.startswith("."), run_id  # (a job id of this workspace)
        return await trio.to_thread.run_sync(job_reflections, self.gepa_dir / run_id, iteration)

    async def runs_version(self) -> str:
        """Changes when any batch in the batches list changes (see `runs_version`)."""
        return await self.store.read(runs_version, self.workspace_id)

    async def jobs_version(self) -> str:
        """Changes when any GEPA job of the workspace changes."""
        return await self.store.read(jobs_version, self.workspace_id)

    async def version(self, kind: Literal["session", "eval", "gepa", "training"], item_id: str) -> str:
        if kind == "eval":
            return await self.store.read(batch_version, self.workspace_id, item_id)
        if kind == "gepa":
            return await self.store.read(job_version, self.workspace_id, item_id)
        raise NotFound(f"the service has no {kind} {item_id}")
