"""The GEPA job routes: start a job on an agent, read its status, stream its progress, cancel it.

Jobs are run by `rollouts.service.gepa_jobs.GEPAJobs` in the server process; without one the
routes answer 503.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rollouts.service.requests import ApiError

__all__ = ["cancel_job", "create_job", "get_job", "job_events"]


def _jobs(ctx: Any) -> Any:
    jobs = ctx.extra.get("gepa")
    if jobs is None:
        raise ApiError(503, "unavailable", "this server does not run GEPA jobs")
    return jobs


async def create_job(ctx: Any, request: Request, ws: str) -> Response:
    return await _jobs(ctx).create_route(ctx, request, ws)  # type: ignore[no-any-return]


async def get_job(ctx: Any, request: Request, ws: str) -> Response:
    return await _jobs(ctx).get_route(ctx, request, ws)  # type: ignore[no-any-return]


async def cancel_job(ctx: Any, request: Request, ws: str) -> Response:
    return await _jobs(ctx).cancel_route(ctx, request, ws)  # type: ignore[no-any-return]


async def job_events(ctx: Any, request: Request, ws: str) -> Response:
    return await _jobs(ctx).events_route(ctx, request, ws)  # type: ignore[no-any-return]
