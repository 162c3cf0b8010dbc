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
import math
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from rollouts.dtypes import Message
from rollouts.service import accounts, queue
from rollouts.service.accounts import VersionSpec
from rollouts.service.auth import bearer_token
from rollouts.service.execution import BUILTIN_SCORERS, ENVIRONMENTS, default_task_timeout_ms
from rollouts.service.policy import PolicyError, ServicePolicy
from rollouts.service.progress import BatchChanges
from rollouts.service.ratelimit import AuthFailures
from rollouts.service.requests import ApiError, integer, invalid, number, obj, parse_json, string, string_list
from rollouts.service.store import Store

__all__ = ["ApiLimits", "create_app"]

_log = logging.getLogger("rollouts.service.api")
_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_BUILTIN_POLICY = ServicePolicy()
_MAX_VERSION = 2**31 - 1  # (an INTEGER column: larger numbers exist nowhere)
_UNAUTHORIZED = {"error": {"code": "unauthorized", "message": "a valid bearer token is required"}}


@dataclass(frozen=True)
class ApiLimits:
    """max_body_bytes: larger request bodies are 413. max_tasks: tasks per batch (and GEPA
        instances). default_deadline_s: a batch's deadline when its config gives none (the seed's
        10-minute poll timeout). sse_poll_s: how often an event stream looks for progress. A client
    address past its failed authentications is 429 (rollouts.service.ratelimit)."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_tasks: int = 10_000
    default_deadline_s: float = 600.0
    max_deadline_s: float = 7 * 24 * 3600.0
    sse_poll_s: float = 0.25
    sse_recheck_s: float = 5.0  # an event stream looks its token up again this often (revoked: it ends)
    sse_max_s: float = 3600.0  # an event stream ends after this long (clients reconnect)
    auth_failures_per_s: float = 1.0  # failed authentications a client address may make (burst: below)
    auth_failure_burst: int = 20


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(float(ts), UTC).isoformat().replace("+00:00", "Z")


# What a response carries as it was recorded (a task's trajectory and score): never rewritten,
# and the bulk of a batch's results, so not walked either.
_OPAQUE = frozenset({"trajectory", "score"})


def _times(data: Any) -> Any:
    """Every `*_at` epoch value in `data` as ISO 8601 (not inside trajectories and scores)."""
    if isinstance(data, list):
        return [_times(x) for x in data]
    if isinstance(data, dict):
        return {
            k: v if k in _OPAQUE else iso(v) if k.endswith("_at") and isinstance(v, int | float) else _times(v)
            for k, v in data.items()
        }
    return data


class _JSON(JSONResponse):
    """JSON as UTF-8; text that is not valid Unicode (a lone surrogate a model wrote, stored
    losslessly) goes out as its `\\uXXXX` escape, so any stored text can be read back."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def ok(data: Any, status: int = 200) -> JSONResponse:
    return _JSON(_times(data), status_code=status)


def not_found(what: str, field: str | None = None) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found", field)


# ---- request plumbing ---------------------------------------------------------------------------


class _Ctx:
    def __init__(self, store: Store, limits: ApiLimits, extra: Mapping[str, Any]) -> None:
        self.store = store
        self.limits = limits
        self.extra = extra
        self.auth_failures = AuthFailures(rate_per_s=limits.auth_failures_per_s, burst=limits.auth_failure_burst)


async def read_body(request: Request, max_bytes: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, "too_large", f"the request body is over {max_bytes} bytes", "body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, "too_large", f"the request body is over {max_bytes} bytes", "body")
        chunks.append(chunk)
    return parse_json(b"".join(chunks))


async def workspace_of(ctx: _Ctx, request: Request) -> str:
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise ApiError(401, "unauthorized", "")
    ws = await ctx.store.read(accounts.workspace_for_token, token)
    if ws is None:
        raise ApiError(401, "unauthorized", "")
    return ws


Handler = Callable[[_Ctx, Request, str], Awaitable[Response]]


def _route(ctx: _Ctx, handler: Handler, public: bool = False) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        address = request.client.host if request.client is not None else ""
        try:
            if not public:
                wait = ctx.auth_failures.blocked(address)
                if wait > 0:  # (before the token's lookup: a guess costs the database nothing)
                    return JSONResponse(
                        {"error": {"code": "rate_limited", "message": "too many failed authentications; retry later"}},
                        status_code=429,
                        headers={"retry-after": str(max(1, math.ceil(wait)))},
                    )
            ws = "" if public else await workspace_of(ctx, request)
            return await handler(ctx, request, ws)
        except ApiError as e:
            if e.status == 401:
                ctx.auth_failures.failed(address)
                return JSONResponse(_UNAUTHORIZED, status_code=401, headers={"www-authenticate": "Bearer"})
            return _JSON(e.body(), status_code=e.status)

    return endpoint


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


# ---- validation of agents and tasks ---------------------------------------------------------------


def _policy(ctx: _Ctx | None) -> ServicePolicy:
    policy = ctx.extra.get("policy") if ctx is not None else None
    return policy if isinstance(policy, ServicePolicy) else _BUILTIN_POLICY


def parse_endpoint(
    body: Mapping[str, Any], field: str = "endpoint", required: bool = True, policy: ServicePolicy | None = None
) -> dict[str, Any] | None:
    """The endpoint object `body[field]`, if the operator's policy allows it (its credential,
    address, provider and extra_params; see rollouts.service.policy): 422 naming the field."""
    spec = obj(body, field, required=required)
    if spec is None:
        return None
    string(spec, "model", prefix=f"{field}.", required=True, non_empty=True, max_len=200)
    try:
        return (policy or _BUILTIN_POLICY).check_endpoint(spec, field)
    except PolicyError as e:
        raise invalid(e.field, e.reason) from None


def parse_environment(body: Mapping[str, Any], policy: ServicePolicy | None = None) -> str | None:
    env = string(body, "environment", max_len=300)
    if env is not None and env != "none" and env not in ENVIRONMENTS:
        if not _REF.match(env):
            raise invalid(
                "environment",
                f"must be one of {', '.join(sorted(ENVIRONMENTS))}, 'none' or module:Class, got {env!r}",
            )
        _allowed_import(policy, env, "environment")
    return env


def _allowed_import(policy: ServicePolicy | None, ref: str, field: str) -> None:
    try:
        (policy or _BUILTIN_POLICY).check_import(ref, field)
    except PolicyError as e:
        raise invalid(e.field, e.reason) from None


def parse_score(
    body: Mapping[str, Any], name: str = "score", prefix: str = "", required: bool = False,
    policy: ServicePolicy | None = None,
) -> str | None:  # fmt: skip
    ref = string(body, name, prefix=prefix, required=required, max_len=300)
    if ref is None:
        return None
    if ":" in ref:
        if not _REF.match(ref):
            raise invalid(f"{prefix}{name}", f"must look like module:function, got {ref!r}")
        _allowed_import(policy, ref, f"{prefix}{name}")
        return ref
    unknown = [n.strip() for n in ref.split(",") if n.strip() not in BUILTIN_SCORERS]
    if unknown:
        raise invalid(
            f"{prefix}{name}",
            f"unknown scorer {', '.join(unknown)!r}; built-in: {', '.join(sorted(BUILTIN_SCORERS))}, or module:function",
        )
    return ref


def parse_tasks(
    body: Mapping[str, Any], name: str, max_tasks: int, *, ids_required: bool = True
) -> list[tuple[str, dict[str, Any]]]:
    """[(task_id, input)] from `tasks` (each {task_id, user_message | messages, context?})."""
    raw = body.get(name)
    if raw is None:
        raise invalid(name, "is required")
    if not isinstance(raw, list):
        raise invalid(name, "must be an array of tasks")
    if not raw:
        raise invalid(name, "must not be empty")
    if len(raw) > max_tasks:
        raise invalid(name, f"has {len(raw)} tasks; at most {max_tasks} per request")
    out: list[tuple[str, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for i, task in enumerate(raw):
        p = f"{name}[{i}]"
        if not isinstance(task, dict):
            raise invalid(p, "must be an object")
        tid = string(task, "task_id", prefix=f"{p}.", required=ids_required, non_empty=True, max_len=200)
        tid = tid if tid is not None else str(i)
        if tid in seen:
            raise invalid(f"{p}.task_id", f"duplicate task_id {tid!r} (also {name}[{seen[tid]}])")
        seen[tid] = i
        user = string(task, "user_message", prefix=f"{p}.", nul=True)  # (stored inside JSON: any text)
        messages = task.get("messages")
        if (user is None) == (messages is None):
            raise invalid(p, "give exactly one of user_message or messages")
        inp: dict[str, Any] = {}
        if user is not None:
            inp["user_message"] = user
        else:
            if not isinstance(messages, list) or not messages:
                raise invalid(f"{p}.messages", "must be a non-empty array of messages")
            for j, m in enumerate(messages):
                try:
                    if not isinstance(m, dict):
                        raise TypeError("must be an object")
                    Message.from_dict(m)
                except (KeyError, TypeError, ValueError) as e:
                    raise invalid(f"{p}.messages[{j}]", f"is not a message ({e})") from None
            inp["messages"] = messages
        context = obj(task, "context", prefix=f"{p}.")
        if context is not None:
            inp["context"] = context
        out.append((tid, inp))
    return out


def version_spec(
    body: Mapping[str, Any], base: Mapping[str, Any] | None, policy: ServicePolicy | None = None
) -> VersionSpec:
    """A version from the body, fields it does not give taken from `base` (the active version)."""
    endpoint = parse_endpoint(body, required=base is None, policy=policy)
    environment = parse_environment(body, policy)
    system_prompt = string(body, "system_prompt", max_len=200_000)
    max_turns = integer(body, "max_turns", minimum=1, maximum=1000)
    tags = string_list(body, "tags", max_items=100)
    b = base or {}
    return VersionSpec(
        endpoint=endpoint if endpoint is not None else b["endpoint"],
        environment=environment if "environment" in body else b.get("environment"),
        system_prompt=system_prompt if system_prompt is not None else b.get("system_prompt", ""),
        max_turns=max_turns if max_turns is not None else b.get("max_turns", 10),
        tags=tuple(tags if tags is not None else b.get("tags", ())),
    )


# ---- agents -------------------------------------------------------------------------------------


async def create_agent(ctx: _Ctx, request: Request, ws: str) -> Response:
    body = await read_body(request, ctx.limits.max_body_bytes)
    _known_fields(body, ("name", *_VERSION_FIELDS))
    name = string(body, "name", required=True, non_empty=True, max_len=200)
    assert name is not None
    spec = version_spec(body, None, _policy(ctx))
    return ok(await ctx.store.call(accounts.create_agent, ws, name, spec), 201)


async def list_agents(ctx: _Ctx, request: Request, ws: str) -> Response:
    return ok({"agents": await ctx.store.read(accounts.list_agents, ws)})


async def get_agent(ctx: _Ctx, request: Request, ws: str) -> Response:
    agent = await ctx.store.read(accounts.get_agent, ws, request.path_params["agent_id"])
    if agent is None:
        raise not_found("agent")
    return ok(agent)


async def list_versions(ctx: _Ctx, request: Request, ws: str) -> Response:
    versions = await ctx.store.read(accounts.list_versions, ws, request.path_params["agent_id"])
    if versions is None:
        raise not_found("agent")
    return ok({"versions": versions})


_VERSION_FIELDS = ("endpoint", "environment", "system_prompt", "max_turns", "tags")


def _known_fields(body: Mapping[str, Any], known: tuple[str, ...], prefix: str = "") -> None:
    """422 naming the first field `body` has that is not in `known` (a misspelt or misplaced
    field is never silently dropped)."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise invalid(f"{prefix}{unknown[0]}", f"unknown field; known: {', '.join(sorted(known))}")


async def create_version(ctx: _Ctx, request: Request, ws: str) -> Response:
    """A new version: the fields the body gives, the others taken from `parent_version` (default:
    the active version). `source` is the service's ("api"; "gepa" for a GEPA job's)."""
    agent_id = request.path_params["agent_id"]
    body = await read_body(request, ctx.limits.max_body_bytes)
    if "source" in body:
        raise invalid("source", 'is set by the service ("api" for a version made through this route), not by a request')
    _known_fields(body, (*_VERSION_FIELDS, "parent_version"))
    parent = integer(body, "parent_version", minimum=1, maximum=_MAX_VERSION)
    base = await ctx.store.read(accounts.get_version, ws, agent_id, parent)
    if base is None:
        if parent is not None and await ctx.store.read(accounts.get_agent, ws, agent_id) is not None:
            raise not_found(f"version {parent} of agent {agent_id}", "parent_version")
        raise not_found("agent")
    spec = version_spec(body, base, _policy(ctx))
    version = await ctx.store.call(
        accounts.add_version, ws, agent_id, spec, source="api", parent_version=base["version"]
    )
    if version is None:
        raise not_found("agent")
    return ok(version, 201)


async def get_version(ctx: _Ctx, request: Request, ws: str) -> Response:
    v = await ctx.store.read(accounts.get_version, ws, request.path_params["agent_id"], _path_int(request, "version"))
    if v is None:
        raise not_found("agent version")
    return ok(v)


async def promote_version(ctx: _Ctx, request: Request, ws: str) -> Response:
    v = await ctx.store.call(
        accounts.promote_version, ws, request.path_params["agent_id"], _path_int(request, "version")
    )
    if v is None:
        raise not_found("agent version")
    return ok(v)


# ---- batches ------------------------------------------------------------------------------------


async def create_batch(ctx: _Ctx, request: Request, ws: str) -> Response:
    body = await read_body(request, ctx.limits.max_body_bytes)
    _known_fields(body, ("agent_id", "agent_version", "system_prompt", "idempotency_key", "tasks", "config"))
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
    score = parse_score(config, prefix="config.", policy=_policy(ctx))
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
        _policy(ctx).check_endpoint(version["endpoint"], "endpoint", model)
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


async def get_batch(ctx: _Ctx, request: Request, ws: str) -> Response:
    offset = _query_int(request, "offset", 0, 0, 10**9)
    limit = _query_int(request, "limit", 100, 1, 1000)
    batch = await ctx.store.read(queue.get_batch, ws, request.path_params["batch_id"], offset, limit)
    if batch is None:
        raise not_found("batch")
    # (a result's only time is finished_at: converted here, not by walking up to 1,000 results)
    results = [r | {"finished_at": iso(r["finished_at"])} for r in batch.pop("results")]
    return _JSON(_times(batch) | {"results": results})


async def cancel_batch(ctx: _Ctx, request: Request, ws: str) -> Response:
    bid = request.path_params["batch_id"]
    if not await ctx.store.call(queue.cancel_batch, ws, bid):
        raise not_found("batch")
    batch = await ctx.store.read(queue.get_batch, ws, bid, 0, 1)
    assert batch is not None
    batch.pop("results", None)
    batch.pop("next_offset", None)
    return ok(batch)


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(_times(dict(data)), separators=(',', ':'))}\n\n".encode()


_NEAR_END_TASKS = 256  # pending tasks under which a stream on SQLite watches for the end


async def progress_stream(
    poll: Callable[[], Awaitable[dict[str, Any] | None]], terminal: Callable[[dict[str, Any]], bool], every_s: float,
    keepalive_s: float = 15.0, changes: tuple[BatchChanges, str] | None = None, min_gap_s: float = 0.05,
    pending: Callable[[dict[str, Any]], int] | None = None, finished: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[bytes]:  # fmt: skip
    """`progress` events whenever `poll()` changes, then one `done` event; a comment line keeps
    idle connections open. Polls every `every_s`, or sooner: when the rate at which
    `pending(state)` has fallen since the first look says the end is due before the next poll
    (the average rate: outcomes are written in bursts); and, with `changes` (BatchChanges, batch
    id), when the database says the batch changed: at once for a precise change (PostgreSQL:
    the batch ended), else (SQLite: something was written) when `finished()` says it has
    ended, asked at most every `min_gap_s` and only near the end (at most `_NEAR_END_TASKS`
    pending, or the end due within two polls). Never polls twice within `min_gap_s`."""
    last: Any = None
    quiet = 0.0
    first: tuple[float, int] | None = None  # (time, pending) of the first poll
    while True:
        polled = trio.current_time()
        seen = changes[0].version(changes[1]) if changes is not None else 0
        state = await poll()
        if state is None:
            yield sse("error", {"error": {"code": "not_found", "message": "gone"}})
            return
        if terminal(state):
            yield sse("done", state)
            return
        if state != last:
            yield sse("progress", state)
            last, quiet = state, 0.0
        elif quiet >= keepalive_s:
            yield b": keepalive\n\n"
            quiet = 0.0
        wait_s = every_s
        near_end = True  # (whether a change that is not precise is worth asking `finished()` about)
        if pending is not None and (changes is None or not changes[0].precise):
            left = pending(state)
            eta = None
            if first is None:
                first = (polled, left)
            elif first[1] > left:
                eta = left * (polled - first[0]) / (first[1] - left)  # at the average rate so far
                wait_s = min(every_s, max(min_gap_s, eta / 2))
            # (a big batch far from its end is polled only: every commit of its run would
            # otherwise make every open stream ask the database whether it has ended)
            near_end = left <= _NEAR_END_TASKS or (eta is not None and eta <= 2 * every_s)
        until = polled + wait_s
        if changes is None or not (changes[0].precise or near_end):
            await trio.sleep_until(until)
        else:
            board, batch_id = changes
            while trio.current_time() < until:
                await board.wait(batch_id, seen, until - trio.current_time())
                if board.version(batch_id) == seen:
                    break  # no change: time for the next poll
                seen = board.version(batch_id)
                if board.precise or finished is None or await finished():
                    break
                await trio.sleep_until(min(until, trio.current_time() + min_gap_s))
            await trio.sleep_until(polled + min_gap_s)
        quiet += trio.current_time() - polled


class _StreamEnd(Exception):
    """An event stream must end now with this last event (its token was revoked, or it reached
    its maximum lifetime)."""

    def __init__(self, event: bytes) -> None:
        super().__init__("stream ended")
        self.event = event


def guarded_stream(
    ctx: _Ctx, request: Request, ws: str, poll: Callable[[], Awaitable[dict[str, Any] | None]],
    make: Callable[[Callable[[], Awaitable[dict[str, Any] | None]]], AsyncIterator[bytes]],
) -> AsyncIterator[bytes]:  # fmt: skip
    """The event stream `make(poll)`, whose every poll also looks the request's token up again
    (at most every `ApiLimits.sse_recheck_s`) and minds the stream's age: a token revoked or
    expired meanwhile ends it with an `error` event (401's code), a stream older than
    `ApiLimits.sse_max_s` with an `end` event (the client reconnects)."""
    started = trio.current_time()
    checked = started

    async def guarded_poll() -> dict[str, Any] | None:
        nonlocal checked
        now = trio.current_time()
        if now - started >= ctx.limits.sse_max_s:
            raise _StreamEnd(sse("end", {"reason": "max_lifetime", "message": "the stream ended: reconnect"}))
        if now - checked >= ctx.limits.sse_recheck_s:
            checked = now
            try:
                still = await workspace_of(ctx, request)
            except ApiError:
                still = None
            if still != ws:
                raise _StreamEnd(sse("error", _UNAUTHORIZED))
        return await poll()

    async def stream() -> AsyncIterator[bytes]:
        try:
            async for chunk in make(guarded_poll):
                yield chunk
        except _StreamEnd as end:
            yield end.event

    return stream()


async def batch_events(ctx: _Ctx, request: Request, ws: str) -> Response:
    bid = request.path_params["batch_id"]
    if await ctx.store.read(queue.get_batch, ws, bid, 0, 0) is None:
        raise not_found("batch")

    async def poll() -> dict[str, Any] | None:
        b = await ctx.store.read(queue.get_batch, ws, bid, 0, 0)
        if b is None:
            return None
        return {"batch_id": bid, "status": b["status"], "progress": b["progress"], "completed_at": b["completed_at"]}

    changes: BatchChanges | None = ctx.extra.get("changes")
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


async def health(ctx: _Ctx, request: Request, ws: str) -> Response:
    return ok({"status": "ok", "database": "postgresql" if ctx.store.is_postgres else "sqlite"})


async def openapi_schema(ctx: _Ctx, request: Request, ws: str) -> Response:
    from rollouts.service.openapi import openapi

    return JSONResponse(openapi())


def create_app(
    store: Store, *, limits: ApiLimits | None = None, gepa: Any = None, changes: BatchChanges | None = None,
    policy: ServicePolicy | None = None,
) -> Starlette:  # fmt: skip
    """The API over `store`. `gepa` (a `rollouts.service.gepa_jobs.GEPAJobs`) serves the GEPA
    job routes; without it they answer 503. `changes` (running) wakes batch event streams when
    workers write (PostgreSQL); without it they poll every `ApiLimits.sse_poll_s`. `policy` is
    the operator's (which credentials, addresses and imports requests may use; the built-in
    one without it)."""
    ctx = _Ctx(store, limits or ApiLimits(), {"gepa": gepa, "changes": changes, "policy": policy})
    from rollouts.service import gepa_routes

    def r(path: str, handler: Handler, methods: list[str], public: bool = False) -> Route:
        return Route(path, _route(ctx, handler, public), methods=methods)

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
