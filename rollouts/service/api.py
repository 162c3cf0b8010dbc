"""The HTTP API: a Starlette app (ASGI, served under trio by hypercorn), JSON, versioned paths.

Every `/v1/` route but `/v1/health` and `/v1/openapi.json` needs `Authorization: Bearer <token>`
and sees only the token's workspace: another workspace's agent, batch or job is 404, exactly as
one that does not exist. A missing, malformed, unknown, revoked or expired token is 401 with the
same body every time. Bad input is a 4xx whose JSON error names the field; bodies over
`max_body_bytes` are 413. Times are ISO 8601 (UTC). See `rollouts.service.openapi` for the schema.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollouts.service import accounts, gepa_routes, queue
from rollouts.service.execution import default_task_timeout_ms
from rollouts.service.policy import PolicyError, ServicePolicy
from rollouts.service.progress import BatchChanges
from rollouts.service.requests import (
    ApiError,
    integer,
    invalid,
    known_fields,
    not_found,
    number,
    obj,
    parse_score,
    parse_tasks,
    read_json,
    string,
    version_spec,
)
from rollouts.service.routing import (
    ApiContext,
    ApiLimits,
    Handler,
    JSONBody,
    guarded_stream,
    iso,
    iso_times,
    ok,
    progress_stream,
    route,
)
from rollouts.service.store import Store

if TYPE_CHECKING:
    from rollouts.service.gepa_jobs import GEPAJobs

__all__ = ["ApiLimits", "create_app"]

_log = logging.getLogger("rollouts.service.api")
_MAX_VERSION = 2**31 - 1  # (an INTEGER column: larger numbers exist nowhere)


def _path_int(request: Request, name: str) -> int:
    raw = str(request.path_params[name])
    if not raw.isascii() or not raw.isdigit() or len(raw) > 10 or not 1 <= int(raw) <= _MAX_VERSION:
        raise invalid(name, f"must be a version number (1, 2, ... up to {_MAX_VERSION}), got {raw[:40]!r}")
    return int(raw)


def _query_int(request: Request, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18 or not minimum <= int(raw) <= maximum:
        raise invalid(name, f"must be an integer between {minimum} and {maximum}, got {raw!r}")
    return int(raw)


# ---- agents -------------------------------------------------------------------------------------


async def create_agent(ctx: ApiContext, request: Request, ws: str) -> Response:
    body = await read_json(request, ctx.limits.max_body_bytes)
    known_fields(body, ("name", *_VERSION_FIELDS))
    name = string(body, "name", required=True, non_empty=True, max_len=200)
    assert name is not None
    spec = version_spec(body, None, ctx.policy)
    return ok(await ctx.store.call(accounts.create_agent, ws, name, spec), 201)


async def list_agents(ctx: ApiContext, request: Request, ws: str) -> Response:
    return ok({"agents": await ctx.store.read(accounts.list_agents, ws)})


async def get_agent(ctx: ApiContext, request: Request, ws: str) -> Response:
    agent = await ctx.store.read(accounts.get_agent, ws, request.path_params["agent_id"])
    if agent is None:
        raise not_found("agent")
    return ok(agent)


async def list_versions(ctx: ApiContext, request: Request, ws: str) -> Response:
    versions = await ctx.store.read(accounts.list_versions, ws, request.path_params["agent_id"])
    if versions is None:
        raise not_found("agent")
    return ok({"versions": versions})


_VERSION_FIELDS = ("endpoint", "environment", "system_prompt", "max_turns", "tags")


async def create_version(ctx: ApiContext, request: Request, ws: str) -> Response:
    """A new version: the fields the body gives, the others taken from `parent_version` (default:
    the active version). `source` is the service's ("api"; "gepa" for a GEPA job's)."""
    agent_id = request.path_params["agent_id"]
    body = await read_json(request, ctx.limits.max_body_bytes)
    if "source" in body:
        raise invalid("source", 'is set by the service ("api" for a version made through this route), not by a request')
    known_fields(body, (*_VERSION_FIELDS, "parent_version"))
    parent = integer(body, "parent_version", minimum=1, maximum=_MAX_VERSION)
    base = await ctx.store.read(accounts.get_version, ws, agent_id, parent)
    if base is None:
        if parent is not None and await ctx.store.read(accounts.get_agent, ws, agent_id) is not None:
            raise not_found(f"version {parent} of agent {agent_id}", "parent_version")
        raise not_found("agent")
    spec = version_spec(body, base, ctx.policy)
    version = await ctx.store.call(
        accounts.add_version, ws, agent_id, spec, source="api", parent_version=base["version"]
    )
    if version is None:
        raise not_found("agent")
    return ok(version, 201)


async def get_version(ctx: ApiContext, request: Request, ws: str) -> Response:
    v = await ctx.store.read(accounts.get_version, ws, request.path_params["agent_id"], _path_int(request, "version"))
    if v is None:
        raise not_found("agent version")
    return ok(v)


async def promote_version(ctx: ApiContext, request: Request, ws: str) -> Response:
    v = await ctx.store.call(
        accounts.promote_version, ws, request.path_params["agent_id"], _path_int(request, "version")
    )
    if v is None:
        raise not_found("agent version")
    return ok(v)


# ---- batches ------------------------------------------------------------------------------------


async def create_batch(ctx: ApiContext, request: Request, ws: str) -> Response:
    body = await read_json(request, ctx.limits.max_body_bytes)
    known_fields(body, ("agent_id", "agent_version", "system_prompt", "idempotency_key", "tasks", "config"))
    agent_id = string(body, "agent_id", required=True, non_empty=True, max_len=100)
    assert agent_id is not None
    wanted = integer(body, "agent_version", minimum=1, maximum=_MAX_VERSION)
    system_prompt = string(body, "system_prompt", max_len=200_000)
    key = string(body, "idempotency_key", max_len=200, non_empty=True)
    tasks = parse_tasks(body, "tasks", ctx.limits.max_tasks)
    config = obj(body, "config") or {}
    parallelism = integer(config, "parallelism", prefix="config.", minimum=1, maximum=100_000) or 5
    timeout_ms = integer(config, "timeout_per_task_ms", prefix="config.", minimum=1, maximum=86_400_000)
    deadline = number(config, "deadline_s", prefix="config.", minimum=0.001, maximum=ctx.limits.max_deadline_s)
    model = string(config, "model", prefix="config.", max_len=200, non_empty=True)
    score = parse_score(config, prefix="config.", policy=ctx.policy)
    unknown = sorted(set(config) - {"parallelism", "timeout_per_task_ms", "deadline_s", "model", "score"})
    if unknown:
        raise invalid(
            f"config.{unknown[0]}", "unknown setting; known: deadline_s, model, parallelism, score, timeout_per_task_ms"
        )
    version = await ctx.store.read(accounts.get_version, ws, agent_id, wanted)
    if version is None:
        if wanted is not None and await ctx.store.read(accounts.get_agent, ws, agent_id) is not None:
            raise not_found(f"version {wanted} of agent {agent_id}", "agent_version")
        raise not_found(f"agent {agent_id}", "agent_id")
    if timeout_ms is None:  # (what the model needs: a local model takes minutes where an API takes seconds)
        timeout_ms = default_task_timeout_ms({**version["endpoint"], **({"model": model} if model else {})})
    try:  # (the version's endpoint as this batch runs it: its model may be replaced)
        ctx.policy.check_endpoint(version["endpoint"], "endpoint", model)
    except PolicyError as e:
        raise invalid("config.model" if model else f"agent_version.{e.field}", e.reason) from None
    stored_config = {"parallelism": parallelism, "timeout_per_task_ms": timeout_ms, "model": model, "score": score}
    summary, created = await ctx.store.call(
        queue.create_batch,
        workspace_id=ws,
        agent_id=agent_id,
        agent_version=version["version"],
        system_prompt=system_prompt if system_prompt is not None else version["system_prompt"],
        tasks=tasks,
        config={k: v for k, v in stored_config.items() if v is not None},
        parallelism=parallelism,
        timeout_per_task_ms=timeout_ms,
        deadline_s=deadline or ctx.limits.default_deadline_s,
        idempotency_key=key,
        request_digest=_digest(body) if key is not None else None,
    )
    if summary is None:
        raise ApiError(
            409,
            "conflict",
            f"idempotency_key {key!r} was used for a batch with a different request: a retry sends the same body, "
            "a new batch a new key",
            "idempotency_key",
        )
    return ok(summary, 201 if created else 200)


def _digest(body: Mapping[str, Any]) -> str:
    """What a retry of the request has in common with it: its body as JSON, canonical."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


async def get_batch(ctx: ApiContext, request: Request, ws: str) -> Response:
    offset = _query_int(request, "offset", 0, 0, 10**9)
    limit = _query_int(request, "limit", 100, 1, 1000)
    batch = await ctx.store.read(queue.get_batch, ws, request.path_params["batch_id"], offset, limit)
    if batch is None:
        raise not_found("batch")
    # (a result's only time is finished_at: converted here, not by walking up to 1,000 results)
    results = [r | {"finished_at": iso(r["finished_at"])} for r in batch.pop("results")]
    return JSONBody(iso_times(batch) | {"results": results})


async def cancel_batch(ctx: ApiContext, request: Request, ws: str) -> Response:
    bid = request.path_params["batch_id"]
    if not await ctx.store.call(queue.cancel_batch, ws, bid):
        raise not_found("batch")
    batch = await ctx.store.read(queue.get_batch, ws, bid, 0, 1)
    assert batch is not None
    batch.pop("results", None)
    batch.pop("next_offset", None)
    return ok(batch)


async def batch_events(ctx: ApiContext, request: Request, ws: str) -> Response:
    bid = request.path_params["batch_id"]
    if await ctx.store.read(queue.get_batch, ws, bid, 0, 0) is None:
        raise not_found("batch")

    async def poll() -> dict[str, Any] | None:
        b = await ctx.store.read(queue.get_batch, ws, bid, 0, 0)
        if b is None:
            return None
        return {"batch_id": bid, "status": b["status"], "progress": b["progress"], "completed_at": b["completed_at"]}

    changes = ctx.changes
    return StreamingResponse(
        guarded_stream(
            ctx,
            request,
            ws,
            poll,
            lambda poll: progress_stream(
                poll,
                lambda s: s["progress"]["pending"] == 0,
                ctx.limits.sse_poll_s,
                changes=(changes, bid) if changes is not None else None,
                pending=lambda s: int(s["progress"]["pending"]),
                finished=lambda: ctx.store.read(queue.batch_finished, bid),
            ),
        ),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache"},
    )


# ---- misc ---------------------------------------------------------------------------------------


async def health(ctx: ApiContext, request: Request, ws: str) -> Response:
    return ok({"status": "ok", "database": "postgresql" if ctx.store.is_postgres else "sqlite"})


async def openapi_schema(ctx: ApiContext, request: Request, ws: str) -> Response:
    from rollouts.service.openapi import openapi

    return JSONResponse(openapi())


def create_app(
    store: Store, *, limits: ApiLimits | None = None, gepa: GEPAJobs | None = None, changes: BatchChanges | None = None,
    policy: ServicePolicy | None = None,
) -> Starlette:  # fmt: skip
    """The API over `store`. `gepa` (a `rollouts.service.gepa_jobs.GEPAJobs`) serves the GEPA
    job routes; without it they answer 503. `changes` (running) wakes batch event streams when
    workers write (PostgreSQL); without it they poll every `ApiLimits.sse_poll_s`. `policy` is
    the operator's (which credentials, addresses and imports requests may use; the built-in
    one without it)."""
    ctx = ApiContext(store, limits or ApiLimits(), policy or ServicePolicy(), gepa, changes)

    def r(path: str, handler: Handler, methods: list[str], public: bool = False) -> Route:
        return Route(path, route(ctx, handler, public), methods=methods)

    routes = [
        r("/v1/health", health, ["GET"], public=True),
        r("/v1/openapi.json", openapi_schema, ["GET"], public=True),
        r("/v1/agents", create_agent, ["POST"]),
        r("/v1/agents", list_agents, ["GET"]),
        r("/v1/agents/{agent_id}", get_agent, ["GET"]),
        r("/v1/agents/{agent_id}/versions", list_versions, ["GET"]),
        r("/v1/agents/{agent_id}/versions", create_version, ["POST"]),
        r("/v1/agents/{agent_id}/versions/{version}", get_version, ["GET"]),
        r("/v1/agents/{agent_id}/versions/{version}/promote", promote_version, ["POST"]),
        r("/v1/agents/{agent_id}/gepa", gepa_routes.create_job, ["POST"]),
        r("/v1/batches", create_batch, ["POST"]),
        r("/v1/batches/{batch_id}", get_batch, ["GET"]),
        r("/v1/batches/{batch_id}", cancel_batch, ["DELETE"]),
        r("/v1/batches/{batch_id}/events", batch_events, ["GET"]),
        r("/v1/gepa/{job_id}", gepa_routes.get_job, ["GET"]),
        r("/v1/gepa/{job_id}", gepa_routes.cancel_job, ["DELETE"]),
        r("/v1/gepa/{job_id}/events", gepa_routes.job_events, ["GET"]),
    ]

    async def server_error(request: Request, exc: Exception) -> Response:
        _log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__)
        return JSONResponse({"error": {"code": "internal", "message": "internal error"}}, status_code=500)

    async def no_route(request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 404)
        msg = "no such route" if code == 404 else "method not allowed"
        return JSONResponse(
            {"error": {"code": "not_found" if code == 404 else "method", "message": msg}}, status_code=code
        )

    return Starlette(routes=routes, exception_handlers={Exception: server_error, 404: no_route, 405: no_route})
