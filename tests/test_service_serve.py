"""`rollouts service serve` as a process: the address it prints, how it stops, what it leaves behind."""

from __future__ import annotations

import httpx2
import trio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from rollouts.service.server import serve
from rollouts.view.server import serve as view_serve


async def test_ui_without_a_trailing_slash_redirects_to_the_ui(db_url: str, nursery: trio.Nursery) -> None:
    """Issue 33, item 11: `http://127.0.0.1:8321/ui`, the address serve prints, was a JSON 404."""
    url = await nursery.start(lambda task_status: serve(db_url, port=0, gepa_jobs=False, task_status=task_status))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/ui")
        assert (r.status_code, r.headers["location"]) == (307, "/ui/")
        r = await client.get("/ui?next=x")
        assert r.headers["location"] == "/ui/?next=x"
        r = await client.get("/ui", follow_redirects=True)
        assert r.status_code == 200 and str(r.url).endswith("/ui/login")


async def test_serve_on_an_ipv6_address_with_or_without_brackets(db_url: str, nursery: trio.Nursery) -> None:
    """Issue 32 item 5: the service and the viewer built hypercorn's config each their own way
    (only the viewer's put an IPv6 host in brackets); one builder now, view.server.hypercorn_config,
    and both serve an IPv6 host written either way."""
    for host in ("::1", "[::1]"):
        url = await nursery.start(
            lambda task_status, host=host: serve(
                db_url, host=host, port=0, gepa_jobs=False, ui=False, task_status=task_status
            )
        )
        assert url.startswith("http://[::1]:")
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            r = await client.get("/v1/health")
            assert r.status_code == 200 and r.json()["status"] == "ok"
    app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("viewer"))])
    for host in ("::1", "[::1]"):
        url = await nursery.start(lambda task_status, host=host: view_serve(app, host, 0, task_status=task_status))
        async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
            assert (await client.get("/")).text == "viewer"
