"""The viewer inside `rollouts service serve` (under /ui), behind the service's workspace tokens.

    app = create_ui(store, gepa=jobs, prefix="/ui")     # Mount("/ui", app) next to the API

Browsers cannot put an Authorization header on an EventSource, so the UI signs in with a cookie:
`/ui/login` takes a token (the same `rlt_...` tokens as the API) and, if the service accepts it,
sets an HttpOnly, SameSite=Strict cookie holding it, limited to the UI's path (Secure over
HTTPS). Every other UI route looks the token up again (revoked or expired tokens stop working at
once) and runs with its workspace (`rollouts.service.catalog.use_workspace`): the viewer's pages
read the service's database through `ServiceCatalog`, so another workspace's batch or job is a
404 page. Without a valid cookie an HTML page redirects to the login page and the JSON and live
routes answer 401, with no detail. POST forms (start a GEPA job, promote a version, sign out)
carry a CSRF token derived from the session's token (SHA-256 of a fixed label and the token:
it proves the form came from a page of this session, and reveals nothing of the token), on top
of SameSite=Strict.

Service pages (added to the viewer through `create_app(routes=..., nav=...)`):
    /batches             batches with live progress (server-sent events)
    /batches/{id}        one batch: live progress, its samples (the viewer's eval pages)
    /gepa-jobs           GEPA jobs with live progress, and a form to start one
    /agents              agents and their versions, with a promote button
Model output is HTML-escaped everywhere (and the viewer's Content-Security-Policy forbids inline
scripts besides).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

import trio
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from rollouts.service import accounts
from rollouts.service.api import iso
from rollouts.service.auth import TOKEN_PREFIX
from rollouts.service.catalog import ServiceCatalog, current_workspace, use_workspace
from rollouts.service.gepa_jobs import start_job
from rollouts.service.requests import ApiError
from rollouts.service.store import Store
from rollouts.view import pages
from rollouts.view.app import create_app
from rollouts.view.catalog import NotFound
from rollouts.view.links import ServerLinks
from rollouts.view.render import num

__all__ = ["COOKIE", "create_ui", "csrf_token"]

COOKIE = "rollouts_ui"
MAX_FORM_BYTES = 4 * 1024 * 1024
LIVE_MAX_EVENTS = 100_000
_PUBLIC = ("/login", "/static/")


def csrf_token(token: str) -> str:
    """The CSRF token of forms in the session signed in with `token`."""
    return hashlib.sha256(b"rollouts-ui-csrf\0" + token.encode("utf-8")).hexdigest()


def _route_path(scope: Mapping[str, Any]) -> str:
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    return path[len(root) :] if root and path.startswith(root) else path


def _cookie(scope: Mapping[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in bytes(value).decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                if key == COOKIE and val.startswith(TOKEN_PREFIX) and len(val) <= 200:
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


def _same_origin_referrer(send: Any) -> Any:
    """`send` with `Referrer-Policy: same-origin` instead of the viewer's `no-referrer`: with
    no-referrer a browser sends `Origin: null` on this site's own forms, which `_same_origin`
    could not tell from a sandboxed frame of another site. Nothing leaks to other sites either way."""

    async def wrapped(message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"referrer-policy"]
            message = {**message, "headers": [*headers, (b"referrer-policy", b"same-origin")]}
        await send(message)

    return wrapped


class _RequireSession:
    """ASGI middleware: a valid session cookie, or a redirect to the login page / a 401."""

    def __init__(self, app: Any, store: Store, prefix: str) -> None:
        self.app, self.store, self.prefix = app, store, prefix

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response: Response
        send = _same_origin_referrer(send)
        path = _route_path(scope)
        if scope["method"] not in ("GET", "HEAD") and not _same_origin(scope):
            response = Response(json.dumps({"error": "cross-origin request"}), 403, media_type="application/json")
            await response(scope, receive, send)
            return
        if path == "/login" or path.startswith("/static/"):
            await self.app(scope, receive, send)
            return
        token = _cookie(scope)
        ws = await self.store.read(accounts.workspace_for_token, token) if token else None
        if ws is None:
            if scope["method"] in ("GET", "HEAD") and not path.startswith(("/api/", "/live")):
                response = RedirectResponse(f"{self.prefix}/login", status_code=303)
            else:
                response = Response(json.dumps({"error": "unauthorized"}), 401, media_type="application/json")
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["ui_token"] = token
        with use_workspace(ws):
            await self.app(scope, receive, send)


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (at most MAX_FORM_BYTES)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise ApiError(413, "too_large", f"the form is over {MAX_FORM_BYTES} bytes", "body")
        chunks.append(chunk)
    parsed = parse_qs(b"".join(chunks).decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=100)
    return {k: v[-1] for k, v in parsed.items()}


def _check_csrf(request: Request, form: Mapping[str, str]) -> None:
    token = request.scope.get("state", {}).get("ui_token")
    assert token, "a form route outside the session middleware"
    if not hmac.compare_digest(form.get("csrf", ""), csrf_token(token)):
        raise ApiError(403, "csrf", "this form is out of date: reload the page and submit it again")


def _csrf_field(request: Request) -> Markup:
    token = request.scope.get("state", {}).get("ui_token", "")
    return Markup('<input type="hidden" name="csrf" value="{}">').format(csrf_token(token))


def create_ui(
    store: Store,
    *,
    gepa: Any = None,
    prefix: str = "/ui",
    max_tasks: int = 10_000,
    live_poll_s: float = 1.0,
) -> Any:
    """The viewer over the service's database with the service pages, behind sign-in (see the
    module docstring). `gepa` (a `GEPAJobs`) is woken when the form starts a job; without it the
    job waits for a server that runs jobs."""
    catalog = ServiceCatalog(store, gepa_dir=gepa.data_dir if gepa is not None else None)
    nav = (
        ("Batches", f"{prefix}/batches"),
        ("GEPA jobs", f"{prefix}/gepa-jobs"),
        ("Agents", f"{prefix}/agents"),
    )
    links = ServerLinks(prefix, nav, show_sessions=False)  # (the service has no sessions)

    def page(title: str, body: Markup, status: int = 200) -> HTMLResponse:
        return HTMLResponse(pages.render_page(links, title, str(body)), status_code=status)

    def html_errors(
        fn: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except ApiError as e:
                msg = escape(e.message)
                return page("Error", Markup("<p class='errorbox error'>{}</p>").format(msg), e.status)

        return endpoint

    # ---- sign in / out ----
    def login_form(message: str = "") -> Markup:
        return Markup(
            "{}<form method='post' action='{}' class='login service'>"
            "<label>Token <input type='password' name='token' autocomplete='off' required></label> "
            "<button type='submit'>Sign in</button></form>"
            "<p class='muted'>A workspace token, made with <code>rollouts service token create</code>.</p>"
        ).format(Markup("<p class='errorbox error'>{}</p>").format(message) if message else "", f"{prefix}/login")

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return page("Sign in", login_form())
        form = await _form(request)
        token = form.get("token", "").strip()
        valid = token.startswith(TOKEN_PREFIX) and len(token) <= 200
        ws = await store.read(accounts.workspace_for_token, token) if valid else None
        if ws is None:
            return page("Sign in", login_form("That token was not accepted."), 401)
        response = RedirectResponse(f"{prefix}/batches", status_code=303)
        response.set_cookie(
            COOKIE, token, httponly=True, samesite="strict", path=prefix or "/", secure=request.url.scheme == "https"
        )
        return response

    async def logout(request: Request) -> Response:
        _check_csrf(request, await _form(request))
        response = RedirectResponse(f"{prefix}/login", status_code=303)
        response.delete_cookie(COOKIE, path=prefix or "/", httponly=True, samesite="strict")
        return response

    def logout_form(request: Request) -> Markup:
        return Markup(
            "<form method='post' action='{}' class='inline'>{}<button type='submit'>Sign out</button></form>"
        ).format(f"{prefix}/logout", _csrf_field(request))

    # ---- batches ----
    def batch_fields(run: Any) -> dict[str, str]:
        b = run.run_id
        return {f"{b}:status": run.status, f"{b}:done": num(run.n_samples), f"{b}:failed": num(run.n_failed),
                f"{b}:reward": num(run.mean_reward)}  # fmt: skip

    async def batches_numbers() -> dict[str, str]:
        out: dict[str, str] = {}
        for run in await catalog.list_eval_runs():
            out.update(batch_fields(run))
        return out

    def field(key: str, value: str) -> Markup:
        return Markup("<span data-field='{}'>{}</span>").format(key, value)

    async def batches(request: Request) -> Response:
        rows = []
        for run in await catalog.list_eval_runs():
            f = batch_fields(run)
            b = run.run_id
            rows.append(
                Markup(
                    "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"
                ).format(
                    f"{prefix}/batches/{b}",
                    b,
                    run.name,
                    field(f"{b}:status", f[f"{b}:status"]),
                    field(f"{b}:done", f[f"{b}:done"]),
                    field(f"{b}:failed", f[f"{b}:failed"]),
                    field(f"{b}:reward", f[f"{b}:reward"]),
                    run.started_at,
                )
            )
        table = Markup(
            "<table class='grid batches'><thead><tr><th>batch</th><th>agent</th><th>status</th><th>finished</th>"
            "<th>failed</th><th>mean score</th><th>created</th></tr></thead><tbody>{}</tbody></table>"
        ).format(Markup("").join(rows) or Markup("<tr><td colspan='7'>no batches yet</td></tr>"))
        body = Markup("<div data-live='{}'>{}</div>{}").format(f"{prefix}/live-batches", table, logout_form(request))
        return page("Batches", body)

    async def batch(request: Request) -> Response:
        bid = str(request.path_params["batch_id"])
        detail = await catalog.get_eval_run(bid)
        run = detail.row
        total = int(detail.report.get("task_count") or 0)
        f = batch_fields(run)
        body = Markup(
            "<div data-live='{}'><dl class='summary service'>"
            "<dt>agent</dt><dd>{}</dd><dt>status</dt><dd>{}</dd><dt>finished</dt><dd>{} of {}</dd>"
            "<dt>failed</dt><dd>{}</dd><dt>mean score</dt><dd>{}</dd><dt>created</dt><dd>{}</dd></dl></div>"
            "<p><a href='{}'>Samples (score, status, turns, tokens, cost, time)</a></p>"
            "<h2>System prompt</h2><pre class='prompt'>{}</pre>"
        ).format(
            f"{prefix}/live-batches/{bid}",
            run.name,
            field(f"{bid}:status", f[f"{bid}:status"]),
            field(f"{bid}:done", f[f"{bid}:done"]),
            num(total),
            field(f"{bid}:failed", f[f"{bid}:failed"]),
            field(f"{bid}:reward", f[f"{bid}:reward"]),
            run.started_at,
            links.eval_run(bid),
            detail.report.get("system_prompt", ""),
        )
        return page(f"Batch {bid}", body)

    async def live_stream(
        poll: Callable[[], Awaitable[dict[str, str]]],
        finished: Callable[[dict[str, str]], bool],
        version: Callable[[], Awaitable[str]],
    ) -> Response:
        """Server-sent events of `poll()`'s numbers, recomputed only when `version()` changes."""
        seen = await version()  # (read before the numbers: a change in between shows next time)
        first = await poll()
        ws = current_workspace()

        async def scoped_poll() -> dict[str, str] | None:
            nonlocal seen
            with use_workspace(ws):  # (the stream may be iterated in another task; never across a yield)
                token = await version()
                if token == seen:
                    return None
                seen = token
                return await poll()

        async def events() -> AsyncIterator[str]:
            last = first
            yield f"data: {json.dumps(first)}\n\n"
            for n in range(LIVE_MAX_EVENTS):
                if finished(last):
                    yield "event: done\ndata: {}\n\n"
                    return
                await trio.sleep(live_poll_s)
                now = await scoped_poll()
                if now is not None and now != last:
                    last = now
                    yield f"data: {json.dumps(now)}\n\n"
                elif n % 15 == 14:
                    yield ": keep-alive\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def live_batches(request: Request) -> Response:
        return await live_stream(batches_numbers, lambda _: False, catalog.runs_version)

    async def live_batch(request: Request) -> Response:
        bid = str(request.path_params["batch_id"])

        async def poll() -> dict[str, str]:
            return batch_fields((await catalog.get_eval_run(bid)).row)

        return await live_stream(poll, lambda d: d[f"{bid}:status"] != "running", lambda: catalog.version("eval", bid))

    # ---- GEPA jobs ----
    def job_fields(run: Any) -> dict[str, str]:
        j = run.run_id
        return {f"{j}:status": run.status, f"{j}:calls": num(run.metric_calls), f"{j}:best": num(run.best_score),
                f"{j}:candidates": num(run.n_candidates)}  # fmt: skip

    async def jobs_numbers() -> dict[str, str]:
        out: dict[str, str] = {}
        for run in await catalog.list_gepa_runs():
            out.update(job_fields(run))
        return out

    async def job_form(request: Request, values: Mapping[str, str], error: str = "") -> Markup:
        agents = await store.read(accounts.list_agents, current_workspace())
        options = Markup("").join(
            Markup("<option value='{}'{}>{} ({})</option>").format(
                a["agent_id"],
                Markup(" selected") if values.get("agent_id") == a["agent_id"] else "",
                a["name"],
                a["agent_id"],
            )
            for a in agents
        )
        v = {k: values.get(k, d) for k, d in (("trainset", ""), ("valset", ""), ("score", "exact_match_tag"),
             ("max_metric_calls", "100"), ("reflection_model", ""), ("parallelism", "5"))}  # fmt: skip
        return Markup(
            "<h2>Start a GEPA job</h2>{}<form method='post' action='{}' class='gepa-form service'>{}"
            "<label>Agent <select name='agent_id' required>{}</select></label>"
            '<label>Trainset (JSON: [{{"task_id", "user_message", "context"}}, ...]) '
            "<textarea name='trainset' rows='5' required>{}</textarea></label>"
            "<label>Valset (JSON, optional) <textarea name='valset' rows='3'>{}</textarea></label>"
            "<label>Score <input name='score' value='{}' required></label>"
            "<label>Metric calls <input name='max_metric_calls' value='{}' required></label>"
            "<label>Parallelism <input name='parallelism' value='{}'></label>"
            "<label>Reflection model (provider/model, or a JSON endpoint) "
            "<input name='reflection_model' value='{}' required></label>"
            "<label><input type='checkbox' name='promote' value='1'> promote the result</label>"
            "<button type='submit'>Start</button></form>"
        ).format(
            Markup("<p class='errorbox error'>{}</p>").format(error) if error else "",
            f"{prefix}/gepa-jobs",
            _csrf_field(request),
            options,
            v["trainset"],
            v["valset"],
            v["score"],
            v["max_metric_calls"],
            v["parallelism"],
            v["reflection_model"],
        )

    async def gepa_jobs_page(request: Request, values: Mapping[str, str] | None = None, error: str = "",
                             status: int = 200) -> Response:  # fmt: skip
        rows = []
        for run in await catalog.list_gepa_runs():
            f = job_fields(run)
            j = run.run_id
            rows.append(
                Markup(
                    "<tr><td><a href='{}'>{}</a></td><td>{}</td><td>{}</td><td>{} / {}</td><td>{}</td><td>{}</td></tr>"
                ).format(
                    links.gepa_run(j),
                    j,
                    run.name,
                    field(f"{j}:status", f[f"{j}:status"]),
                    field(f"{j}:calls", f[f"{j}:calls"]),
                    num(run.max_metric_calls),
                    field(f"{j}:best", f[f"{j}:best"]),
                    field(f"{j}:candidates", f[f"{j}:candidates"]),
                )
            )
        table = Markup(
            "<table class='grid gepa-jobs'><thead><tr><th>job</th><th>agent</th><th>status</th><th>metric calls</th>"
            "<th>best score</th><th>candidates</th></tr></thead><tbody>{}</tbody></table>"
        ).format(Markup("").join(rows) or Markup("<tr><td colspan='6'>no GEPA jobs yet</td></tr>"))
        body = Markup("<div data-live='{}'>{}</div>{}").format(
            f"{prefix}/live-gepa-jobs", table, await job_form(request, values or {}, error)
        )
        return page("GEPA jobs", body, status)

    async def gepa_jobs_get(request: Request) -> Response:
        return await gepa_jobs_page(request)

    async def gepa_jobs_post(request: Request) -> Response:
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
            job = await start_job(store, current_workspace(), form.get("agent_id", ""), body, max_tasks)
        except ApiError as e:
            message = f"{e.field}: {e.message}" if e.field else e.message
            return await gepa_jobs_page(request, form, message, 404 if e.status == 404 else 422)
        if gepa is not None:
            gepa.wake()
        return RedirectResponse(f"{prefix}/gepa-jobs#{job['job_id']}", status_code=303)

    async def live_gepa_jobs(request: Request) -> Response:
        return await live_stream(jobs_numbers, lambda _: False, catalog.jobs_version)

    # ---- agents ----
    async def agents_page(request: Request) -> Response:
        ws = current_workspace()
        sections = []
        for agent in await store.read(accounts.list_agents, ws):
            versions = await store.read(accounts.list_versions, ws, agent["agent_id"]) or []
            rows = []
            for v in sorted(versions, key=lambda v: -int(v["version"])):
                active = v["version"] == agent.get("active_version")
                action = (
                    Markup("<strong>active</strong>")
                    if active
                    else Markup(
                        "<form method='post' action='{}' class='inline'>{}<button type='submit'>Promote</button></form>"
                    ).format(
                        f"{prefix}/agents/{agent['agent_id']}/versions/{v['version']}/promote", _csrf_field(request)
                    )
                )
                rows.append(
                    Markup(
                        "<tr data-version='{}'><td>v{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre class='prompt'>{}</pre></td><td>{}</td></tr>"
                    ).format(
                        v["version"],
                        v["version"],
                        v["source"],
                        f"v{v['parent_version']}" if v.get("parent_version") else "",
                        iso(v["created_at"])
                        if isinstance(v.get("created_at"), int | float)
                        else v.get("created_at", ""),
                        str(v.get("system_prompt", ""))[:2000],
                        action,
                    )
                )
            sections.append(
                Markup(
                    "<section class='agent' id='{}'><h2>{} <span class='muted'>{}</span></h2><table class='grid'><thead><tr><th>version</th>"
                    "<th>source</th><th>parent</th><th>created</th><th>system prompt</th><th></th></tr></thead>"
                    "<tbody>{}</tbody></table></section>"
                ).format(agent["agent_id"], agent["name"], agent["agent_id"], Markup("").join(rows))
            )
        return page("Agents", Markup("").join(sections) or Markup("<p>no agents yet</p>"))

    async def promote(request: Request) -> Response:
        _check_csrf(request, await _form(request))
        agent_id, raw = str(request.path_params["agent_id"]), str(request.path_params["version"])
        if not raw.isdigit():
            raise NotFound(f"no version {raw}")
        v = await store.call(accounts.promote_version, current_workspace(), agent_id, int(raw))
        if v is None:
            raise NotFound(f"no version {raw} of agent {agent_id}")
        return RedirectResponse(f"{prefix}/agents#{agent_id}", status_code=303)

    routes = [
        Route("/login", html_errors(login), methods=["GET", "POST"]),
        Route("/logout", html_errors(logout), methods=["POST"]),
        Route("/batches", html_errors(batches)),
        Route("/batches/{batch_id}", html_errors(batch)),
        Route("/live-batches", live_batches),
        Route("/live-batches/{batch_id}", live_batch),
        Route("/gepa-jobs", html_errors(gepa_jobs_get), methods=["GET"]),
        Route("/gepa-jobs", html_errors(gepa_jobs_post), methods=["POST"]),
        Route("/live-gepa-jobs", live_gepa_jobs),
        Route("/agents", html_errors(agents_page)),
        Route("/agents/{agent_id}/versions/{version}/promote", html_errors(promote), methods=["POST"]),
    ]
    app: Starlette = create_app(
        catalog, prefix=prefix, run_indexer=False, live_poll_s=live_poll_s, routes=routes, nav=nav, show_sessions=False
    )
    return _RequireSession(app, store, prefix)


def _json_field(form: Mapping[str, str], name: str) -> Any:
    try:
        return json.loads(form.get(name, ""))
    except ValueError as e:
        raise ApiError(422, "invalid", f"is not JSON ({e})", name) from None


def _int_field(form: Mapping[str, str], name: str) -> int:
    raw = form.get(name, "").strip()
    if not raw.isdigit():
        raise ApiError(422, "invalid", f"must be a whole number, got {raw!r}", name)
    return int(raw)


def _endpoint_field(form: Mapping[str, str], name: str) -> Any:
    raw = form.get(name, "").strip()
    if raw.startswith("{"):
        return _json_field(form, name)
    return {"model": raw}
