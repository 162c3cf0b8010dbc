"""The viewer inside `rollouts service serve` (under /ui), behind the service's workspace tokens.

    app = create_ui(store, gepa=jobs, prefix="/ui")     # Mount("/ui", app) next to the API

Browsers cannot put an Authorization header on an EventSource, so the UI signs in with a cookie:
`/ui/login` takes a token (the same `rlt_...` tokens as the API) and, if the service accepts it,
starts a server-side session (rollouts.service.ui_sessions) and sets an HttpOnly,
SameSite=Strict cookie holding the session's id (never the token), limited to the UI's path
(Secure over HTTPS). Every other UI route looks the session up again: sign-out ends it (a copied
cookie stops working), it expires, and revoking its token ends it at once. The request then reads the service's database through a `ServiceCatalog` made for its
workspace (`catalog_for(request)`), so another workspace's batch or job is a 404 page. Without a
valid cookie an HTML page redirects to the login page and the JSON and live routes answer 401,
with no detail. Live streams check the sign-in again on every poll and end when it is revoked.
POST forms (start a GEPA job, promote a version, sign out) carry a CSRF token derived from the
session's id (SHA-256 of a fixed label and the id: it proves the form came from a page of this
session, and reveals nothing of the id), on top of SameSite=Strict.

Service pages (module-level handlers of `(ctx, request, workspace)`, templates under the
viewer's `templates/service/`, added to the viewer through `create_app(routes=..., nav=...)`):
    /batches             batches with live progress (server-sent events)
    /batches/{id}        one batch: live progress, its samples (the viewer's eval pages)
    /gepa-jobs           GEPA jobs with live progress, and a form to start one
    /agents              agents and their versions, with a promote button
Model output is HTML-escaped everywhere (and the viewer's Content-Security-Policy forbids inline
scripts and framing besides).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from rollouts.service import accounts, ui_sessions
from rollouts.service.auth import TOKEN_PREFIX
from rollouts.service.catalog import ServiceCatalog
from rollouts.service.gepa_jobs import start_job
from rollouts.service.requests import ApiError, read_body
from rollouts.service.routing import iso
from rollouts.service.store import Store
from rollouts.service.ui_sessions import SESSION_PREFIX
from rollouts.view import pages
from rollouts.view.app import SecurityHeaders, create_app
from rollouts.view.catalog import EvalRunRow, GepaRunRow, NotFound
from rollouts.view.links import ServerLinks
from rollouts.view.live import LIVE_MAX_LIFETIME_S, live_response
from rollouts.view.render import num

__all__ = ["COOKIE", "UiContext", "create_ui", "csrf_token"]

COOKIE = "rollouts_ui"
MAX_FORM_BYTES = 4 * 1024 * 1024
_STATE_SESSION, _STATE_WORKSPACE = "ui_session", "ui_workspace"


def csrf_token(session_id: str) -> str:
    """The CSRF token of forms in the session `session_id`."""
    return hashlib.sha256(b"rollouts-ui-csrf\0" + session_id.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class UiContext:
    """What the UI's handlers share."""

    store: Store
    gepa: Any  # a GEPAJobs (woken when the form starts a job), or None
    prefix: str
    links: ServerLinks
    max_tasks: int
    live_poll_s: float
    live_max_s: float = LIVE_MAX_LIFETIME_S

    def catalog_for(self, request: Request) -> ServiceCatalog:
        """The catalog of the signed-in workspace of `request`."""
        return ServiceCatalog(
            self.store, workspace_of(request), gepa_dir=self.gepa.data_dir if self.gepa is not None else None
        )

    async def still_signed_in(self, request: Request) -> bool:
        """Whether the request's session still holds (not ended, expired, nor its token revoked)."""
        session = request.scope.get("state", {}).get(_STATE_SESSION)
        if not session:
            return False
        return await self.store.read(ui_sessions.session_workspace, session) == workspace_of(request)


def workspace_of(request: Request) -> str:
    ws = request.scope.get("state", {}).get(_STATE_WORKSPACE)
    assert ws, "a UI route outside the session middleware"
    return str(ws)


# ---- the session middleware ---------------------------------------------------------------------


def _route_path(scope: Mapping[str, Any]) -> str:
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def _cookie(scope: Mapping[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in bytes(value).decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                if key == COOKIE and val.startswith(SESSION_PREFIX) and len(val) <= 200:
                    return val
    return None


def _same_origin(scope: Mapping[str, Any]) -> bool:
    """False when a browser says the request comes from another site (its Origin header names
    another host than the one it asked): forms of other sites, the login form included, are
    refused before anything else (on top of SameSite=Strict and the CSRF token)."""
    headers: dict[str, str] = {
        bytes(k).decode(): bytes(v).decode("latin-1") for k, v in scope.get("headers", []) if k in (b"origin", b"host")
    }
    origin = headers.get("origin")
    if origin is None:
        return True  # (not a browser, or an old one: the CSRF token still holds)
    return origin != "null" and origin.partition("://")[2] == headers.get("host")


class _RequireSession:
    """ASGI middleware: a valid session cookie, or a redirect to the login page / a 401."""

    def __init__(self, app: Any, store: Store, prefix: str) -> None:
        self.app, self.store, self.prefix = app, store, prefix

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response: Response
        path = _route_path(scope)
        if scope["method"] not in ("GET", "HEAD") and not _same_origin(scope):
            response = Response(json.dumps({"error": "cross-origin request"}), 403, media_type="application/json")
            await response(scope, receive, send)
            return
        if path == "/login" or path.startswith("/static/"):
            await self.app(scope, receive, send)
            return
        session = _cookie(scope)
        ws = await self.store.read(ui_sessions.session_workspace, session) if session else None
        if ws is None:
            if scope["method"] in ("GET", "HEAD") and not path.startswith(("/api/", "/live")):
                response = RedirectResponse(f"{self.prefix}/login", status_code=303)
            else:
                response = Response(json.dumps({"error": "unauthorized"}), 401, media_type="application/json")
            await response(scope, receive, send)
            return
        scope.setdefault("state", {}).update({_STATE_SESSION: session, _STATE_WORKSPACE: ws})
        await self.app(scope, receive, send)


# ---- forms --------------------------------------------------------------------------------------


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (at most MAX_FORM_BYTES)."""
    raw = await read_body(request, MAX_FORM_BYTES, "the form")
    parsed = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=100)
    return {k: v[-1] for k, v in parsed.items()}


def _csrf(request: Request) -> str:
    session = request.scope.get("state", {}).get(_STATE_SESSION)
    assert session, "a form route outside the session middleware"
    return csrf_token(str(session))


def _check_csrf(request: Request, form: Mapping[str, str]) -> None:
    if not hmac.compare_digest(form.get("csrf", ""), _csrf(request)):
        raise ApiError(403, "csrf", "this form is out of date: reload the page and submit it again")


def _json_field(form: Mapping[str, str], name: str) -> Any:
    try:
        return json.loads(form.get(name, ""))
    except ValueError as e:
        raise ApiError(422, "invalid", f"is not JSON ({e})", name) from None


def _int_field(form: Mapping[str, str], name: str) -> int:
    raw = form.get(name, "").strip()
    if not raw.isdigit() or len(raw) > 12:
        raise ApiError(422, "invalid", f"must be a whole number, got {raw[:20]!r}", name)
    return int(raw)


def _endpoint_field(form: Mapping[str, str], name: str) -> Any:
    raw = form.get(name, "").strip()
    if raw.startswith("{"):
        return _json_field(form, name)
    return {"model": raw}


# ---- pages --------------------------------------------------------------------------------------


def _page(ctx: UiContext, template: str, title: str, status: int = 200, **values: Any) -> HTMLResponse:
    body = pages.render(f"service/{template}", ctx.links, title=title, prefix=ctx.prefix, **values)
    return HTMLResponse(body, status_code=status)


async def login(ctx: UiContext, request: Request) -> Response:
    if request.method == "GET":
        return _page(ctx, "login.html", "Sign in", message="")
    form = await _form(request)
    token = form.get("token", "").strip()
    valid = token.startswith(TOKEN_PREFIX) and len(token) <= 200
    started = await ctx.store.call(ui_sessions.start_session, token) if valid else None
    if started is None:
        return _page(ctx, "login.html", "Sign in", 401, message="That token was not accepted.")
    response = RedirectResponse(f"{ctx.prefix}/batches", status_code=303)
    response.set_cookie(
        COOKIE, started[0], httponly=True, samesite="strict", path=ctx.prefix or "/",
        secure=request.url.scheme == "https", max_age=int(ui_sessions.SESSION_TTL_S),
    )  # fmt: skip
    return response


async def logout(ctx: UiContext, request: Request, ws: str) -> Response:
    _check_csrf(request, await _form(request))
    await ctx.store.call(ui_sessions.end_session, str(request.scope["state"][_STATE_SESSION]))
    response = RedirectResponse(f"{ctx.prefix}/login", status_code=303)
    response.delete_cookie(COOKIE, path=ctx.prefix or "/", httponly=True, samesite="strict")
    return response


def _batch_fields(run: EvalRunRow) -> dict[str, str]:
    b = run.run_id
    return {f"{b}:status": run.status, f"{b}:done": num(run.n_samples), f"{b}:failed": num(run.n_failed),
            f"{b}:reward": num(run.mean_reward)}  # fmt: skip


def _job_fields(run: GepaRunRow) -> dict[str, str]:
    j = run.run_id
    return {f"{j}:status": run.status, f"{j}:calls": num(run.metric_calls), f"{j}:best": num(run.best_score),
            f"{j}:candidates": num(run.n_candidates)}  # fmt: skip


async def batches(ctx: UiContext, request: Request, ws: str) -> Response:
    rows = [(run, _batch_fields(run)) for run in await ctx.catalog_for(request).list_eval_runs()]
    return _page(ctx, "batches.html", "Batches", rows=rows, csrf=_csrf(request))


async def batch(ctx: UiContext, request: Request, ws: str) -> Response:
    bid = str(request.path_params["batch_id"])
    detail = await ctx.catalog_for(request).get_eval_run(bid)
    return _page(ctx, "batch.html", f"Batch {bid}", run=detail.row, f=_batch_fields(detail.row),
                 total=int(detail.report.get("task_count") or 0),
                 system_prompt=detail.report.get("system_prompt", ""))  # fmt: skip


_FORM_DEFAULTS = {"agent_id": "", "trainset": "", "valset": "", "score": "exact_match_tag", "max_metric_calls": "100",
                  "reflection_model": "", "parallelism": "5"}  # fmt: skip


async def _gepa_jobs_page(ctx: UiContext, request: Request, ws: str, form: Mapping[str, str] | None = None,
                          error: str = "", status: int = 200) -> Response:  # fmt: skip
    rows = [(run, _job_fields(run)) for run in await ctx.catalog_for(request).list_gepa_runs()]
    agents = await ctx.store.read(accounts.list_agents, ws)
    values = {k: (form or {}).get(k, d) for k, d in _FORM_DEFAULTS.items()}
    return _page(ctx, "gepa_jobs.html", "GEPA jobs", status, rows=rows, agents=agents, form=values, error=error,
                 csrf=_csrf(request))  # fmt: skip


async def gepa_jobs(ctx: UiContext, request: Request, ws: str) -> Response:
    return await _gepa_jobs_page(ctx, request, ws)


async def start_gepa_job(ctx: UiContext, request: Request, ws: str) -> Response:
    form = await _form(request)
    _check_csrf(request, form)
    try:
        body: dict[str, Any] = {
            "trainset": _json_field(form, "trainset"),
            "score": form.get("score", ""),
            "max_metric_calls": _int_field(form, "max_metric_calls"),
            "reflection_model": _endpoint_field(form, "reflection_model"),
            "promote": form.get("promote") == "1",
        }
        if form.get("valset", "").strip():
            body["valset"] = _json_field(form, "valset")
        if form.get("parallelism", "").strip():
            body["parallelism"] = _int_field(form, "parallelism")
        job = await start_job(ctx.store, ws, form.get("agent_id", ""), body, ctx.max_tasks)
    except ApiError as e:
        message = f"{e.field}: {e.message}" if e.field else e.message
        return await _gepa_jobs_page(ctx, request, ws, form, message, 404 if e.status == 404 else 422)
    if ctx.gepa is not None:
        ctx.gepa.wake()
    return RedirectResponse(f"{ctx.prefix}/gepa-jobs#{job['job_id']}", status_code=303)


async def agents(ctx: UiContext, request: Request, ws: str) -> Response:
    shown = []
    for agent in await ctx.store.read(accounts.list_agents, ws):
        versions = await ctx.store.read(accounts.list_versions, ws, agent["agent_id"]) or []
        rows = [
            {**v, "created": iso(v["created_at"]) if isinstance(v.get("created_at"), int | float) else
             v.get("created_at", ""), "system_prompt": str(v.get("system_prompt", ""))[:2000],
             "parent_version": v.get("parent_version")}
            for v in sorted(versions, key=lambda v: -int(v["version"]))
        ]  # fmt: skip
        shown.append(({**agent, "active_version": agent.get("active_version")}, rows))
    return _page(ctx, "agents.html", "Agents", agents=shown, csrf=_csrf(request))


async def promote(ctx: UiContext, request: Request, ws: str) -> Response:
    _check_csrf(request, await _form(request))
    agent_id, raw = str(request.path_params["agent_id"]), str(request.path_params["version"])
    if not raw.isdigit() or len(raw) > 12:
        raise NotFound(f"no version {raw[:20]}")
    if await ctx.store.call(accounts.promote_version, ws, agent_id, int(raw)) is None:
        raise NotFound(f"no version {raw} of agent {agent_id}")
    return RedirectResponse(f"{ctx.prefix}/agents#{agent_id}", status_code=303)


# ---- live progress ------------------------------------------------------------------------------


async def _live(
    ctx: UiContext,
    request: Request,
    numbers: Callable[[], Awaitable[dict[str, str]]],
    version: Callable[[], Awaitable[str]],
    finished: Callable[[dict[str, str]], bool] = lambda _: False,
) -> Response:
    """Server-sent events of `numbers()`, recomputed only when `version()` changes."""
    seen = await version()  # (read before the numbers: a change in between shows next time)
    first = await numbers()

    async def poll() -> tuple[dict[str, str], bool] | None:
        nonlocal seen
        token = await version()
        if token == seen:
            return None
        seen = token
        now = await numbers()
        return now, finished(now)

    return live_response(
        first, poll, finished=finished(first), poll_s=ctx.live_poll_s, max_lifetime_s=ctx.live_max_s,
        still_allowed=lambda: ctx.still_signed_in(request),
    )  # fmt: skip


async def live_batches(ctx: UiContext, request: Request, ws: str) -> Response:
    catalog = ctx.catalog_for(request)

    async def numbers() -> dict[str, str]:
        return {k: v for run in await catalog.list_eval_runs() for k, v in _batch_fields(run).items()}

    return await _live(ctx, request, numbers, catalog.runs_version)


async def live_batch(ctx: UiContext, request: Request, ws: str) -> Response:
    catalog = ctx.catalog_for(request)
    bid = str(request.path_params["batch_id"])

    async def numbers() -> dict[str, str]:
        return _batch_fields((await catalog.get_eval_run(bid)).row)

    return await _live(
        ctx, request, numbers, lambda: catalog.version("eval", bid), lambda d: d[f"{bid}:status"] != "running"
    )


async def live_gepa_jobs(ctx: UiContext, request: Request, ws: str) -> Response:
    catalog = ctx.catalog_for(request)

    async def numbers() -> dict[str, str]:
        return {k: v for run in await catalog.list_gepa_runs() for k, v in _job_fields(run).items()}

    return await _live(ctx, request, numbers, catalog.jobs_version)


# ---- the app ------------------------------------------------------------------------------------

Handler = Callable[[UiContext, Request, str], Awaitable[Response]]


def _route(ctx: UiContext, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of a signed-in route: its workspace, and ApiErrors as an error page."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(ctx, request, workspace_of(request))
        except ApiError as e:
            return _page(ctx, "message.html", "Error", e.status, message=e.message)

    return endpoint


def _login_route(ctx: UiContext) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            return await login(ctx, request)
        except ApiError as e:
            return _page(ctx, "message.html", "Error", e.status, message=e.message)

    return endpoint


_ROUTES: tuple[tuple[str, Handler, str], ...] = (
    ("/logout", logout, "POST"),
    ("/batches", batches, "GET"),
    ("/batches/{batch_id}", batch, "GET"),
    ("/live-batches", live_batches, "GET"),
    ("/live-batches/{batch_id}", live_batch, "GET"),
    ("/gepa-jobs", gepa_jobs, "GET"),
    ("/gepa-jobs", start_gepa_job, "POST"),
    ("/live-gepa-jobs", live_gepa_jobs, "GET"),
    ("/agents", agents, "GET"),
    ("/agents/{agent_id}/versions/{version}/promote", promote, "POST"),
)


def create_ui(
    store: Store,
    *,
    gepa: Any = None,
    prefix: str = "/ui",
    max_tasks: int = 10_000,
    live_poll_s: float = 1.0,
    live_max_s: float = LIVE_MAX_LIFETIME_S,
) -> Any:
    """The viewer over the service's database with the service pages, behind sign-in (see the
    module docstring). `gepa` (a `GEPAJobs`) is woken when the form starts a job; without it the
    job waits for a server that runs jobs. Live streams end after `live_max_s` (pages reconnect)."""
    nav = (("Batches", f"{prefix}/batches"), ("GEPA jobs", f"{prefix}/gepa-jobs"), ("Agents", f"{prefix}/agents"))
    links = ServerLinks(prefix, nav, show_sessions=False)  # (the service has no sessions)
    ctx = UiContext(store, gepa, prefix, links, max_tasks, live_poll_s, live_max_s)
    routes = [Route("/login", _login_route(ctx), methods=["GET", "POST"])]
    routes += [Route(path, _route(ctx, handler), methods=[method]) for path, handler, method in _ROUTES]
    app = create_app(
        catalog_for=ctx.catalog_for,
        prefix=prefix,
        run_indexer=False,
        live_poll_s=live_poll_s,
        routes=routes,
        nav=nav,
        show_sessions=False,
        still_allowed=ctx.still_signed_in,
        allowed_hosts=None,
    )  # fmt: skip  (the service's own policy decides the hosts it serves; sign-in guards every route)
    # Referrer-Policy same-origin instead of the viewer's no-referrer: with no-referrer a browser
    # sends `Origin: null` on this site's own forms, which `_same_origin` could not tell from a
    # sandboxed frame of another site. Nothing leaks to other sites either way. (Outermost, so the
    # session check's own answers carry the security headers too.)
    return SecurityHeaders(_RequireSession(app, store, prefix), referrer_policy="same-origin")
