"""`rollouts service serve` as a process: the address it prints, how it stops, what it leaves behind."""

from __future__ import annotations

import httpx2
import trio

from rollouts.service.server import serve


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
