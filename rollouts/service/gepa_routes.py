"""The GEPA job routes: start a job on an agent, read its status, stream its progress, cancel it.

Handlers of `(ctx, request, workspace)` like the API's (rollouts.service.api mounts them); jobs
are stored here and run by the server's `rollouts.service.gepa_jobs.GEPAJobs` (`ctx.gepa`):
without one the routes answer 503.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rollouts.service import jobs
from rollouts.service.requests import ApiError, not_found, read_json
from rollouts.service.routing import ApiContext, guarded_stream, iso_times, ok, progress_stream

if TYPE_CHECKING:
    from rollouts.service.gepa_jobs import GEPAJobs

__all__ = ["cancel_job", "create_job", "get_job", "job_events"]

_TERMINAL = ("completed", "failed", "cancelled")


def _jobs(ctx: ApiContext) -> GEPAJobs:
    if ctx.gepa is None:
        raise ApiError(503, "unavailable", "this server does not run GEPA jobs")
    return ctx.gepa


async def create_job(ctx: ApiContext, request: Request, ws: str) -> Response:
    runner = _jobs(ctx)
    body = await read_json(request, ctx.limits.max_body_bytes)
    job = await runner.start(ws, request.path_params["agent_id"], body, ctx.limits.max_tasks)
    return ok(job, 201)


async def get_job(ctx: ApiContext, request: Request, ws: str) -> Response:
    _jobs(ctx)
    job = await ctx.store.read(jobs.get_job, ws, request.path_params["job_id"])
    if job is None:
        raise not_found("GEPA job")
    return ok(job)


async def cancel_job(ctx: ApiContext, request: Request, ws: str) -> Response:
    _jobs(ctx)
    jid = request.path_params["job_id"]
    if not await ctx.store.call(jobs.cancel_job, ws, jid):
        raise not_found("GEPA job")
    job = await ctx.store.read(jobs.get_job, ws, jid)
    return ok(job)


async def job_events(ctx: ApiContext, request: Request, ws: str) -> Response:
    _jobs(ctx)
    jid = request.path_params["job_id"]
    if await ctx.store.read(jobs.get_job, ws, jid) is None:
        raise not_found("GEPA job")

    async def poll() -> dict[str, Any] | None:
        job = await ctx.store.read(jobs.get_job, ws, jid)
        return iso_times(job) if job is not None else None

    return StreamingResponse(
        guarded_stream(
            ctx,
            request,
            ws,
            poll,
            lambda poll: progress_stream(poll, lambda j: j["status"] in _TERMINAL, ctx.limits.sse_poll_s * 2),
        ),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )
