"""Regression tests of the viewer's audit (issue 28), each named after its defect: served by
hypercorn under trio on 127.0.0.1, driven over real HTTP."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2
import pytest
import trio
from _view_data import make_sample, write_eval

from rollouts.dtypes import Endpoint, Message, Trajectory
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.view import FilesCatalog, create_app, serve
from rollouts.view.guard import TOKEN_COOKIE


async def _serve(nursery: trio.Nursery, app: Any, catalog: FilesCatalog | None = None) -> str:
    if catalog is not None:
        await catalog.index_once()  # (pages during indexing: test_view_catalog.py)
    url: str = await nursery.start(serve, app)
    return url.rstrip("/")


@pytest.fixture
async def run_dir(tmp_path: Path) -> Path:
    weird = 'we"ird'
    odd = Sample(
        id="line one\nline two",
        input={"user_message": "q"},
        trajectory=Trajectory(messages=(Message("user", "q"), Message("assistant", "the answer"))),
        score=Score((Metric(weird, 0.25, 1.0), Metric("correct", 1.0, 0.0))),
        status="completed",
    )
    write_eval(tmp_path / "run", [make_sample(0, True), odd], "odd names")
    return tmp_path / "run"


async def test_dns_rebinding_a_foreign_host_header_is_refused(run_dir: Path, nursery: trio.Nursery) -> None:
    catalog = FilesCatalog([run_dir], cache_dir=run_dir.parent / "cache")
    url = await _serve(nursery, create_app(catalog))
    port = url.rsplit(":", 1)[1]
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", ""):
            r = await client.get("/api/evals", headers={"host": host})
            assert r.status_code == 421, host
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
            assert (await client.get("/api/evals", headers={"host": host})).status_code == 200, host


async def test_a_non_local_host_needs_the_token_on_every_route(run_dir: Path, nursery: trio.Nursery) -> None:
    catalog = FilesCatalog([run_dir], cache_dir=run_dir.parent / "cache")
    token = "s3cret-token"
    app = create_app(catalog, allowed_hosts=["127.0.0.1", "viewer.lan"], access_token=token)
    url = await _serve(nursery, app)
    run = catalog.run_id(run_dir)
    routes = ["/", "/evals", f"/evals/{run}", "/api/evals", f"/live/eval/{run}", "/static/style.css"]
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for path in routes:
            r = await client.get(path)
            assert r.status_code == 401 and "token" in r.text, path
            r = await client.get(path, headers={"authorization": "Bearer wrong"})
            assert r.status_code == 401, path
        r = await client.get("/evals?token=wrong")
        assert r.status_code == 401 and "set-cookie" not in r.headers
        r = await client.get(f"/evals?x=1&token={token}")
        assert (r.status_code, r.headers["location"]) == (303, "/evals?x=1")  # the token leaves the address bar
        cookie = r.headers["set-cookie"].lower()
        assert cookie.startswith(TOKEN_COOKIE) and "httponly" in cookie and "samesite=strict" in cookie
        for path in routes[:-2]:
            assert (await client.get(path)).status_code == 200, path
        r = await client.get("/api/evals", headers={"host": "viewer.lan"})
        assert r.status_code == 200
    async with httpx2.AsyncClient(base_url=url, timeout=30) as bearer:
        r = await bearer.get("/api/evals", headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 200


class _Broken(FilesCatalog):
    async def list_eval_runs(self) -> Sequence[Any]:
        raise RuntimeError("a bug")


async def test_no_response_can_be_framed_500s_included(run_dir: Path, nursery: trio.Nursery) -> None:
    catalog = _Broken([run_dir], cache_dir=run_dir.parent / "cache")
    url = await _serve(nursery, create_app(catalog))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for path, status in (("/evals", 500), ("/api/evals", 500), ("/nope", 404), ("/gepa", 200),
                             ("/static/live.js", 200)):  # fmt: skip
            r = await client.get(path)
            assert r.status_code == status, path
            assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
            assert r.headers["x-frame-options"] == "DENY", path
            assert "script-src 'self'" in r.headers["content-security-policy"], path


async def test_huge_page_and_offset_numbers_are_a_400_naming_the_parameter(
    run_dir: Path, nursery: trio.Nursery
) -> None:
    catalog = FilesCatalog([run_dir], cache_dir=run_dir.parent / "cache")
    url = await _serve(nursery, create_app(catalog))
    run = catalog.run_id(run_dir)
    huge = str(10**22)
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for path, name in (
            (f"/evals/{run}?page={huge}", "page"), (f"/api/evals/{run}/samples?offset={huge}", "offset"),
            (f"/api/evals/{run}/samples?limit={huge}", "limit"), (f"/compare?a={run}&b={run}&page={huge}", "page"),
            (f"/sessions?page={huge}", "page"), (f"/api/sessions?offset={huge}", "offset"),
            (f"/evals/{run}?page={'9' * 5000}", "page"), (f"/evals/{run}?value={huge}x", "value"),
        ):  # fmt: skip
            r = await client.get(path)
            assert r.status_code == 400, (path, r.status_code)
            assert name in r.text, path
        assert (await client.get(f"/evals/{run}?page=2")).status_code == 200


async def test_a_metric_named_with_a_quote_and_a_sample_id_with_a_newline_are_viewable(
    run_dir: Path, nursery: trio.Nursery
) -> None:
    catalog = FilesCatalog([run_dir], cache_dir=run_dir.parent / "cache")
    url = await _serve(nursery, create_app(catalog), catalog)
    run = catalog.run_id(run_dir)
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        page = (await client.get(f"/evals/{run}")).text
        # the metric's mean is shown, and the sort link the page renders works
        mean = re.search(r'data-field="metric:we&#34;ird">([^<]*)<', page)
        assert mean and mean.group(1) == "0.250", page[:3000]
        links = re.findall(r'href="([^"]*sort=metric[^"]*)"', page)
        assert links
        for link in links:
            r = await client.get(link.replace("&amp;", "&"))
            assert r.status_code == 200, link
        # the odd sample opens from its own link
        href = re.search(r'href="([^"]*/samples/line[^"]*)"', page)
        assert href and href.group(1).split("?")[0].endswith(quote("line one\nline two", safe=""))
        r = await client.get(href.group(1))
        assert r.status_code == 200 and "the answer" in r.text
        r = await client.get(f"/api/evals/{run}/samples/" + quote("line one\nline two", safe=""))
        assert r.status_code == 200 and r.json()["id"] == "line one\nline two"


async def test_a_live_stream_ends_after_its_maximum_lifetime(tmp_path: Path, nursery: trio.Nursery) -> None:
    """Live streams ran for up to ~28 h: each now ends after `live_max_s` (the browser's
    EventSource reconnects by itself, told how soon by `retry:`)."""
    write_eval(tmp_path / "run", [make_sample(0, True)], "running", report=False)  # (running: no report yet)
    catalog = FilesCatalog([tmp_path / "run"], cache_dir=tmp_path / "cache")
    url = await _serve(nursery, create_app(catalog, live_poll_s=0.02, live_max_s=0.3))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        with trio.fail_after(20):
            async with client.stream("GET", f"/live/eval/{catalog.run_id(tmp_path / 'run')}") as r:
                lines = [line async for line in r.aiter_lines()]
    assert lines[0].startswith("retry: ") and lines[1].startswith("data: ")
    assert "event: done" not in lines


async def test_a_huge_tool_output_is_cut_at_a_bound_with_show_all(tmp_path: Path, nursery: trio.Nursery) -> None:
    """A 1 MB tool output of one repeated letter took 165 s to open in Chromium, 8 MB never did:
    a page shows TEXT_SHOWN characters of a message part, and "show all" loads the rest."""
    from rollouts.store import FileSessionStore
    from rollouts.view.render import TEXT_SHOWN

    big = "A" * 1_000_000 + "THE END"
    rtl = "file\u202eexe.txt"
    traj = Trajectory(
        messages=(Message("user", "run it"), Message("tool", big, tool_call_id="c1"), Message("assistant", rtl))
    )
    write_eval(tmp_path / "run", [Sample(id="big", input={"q": big}, trajectory=traj, status="completed")], "big")
    async with FileSessionStore(tmp_path / "sessions", fsync_every=0) as store:
        s = await store.create(endpoint=Endpoint("openai", "gpt-4.1"))
        await store.append_message(s.session_id, Message("user", "run it"))
        await store.append_message(s.session_id, Message("tool", big, tool_call_id="c1"))
    catalog = FilesCatalog([tmp_path / "run", tmp_path / "sessions"], cache_dir=tmp_path / "cache")
    url = await _serve(nursery, create_app(catalog), catalog)
    run = catalog.run_id(tmp_path / "run")
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        for page_url in (f"/evals/{run}/samples/big", f"/sessions/{s.session_id}"):
            r = await client.get(page_url)
            assert r.status_code == 200 and len(r.content) < 3 * TEXT_SHOWN + 20_000, (page_url, len(r.content))
            assert "THE END" not in r.text and f"{1_000_007 - TEXT_SHOWN:,} more characters" in r.text
            more = re.findall(r'href="([^"]*/text/[^"]*)"[^>]*>show all<', r.text)
            assert len(more) == 1, page_url
            full = await client.get(more[0].replace("&amp;", "&"))
            assert full.status_code == 200 and full.headers["content-type"].startswith("text/plain")
            assert full.text == big
            assert "frame-ancestors 'none'" in full.headers["content-security-policy"]
        page = (await client.get(f"/evals/{run}/samples/big")).text
        assert "\u202e" not in page and "file⟨U+202E⟩exe.txt" in page  # right-to-left override neutralised
        for bad in ("m=9&p=0", "m=1&p=5", "m=-1&p=0", "m=x&p=0"):
            r = await client.get(f"/text/sample?run={run}&id=big&{bad}")
            assert r.status_code in (400, 404), bad
