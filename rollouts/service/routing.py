"""What the API's route modules share: the limits and typed context of a request, the one
wrapper that owns auth and error mapping (`route`), JSON responses with ISO 8601 times, and the
event-stream loop (`progress_stream`).

    app routes: Route(path, route(ctx, handler), methods=[...])   # handler(ctx, request, workspace)

Handlers are module-level functions of `(ctx, request, workspace)`: `rollouts.service.api` (agents,
batches) and `rollouts.service.gepa_routes` (GEPA jobs); request bodies are checked by
`rollouts.service.requests`.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from rollouts.service import accounts
from rollouts.service.auth import bearer_token
from rollouts.service.policy import ServicePolicy
from rollouts.service.progress import BatchChanges
from rollouts.service.ratelimit import AuthFailures
from rollouts.service.requests import ApiError
from rollouts.service.store import DatabaseUnavailable, Store, fail_fast

if TYPE_CHECKING:
    from rollouts.service.gepa_jobs import GEPAJobs

__all__ = [
    "ApiContext",
    "ApiLimits",
    "Handler",
    "JSONBody",
    "iso",
    "iso_times",
    "ok",
    "guarded_stream",
    "progress_stream",
    "route",
    "sse",
    "workspace_of",
]

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


def iso_times(data: Any) -> Any:
    """Every `*_at` epoch value in `data` as ISO 8601 (not inside trajectories and scores)."""
    if isinstance(data, list):
        return [iso_times(x) for x in data]
    if isinstance(data, dict):
        return {
            k: v if k in _OPAQUE else iso(v) if k.endswith("_at") and isinstance(v, int | float) else iso_times(v)
            for k, v in data.items()
        }
    return data


class JSONBody(JSONResponse):
    """JSON as UTF-8; text that is not valid Unicode (a lone surrogate a model wrote, stored
    losslessly) goes out as its `\\uXXXX` escape, so any stored text can be read back."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def ok(data: Any, status: int = 200) -> JSONResponse:
    return JSONBody(iso_times(data), status_code=status)


@dataclass(frozen=True)
class ApiContext:
    """What every handler of one app shares: the store, the limits, the operator's policy, the
    GEPA job runner (None: the GEPA routes answer 503) and the batch-change board (None: event
    streams poll)."""

    store: Store
    limits: ApiLimits = field(default_factory=lambda: ApiLimits())
    policy: ServicePolicy = field(default_factory=ServicePolicy)
    gepa: GEPAJobs | None = None
    changes: BatchChanges | None = None
    auth_failures: AuthFailures = field(init=False)  # (per client address; from `limits`)

    def __post_init__(self) -> None:
        limiter = AuthFailures(rate_per_s=self.limits.auth_failures_per_s, burst=self.limits.auth_failure_burst)
        object.__setattr__(self, "auth_failures", limiter)


async def workspace_of(ctx: ApiContext, request: Request) -> str:
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise ApiError(401, "unauthorized", "")
    ws = await ctx.store.read(accounts.workspace_for_token, token)
    if ws is None:
        raise ApiError(401, "unauthorized", "")
    return ws


Handler = Callable[[ApiContext, Request, str], Awaitable[Response]]


def route(ctx: ApiContext, handler: Handler, public: bool = False) -> Callable[[Request], Awaitable[Response]]:
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
            with fail_fast():  # (the database unreachable: 503 now, not a hung request)
                ws = "" if public else await workspace_of(ctx, request)
                return await handler(ctx, request, ws)
        except DatabaseUnavailable:
            return JSONResponse(
                {"error": {"code": "unavailable", "message": "the database is unreachable; retry shortly"}},
                status_code=503,
                headers={"retry-after": "2"},
            )
        except ApiError as e:
            if e.status == 401:
                ctx.auth_failures.failed(address)
                return JSONResponse(_UNAUTHORIZED, status_code=401, headers={"www-authenticate": "Bearer"})
            return JSONBody(e.body(), status_code=e.status)

    return endpoint


def sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(iso_times(dict(data)), separators=(',', ':'))}\n\n".encode()


class _StreamEnd(Exception):
    """An event stream must end now with this last event (its token was revoked, or it reached
    its maximum lifetime)."""

    def __init__(self, event: bytes) -> None:
        super().__init__("stream ended")
        self.event = event


def guarded_stream(
    ctx: ApiContext, request: Request, ws: str, poll: Callable[[], Awaitable[dict[str, Any] | None]],
    make: Callable[[Callable[[], Awaitable[dict[str, Any] | None]]], AsyncIterator[bytes]],
) -> AsyncIterator[bytes]:  # fmt: skip
    """The event stream `make(poll)`, whose every poll also looks the request's token up again
    (at most every `ApiLimits.sse_recheck_s`) and minds the stream's age: a token revoked or
    expired meanwhile ends it with an `error` event (401's body), a stream older than
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
                still: str | None = await workspace_of(ctx, request)
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
