"""The viewer as an ASGI application (Starlette), served under trio by hypercorn.

    app = create_app(FilesCatalog(paths))          # the pages, a JSON API, live updates
    await serve(app, "127.0.0.1", 0)                # rollouts.view.server

Routes (HTML):  /  /sessions  /sessions/{id}  /sessions/{id}/diff  /evals  /evals/{run}
                /evals/{run}/samples/{sample id}  /compare?a=&b=  /sets/{set}  /training  /training/{run}
                /gepa  /gepa/{run}
                /gepa/{run}/candidates/{idx}
Routes (JSON):  /api/sessions  /api/sessions/{id}  /api/evals  /api/evals/{run}
                /api/evals/{run}/samples  /api/evals/{run}/samples/{sample id}
                /api/evals/{run}/sharing (the runs sharing sample ids with it)
                /api/sets  /api/sets/{set}  /api/training  /api/training/{run}  /api/gepa  /api/gepa/{run}
Live (SSE):     /live/{session|eval|gepa}/{id}: one `data:` event of JSON numbers each time the
                item changes, `event: done` when a run has finished (rollouts.view.live).

Handlers are module-level functions of `(ctx, request)`; `ViewContext` holds what they share:
`catalog_for(request)` gives the catalog a request reads (one catalog for `rollouts view`; the
rollout service makes one per request for the signed-in workspace), `links` every URL.

Mounting inside another app (the rollout service): `create_app(catalog_for=..., prefix="/ui")`
and `Mount("/ui", app)`; a mounted app's lifespan does not run, so the host starts
`catalog.run_indexer` itself if the catalog has one (a database catalog needs none).

Every response, errors and 500s included, carries a Content-Security-Policy that allows only
this origin's own script and style and forbids framing (`frame-ancestors 'none'`, and
`X-Frame-Options: DENY` for older browsers), so even a page that failed to escape model output
would not run its scripts, and no other site can put a page under a user's click.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from rollouts.view import pages
from rollouts.view.catalog import Catalog, NotFound, SessionQuery
from rollouts.view.guard import LOCAL_HOSTS, HostGuard
from rollouts.view.links import ServerLinks
from rollouts.view.live import LIVE_MAX_LIFETIME_S, live_response
from rollouts.view.render import STATIC, money, num


class _AnyTextConvertor(PathConvertor):
    """`path`, newlines included (an id may hold any text; Starlette's `.*` stops at a newline)."""

    regex = "[\\s\\S]*"


register_url_convertor("anytext", _AnyTextConvertor())

__all__ = ["LIVE_POLL_S", "SecurityHeaders", "ViewContext", "create_app", "live_numbers"]

LIVE_POLL_S = 1.0
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class SecurityHeaders:
    """Sets the Content-Security-Policy and friends on every HTTP response (plain ASGI, so
    streaming responses pass through untouched). Headers of the same names set inside are
    replaced: the outermost wrapper decides."""

    def __init__(self, app: ASGIApp, *, referrer_policy: str = "no-referrer") -> None:
        self.app = app
        self.headers = (
            (b"content-security-policy", _CSP.encode()),
            (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", referrer_policy.encode()),
        )
        self._names = {k for k, _ in self.headers}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if bytes(k).lower() not in self._names]
                message = {**message, "headers": [*kept, *self.headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class _ViewerApp(Starlette):
    """Starlette with the security headers and the host/token guard outside its error
    middleware (so a 500 has the headers too)."""

    guard: dict[str, Any] | None = None

    def build_middleware_stack(self) -> ASGIApp:
        app = super().build_middleware_stack()
        if self.guard is not None:
            app = HostGuard(app, **self.guard)
        return SecurityHeaders(app)


@dataclasses.dataclass(frozen=True)
class ViewContext:
    """What the viewer's handlers share. `still_allowed(request)` is re-checked by live streams
    (a host with sign-in ends a stream whose session was revoked)."""

    catalog_for: Callable[[Request], Catalog]
    links: ServerLinks
    live_poll_s: float = LIVE_POLL_S
    still_allowed: Callable[[Request], Awaitable[bool]] | None = None
    live_max_s: float = LIVE_MAX_LIFETIME_S


Handler = Callable[[ViewContext, Request], Awaitable[Response]]


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, frozenset | set | tuple):
        return list(value)
    return str(value)


def _json(value: Any, status: int = 200) -> Response:
    body = json.dumps(value, default=_json_default, ensure_ascii=False)
    return Response(body, status_code=status, media_type="application/json")


def _params(request: Request) -> dict[str, str]:
    return dict(request.query_params)


def _pp(request: Request, name: str) -> str:
    return str(request.path_params[name])


async def live_numbers(
    catalog: Catalog, kind: str, item_id: str, links: ServerLinks | None = None
) -> tuple[dict[str, Any], bool]:
    """What a live page refreshes (texts formatted as the page shows them), and whether the
    item has finished (no more updates will come). `links` make the links inside what is
    refreshed (a training run's curves)."""
    links = links or ServerLinks()
    if kind == "eval":
        row = (await catalog.get_eval_run(item_id)).row
        data = {"status": row.status, "n_samples": num(row.n_samples), "n_failed": num(row.n_failed),
                "mean_reward": num(row.mean_reward)}  # fmt: skip
        data.update({f"metric:{k}": num(v) for k, v in row.metrics.items()})
        return data, row.status != "running" and row.indexed
    if kind == "gepa":
        d = await catalog.get_gepa_run(item_id)
        r = d.row
        data = {"status": r.status, "best_score": num(r.best_score), "best_idx": str(r.best_idx),
                "n_candidates": str(r.n_candidates), "iterations": str(r.iterations),
                "metric_calls": num(r.metric_calls), "plot": str(pages.gepa_plot(d))}  # fmt: skip
        return data, r.status != "running"
    if kind == "training":
        t = await catalog.get_training_run(item_id)
        data = {"steps": num(t.row.steps), "reward_last": num(t.row.reward_last),
                "heldout_last": num(t.row.heldout_last) or "—", "curves": str(pages.training_curves(t, links))}  # fmt: skip
        return data, not t.row.active
    if kind == "session":
        s = await catalog.get_session(item_id, limit=1)
        data = {"status": s.row.status, "n_messages": num(s.n_messages), "tokens": num(s.row.tokens),
                "cost": money(s.row.cost_usd)}  # fmt: skip
        return data, s.row.status in ("completed", "failed", "aborted")
    raise NotFound(f"no live view of {kind!r}")


# ---- HTML ---------------------------------------------------------------------------------------


async def index(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.index_page(ctx.catalog_for(r), ctx.links, _params(r)))


def _has_sessions(ctx: ViewContext) -> None:
    if not ctx.links.show_sessions:
        raise NotFound("this viewer has no sessions (the rollout service keeps batches, not sessions)")


async def sessions(ctx: ViewContext, r: Request) -> Response:
    _has_sessions(ctx)
    return HTMLResponse(await pages.sessions_page(ctx.catalog_for(r), ctx.links, _params(r)))


async def session(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.session_page(ctx.catalog_for(r), ctx.links, _pp(r, "session_id"), _params(r)))


async def session_diff(ctx: ViewContext, r: Request) -> Response:
    page = await pages.session_diff_page(ctx.catalog_for(r), ctx.links, _pp(r, "session_id"), _params(r))
    return HTMLResponse(page)


async def evals(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.evals_page(ctx.catalog_for(r), ctx.links, _params(r)))


async def eval_run(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.eval_run_page(ctx.catalog_for(r), ctx.links, _pp(r, "run_id"), _params(r)))


async def sample(ctx: ViewContext, r: Request) -> Response:
    page = await pages.sample_page(ctx.catalog_for(r), ctx.links, _pp(r, "run_id"), _pp(r, "sample_id"), _params(r))
    return HTMLResponse(page)


async def compare(ctx: ViewContext, r: Request) -> Response:
    params = _params(r)
    checked = r.query_params.getlist("run")
    if checked:  # (the runs list's checkboxes: run=A&run=B..., base= the first one checked)
        base = params.get("base", "")
        params["runs"] = ",".join([base] * (base in checked) + [x for x in checked if x != base])
    return HTMLResponse(await pages.compare_page(ctx.catalog_for(r), ctx.links, params))


async def eval_set(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.eval_set_page(ctx.catalog_for(r), ctx.links, _pp(r, "set_id"), _params(r)))


def _has_training(ctx: ViewContext) -> None:
    if not ctx.links.show_training:
        raise NotFound("this viewer has no training runs (they are directories on disk: rollouts view DIR)")


async def training_runs(ctx: ViewContext, r: Request) -> Response:
    _has_training(ctx)
    return HTMLResponse(await pages.training_runs_page(ctx.catalog_for(r), ctx.links, _params(r)))


async def training_run(ctx: ViewContext, r: Request) -> Response:
    _has_training(ctx)
    page = await pages.training_run_page(ctx.catalog_for(r), ctx.links, _pp(r, "run_id"), _params(r))
    return HTMLResponse(page)


async def gepa_runs(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.gepa_runs_page(ctx.catalog_for(r), ctx.links, _params(r)))


async def gepa_run(ctx: ViewContext, r: Request) -> Response:
    return HTMLResponse(await pages.gepa_run_page(ctx.catalog_for(r), ctx.links, _pp(r, "run_id"), _params(r)))


async def candidate(ctx: ViewContext, r: Request) -> Response:
    idx = int(r.path_params["idx"])
    return HTMLResponse(await pages.candidate_page(ctx.catalog_for(r), ctx.links, _pp(r, "run_id"), idx, _params(r)))


async def sample_text(ctx: ViewContext, r: Request) -> Response:
    return PlainTextResponse(await pages.sample_text(ctx.catalog_for(r), _params(r)))


async def session_text(ctx: ViewContext, r: Request) -> Response:
    return PlainTextResponse(await pages.session_text(ctx.catalog_for(r), _params(r)))


# ---- JSON ---------------------------------------------------------------------------------------


async def api_sessions(ctx: ViewContext, r: Request) -> Response:
    _has_sessions(ctx)
    p = _params(r)
    q = SessionQuery(text=p.get("q", ""), status=p.get("status", ""), model=p.get("model", ""),
                     tag=pages._pair(p, "tag"), offset=pages.offset_param(p), limit=pages._int(p, "limit", 50))  # fmt: skip
    return _json(await ctx.catalog_for(r).list_sessions(q))


async def api_session(ctx: ViewContext, r: Request) -> Response:
    p = _params(r)
    d = await ctx.catalog_for(r).get_session(
        _pp(r, "session_id"), offset=pages.offset_param(p), limit=pages._int(p, "limit", 200)
    )
    return _json(d)


async def api_evals(ctx: ViewContext, r: Request) -> Response:
    return _json(list(await ctx.catalog_for(r).list_eval_runs()))


async def api_eval(ctx: ViewContext, r: Request) -> Response:
    return _json(await ctx.catalog_for(r).get_eval_run(_pp(r, "run_id")))


async def api_sharing(ctx: ViewContext, r: Request) -> Response:
    run_id = _pp(r, "run_id")
    return _json({"run_id": run_id, "sharing": list(await ctx.catalog_for(r).runs_sharing_samples(run_id))})


async def api_samples(ctx: ViewContext, r: Request) -> Response:
    p = _params(r)
    q = pages.sample_query(p)
    q = dataclasses.replace(q, offset=pages.offset_param(p, q.offset), limit=pages._int(p, "limit", q.limit))
    return _json(await ctx.catalog_for(r).list_samples(_pp(r, "run_id"), q))


async def api_sample(ctx: ViewContext, r: Request) -> Response:
    return _json((await ctx.catalog_for(r).get_sample(_pp(r, "run_id"), _pp(r, "sample_id"))).to_dict())


async def api_sets(ctx: ViewContext, r: Request) -> Response:
    return _json(list(await ctx.catalog_for(r).list_eval_sets()))


async def api_set(ctx: ViewContext, r: Request) -> Response:
    return _json(await ctx.catalog_for(r).get_eval_set(_pp(r, "set_id")))


async def api_training_runs(ctx: ViewContext, r: Request) -> Response:
    _has_training(ctx)
    return _json(list(await ctx.catalog_for(r).list_training_runs()))


async def api_training_run(ctx: ViewContext, r: Request) -> Response:
    _has_training(ctx)
    return _json(await ctx.catalog_for(r).get_training_run(_pp(r, "run_id")))


async def api_gepa_runs(ctx: ViewContext, r: Request) -> Response:
    return _json(list(await ctx.catalog_for(r).list_gepa_runs()))


async def api_gepa_run(ctx: ViewContext, r: Request) -> Response:
    return _json(await ctx.catalog_for(r).get_gepa_run(_pp(r, "run_id")))


# ---- live ---------------------------------------------------------------------------------------


async def live(ctx: ViewContext, r: Request) -> Response:
    kind, item_id = _pp(r, "kind"), _pp(r, "item_id")
    if kind not in ("session", "eval", "gepa", "training"):
        raise NotFound(f"no live view of {kind!r}")
    catalog = ctx.catalog_for(r)
    # the token is read before the numbers, so a change in between shows in the next poll
    last = await catalog.version(kind, item_id)  # type: ignore[arg-type]  # NotFound -> 404
    first, finished = await live_numbers(catalog, kind, item_id, ctx.links)

    async def poll() -> tuple[dict[str, Any], bool] | None:
        nonlocal last
        token = await catalog.version(kind, item_id)  # type: ignore[arg-type]
        if token == last:
            return None
        last = token
        data, done = await live_numbers(catalog, kind, item_id, ctx.links)
        if kind == "eval":  # the samples table of the page, as its filters show it
            data["rows"] = await pages.sample_rows(catalog, ctx.links, item_id, _params(r))
        return data, done

    allowed = ctx.still_allowed
    return live_response(
        first, poll, finished=finished, poll_s=ctx.live_poll_s, max_lifetime_s=ctx.live_max_s,
        still_allowed=(lambda: allowed(r)) if allowed else None,
    )  # fmt: skip


# ---- errors -------------------------------------------------------------------------------------


def error_page(links: ServerLinks, request: Request, status: int, heading: str, message: str) -> Response:
    """An error as the viewer shows it: JSON under /api/, else the error page."""
    if request.url.path.startswith(f"{links.prefix}/api/"):
        return _json({"error": message}, status)
    body = pages.render("error.html", links, title=heading, status=status, heading=heading, message=message)
    return HTMLResponse(body, status_code=status)


def _exception_handlers(links: ServerLinks) -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    async def not_found(request: Request, exc: Exception) -> Response:
        return error_page(links, request, 404, "Not found", str(exc) or "no such page")

    async def bad_request(request: Request, exc: Exception) -> Response:
        return error_page(links, request, 400, "Bad request", str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        heading = "Not found" if exc.status_code == 404 else "Error"
        detail = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(links, request, exc.status_code, heading, detail)

    return {NotFound: not_found, ValueError: bad_request, HTTPException: http_error}


# ---- the app ------------------------------------------------------------------------------------

_ROUTES: tuple[tuple[str, Handler], ...] = (
    ("/", index),
    ("/sessions", sessions),
    ("/sessions/{session_id}", session),
    ("/sessions/{session_id}/diff", session_diff),
    ("/evals", evals),
    ("/evals/{run_id}", eval_run),
    ("/evals/{run_id}/samples/{sample_id:anytext}", sample),
    ("/compare", compare),
    ("/sets/{set_id}", eval_set),
    ("/training", training_runs),
    ("/training/{run_id}", training_run),
    ("/text/sample", sample_text),
    ("/text/session", session_text),
    ("/gepa", gepa_runs),
    ("/gepa/{run_id}", gepa_run),
    ("/gepa/{run_id}/candidates/{idx:int}", candidate),
    ("/api/sessions", api_sessions),
    ("/api/sessions/{session_id}", api_session),
    ("/api/evals", api_evals),
    ("/api/evals/{run_id}", api_eval),
    ("/api/evals/{run_id}/samples", api_samples),
    ("/api/evals/{run_id}/sharing", api_sharing),
    ("/api/evals/{run_id}/samples/{sample_id:anytext}", api_sample),
    ("/api/training", api_training_runs),
    ("/api/training/{run_id}", api_training_run),
    ("/api/sets", api_sets),
    ("/api/sets/{set_id}", api_set),
    ("/api/gepa", api_gepa_runs),
    ("/api/gepa/{run_id}", api_gepa_run),
    ("/live/{kind}/{item_id}", live),
)


def _endpoint(ctx: ViewContext, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await handler(ctx, request)

    return endpoint


def view_routes(ctx: ViewContext) -> list[BaseRoute]:
    """The viewer's routes (and its static files) over `ctx`."""
    made: list[BaseRoute] = [Route(path, _endpoint(ctx, handler)) for path, handler in _ROUTES]
    return [*made, Mount("/static", StaticFiles(directory=STATIC), name="static")]


def create_app(
    catalog: Catalog | None = None,
    *,
    catalog_for: Callable[[Request], Catalog] | None = None,
    prefix: str = "",
    run_indexer: bool = True,
    live_poll_s: float = LIVE_POLL_S,
    routes: Sequence[BaseRoute] = (),
    nav: Sequence[tuple[str, str]] = (),
    show_sessions: bool = True,
    still_allowed: Callable[[Request], Awaitable[bool]] | None = None,
    allowed_hosts: Sequence[str] | None = tuple(LOCAL_HOSTS),
    access_token: str | None = None,
    live_max_s: float = LIVE_MAX_LIFETIME_S,
) -> Starlette:
    """The viewer over `catalog` (or over `catalog_for(request)`, a catalog per request).
    `prefix` is where it is mounted (links include it); `run_indexer` starts
    `catalog.run_indexer` (if it has one) for the app's lifetime.

    `routes` and `nav` are the seam for a host: the rollout service adds its pages
    (batches with live progress, the GEPA jobs form, agent versions with promote) as more
    routes, and their (label, url) to the top navigation; `show_sessions=False` (a catalog
    without sessions) leaves Sessions out of the navigation and the index.

    `live_max_s` bounds a live stream's life (the page reconnects).
    `allowed_hosts` are the host names it answers for (`Host` header; None: any, for a host app
    that checks its own) and `access_token` the token every request must carry (rollouts.view.guard)."""
    if (catalog is None) == (catalog_for is None):
        raise TypeError("create_app takes a catalog or catalog_for, not both")
    if catalog is not None:
        fixed = catalog
        catalog_for = lambda _request: fixed  # noqa: E731
    assert catalog_for is not None
    links = ServerLinks(prefix, tuple(nav), show_sessions=show_sessions)
    pages.compile_templates()
    ctx = ViewContext(catalog_for, links, live_poll_s, still_allowed, live_max_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        indexer = getattr(catalog, "run_indexer", None)
        if not run_indexer or indexer is None:
            yield
            return
        async with trio.open_nursery() as nursery:
            await nursery.start(indexer)
            yield
            nursery.cancel_scope.cancel()

    app = _ViewerApp(
        routes=[*routes, *view_routes(ctx)], exception_handlers=_exception_handlers(links), lifespan=lifespan
    )
    if allowed_hosts is not None or access_token is not None:
        app.guard = {"hosts": allowed_hosts, "token": access_token, "cookie_path": prefix or "/"}
    return app
