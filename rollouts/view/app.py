"""The viewer as an ASGI application (Starlette), served under trio by hypercorn.

    app = create_app(FilesCatalog(paths))          # the pages, a JSON API, live updates
    await serve(app, "127.0.0.1", 0)                # rollouts.view.server

Routes (HTML):  /  /sessions  /sessions/{id}  /sessions/{id}/diff  /evals  /evals/{run}
                /evals/{run}/samples/{sample id}  /compare?a=&b=  /gepa  /gepa/{run}
                /gepa/{run}/candidates/{idx}
Routes (JSON):  /api/sessions  /api/sessions/{id}  /api/evals  /api/evals/{run}
                /api/evals/{run}/samples  /api/evals/{run}/samples/{sample id}
                /api/gepa  /api/gepa/{run}
Live (SSE):     /live/{session|eval|gepa}/{id}: one `data:` event of JSON numbers each time the
                item changes, `event: done` when a run has finished.

Mounting inside another app (the rollout service): `create_app(catalog, prefix="/ui")` and
`Mount("/ui", app)`; a mounted app's lifespan does not run, so the host starts
`catalog.run_indexer` itself if the catalog has one (a database catalog needs none).

Every response carries a Content-Security-Policy that allows only this origin's own script
and style, so even a page that failed to escape model output would not run its scripts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from rollouts.view import pages
from rollouts.view.catalog import Catalog, NotFound, SessionQuery
from rollouts.view.links import ServerLinks
from rollouts.view.render import STATIC, money, num

LIVE_POLL_S = 1.0
LIVE_MAX_EVENTS = 100_000  # a live stream ends after this many polls (about a day); the page reconnects
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'"
)


class _SecurityHeaders:
    """Adds the Content-Security-Policy and friends to every HTTP response (plain ASGI, so
    streaming responses pass through untouched)."""

    _HEADERS = (
        (b"content-security-policy", _CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    )

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self._HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


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


async def live_numbers(catalog: Catalog, kind: str, item_id: str) -> tuple[dict[str, Any], bool]:
    """What a live page refreshes (texts formatted as the page shows them), and whether the
    item has finished (no more updates will come)."""
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
    if kind == "session":
        s = await catalog.get_session(item_id, limit=1)
        data = {"status": s.row.status, "n_messages": num(s.n_messages), "tokens": num(s.row.tokens),
                "cost": money(s.row.cost_usd)}  # fmt: skip
        return data, s.row.status in ("completed", "failed", "aborted")
    raise NotFound(f"no live view of {kind!r}")


def create_app(
    catalog: Catalog,
    *,
    prefix: str = "",
    run_indexer: bool = True,
    live_poll_s: float = LIVE_POLL_S,
    routes: Sequence[BaseRoute] = (),
    nav: Sequence[tuple[str, str]] = (),
    show_sessions: bool = True,
) -> Starlette:
    """The viewer over `catalog`. `prefix` is where it is mounted (links include it);
    `run_indexer` starts `catalog.run_indexer` (if it has one) for the app's lifetime.

    `routes` and `nav` are the seam for a host: the rollout service adds its pages (batches
    with live progress, the GEPA jobs form, agent versions with promote) as more routes, and
    their (label, url) to the top navigation; `pages.render_page` renders them in the same
    layout; `show_sessions=False` (a catalog without sessions) leaves Sessions out of the navigation
    and the index."""
    links = ServerLinks(prefix, tuple(nav), show_sessions=show_sessions)
    pages.compile_templates()

    def html(render: Callable[[Request], Awaitable[str]]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return HTMLResponse(await render(request))

        return endpoint

    def params(request: Request) -> dict[str, str]:
        return dict(request.query_params)

    def pp(request: Request, name: str) -> str:
        return str(request.path_params[name])

    # ---- HTML ----
    async def index(r: Request) -> str:
        return await pages.index_page(catalog, links, params(r))

    async def sessions(r: Request) -> str:
        return await pages.sessions_page(catalog, links, params(r))

    async def session(r: Request) -> str:
        return await pages.session_page(catalog, links, pp(r, "session_id"), params(r))

    async def session_diff(r: Request) -> str:
        return await pages.session_diff_page(catalog, links, pp(r, "session_id"), params(r))

    async def evals(r: Request) -> str:
        return await pages.evals_page(catalog, links, params(r))

    async def eval_run(r: Request) -> str:
        return await pages.eval_run_page(catalog, links, pp(r, "run_id"), params(r))

    async def sample(r: Request) -> str:
        return await pages.sample_page(catalog, links, pp(r, "run_id"), pp(r, "sample_id"), params(r))

    async def compare(r: Request) -> str:
        return await pages.compare_page(catalog, links, params(r))

    async def gepa_runs(r: Request) -> str:
        return await pages.gepa_runs_page(catalog, links, params(r))

    async def gepa_run(r: Request) -> str:
        return await pages.gepa_run_page(catalog, links, pp(r, "run_id"), params(r))

    async def candidate(r: Request) -> str:
        return await pages.candidate_page(catalog, links, pp(r, "run_id"), int(r.path_params["idx"]), params(r))

    # ---- JSON ----
    async def api_sessions(r: Request) -> Response:
        p = params(r)
        q = dataclasses.replace(
            SessionQuery(text=p.get("q", ""), status=p.get("status", ""), model=p.get("model", ""),
                               tag=pages._pair(p, "tag")),
            offset=pages._int(p, "offset"), limit=pages._int(p, "limit", 50),
        )  # fmt: skip
        return _json(await catalog.list_sessions(q))

    async def api_session(r: Request) -> Response:
        p = params(r)
        d = await catalog.get_session(
            pp(r, "session_id"), offset=pages._int(p, "offset"), limit=pages._int(p, "limit", 200)
        )
        return _json(d)

    async def api_evals(r: Request) -> Response:
        return _json(list(await catalog.list_eval_runs()))

    async def api_eval(r: Request) -> Response:
        return _json(await catalog.get_eval_run(pp(r, "run_id")))

    async def api_samples(r: Request) -> Response:
        p = params(r)
        q = pages.sample_query(p)
        q = dataclasses.replace(q, offset=pages._int(p, "offset", q.offset), limit=pages._int(p, "limit", q.limit))
        return _json(await catalog.list_samples(pp(r, "run_id"), q))

    async def api_sample(r: Request) -> Response:
        return _json((await catalog.get_sample(pp(r, "run_id"), pp(r, "sample_id"))).to_dict())

    async def api_gepa_runs(r: Request) -> Response:
        return _json(list(await catalog.list_gepa_runs()))

    async def api_gepa_run(r: Request) -> Response:
        return _json(await catalog.get_gepa_run(pp(r, "run_id")))

    # ---- live ----
    async def live(r: Request) -> Response:
        kind, item_id = pp(r, "kind"), pp(r, "item_id")
        if kind not in ("session", "eval", "gepa"):
            raise NotFound(f"no live view of {kind!r}")
        # the token is read before the numbers, so a change in between shows in the next poll
        last = await catalog.version(kind, item_id)  # type: ignore[arg-type]  # NotFound -> 404
        first, finished = await live_numbers(catalog, kind, item_id)

        async def events() -> AsyncIterator[str]:
            nonlocal first, finished, last
            yield f"data: {json.dumps(first)}\n\n"
            for n in range(LIVE_MAX_EVENTS):
                if finished:
                    yield "event: done\ndata: {}\n\n"
                    return
                await trio.sleep(live_poll_s)
                token = await catalog.version(kind, item_id)  # type: ignore[arg-type]
                if token != last:
                    last = token
                    first, finished = await live_numbers(catalog, kind, item_id)
                    yield f"data: {json.dumps(first)}\n\n"
                elif n % 15 == 14:
                    yield ": keep-alive\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ---- errors ----
    def error_page(request: Request, status: int, heading: str, message: str) -> Response:
        if request.url.path.startswith(f"{links.prefix}/api/"):
            return _json({"error": message}, status)
        body = pages.render("error.html", links, title=heading, status=status, heading=heading, message=message)
        return HTMLResponse(body, status_code=status)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_page(request, 404, "Not found", str(exc) or "no such page")

    async def bad_request(request: Request, exc: Exception) -> Response:
        return error_page(request, 400, "Bad request", str(exc))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        heading = "Not found" if exc.status_code == 404 else "Error"
        detail = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, heading, detail)

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

    all_routes = [
        *routes,
        Route("/", html(index)),
        Route("/sessions", html(sessions)),
        Route("/sessions/{session_id}", html(session)),
        Route("/sessions/{session_id}/diff", html(session_diff)),
        Route("/evals", html(evals)),
        Route("/evals/{run_id}", html(eval_run)),
        Route("/evals/{run_id}/samples/{sample_id:path}", html(sample)),
        Route("/compare", html(compare)),
        Route("/gepa", html(gepa_runs)),
        Route("/gepa/{run_id}", html(gepa_run)),
        Route("/gepa/{run_id}/candidates/{idx:int}", html(candidate)),
        Route("/api/sessions", api_sessions),
        Route("/api/sessions/{session_id}", api_session),
        Route("/api/evals", api_evals),
        Route("/api/evals/{run_id}", api_eval),
        Route("/api/evals/{run_id}/samples", api_samples),
        Route("/api/evals/{run_id}/samples/{sample_id:path}", api_sample),
        Route("/api/gepa", api_gepa_runs),
        Route("/api/gepa/{run_id}", api_gepa_run),
        Route("/live/{kind}/{item_id}", live),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=all_routes,
        exception_handlers={NotFound: not_found, ValueError: bad_request, HTTPException: http_error},
        lifespan=lifespan,
        middleware=[Middleware(_SecurityHeaders)],
    )

    return app
