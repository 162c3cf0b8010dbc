"""The viewer's HTTP layer: every page and API route over real files, served by hypercorn under
trio on 127.0.0.1; 404 pages for unknown ids; path traversal refused; model output escaped;
live updates by server-sent events."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import trio
from _view_data import ViewData, append_gepa_candidate, gepa_result, make_sample, make_view_data

from rollouts.dtypes import Message
from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, SampleLog, write_json_atomic
from rollouts.eval.report import EvalReport
from rollouts.gepa.checkpoint import write_result_files
from rollouts.view import FilesCatalog, create_app, serve


@dataclass
class View:
    data: ViewData
    catalog: FilesCatalog
    client: httpx2.AsyncClient
    url: str

    def run(self, path: Path) -> str:
        return self.catalog.run_id(path)


@pytest.fixture
async def view(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[View]:
    data = await make_view_data(tmp_path / "data")
    catalog = FilesCatalog([data.root], cache_dir=tmp_path / "cache", refresh_interval=0.1)
    await catalog.index_once()  # (pages during indexing: test_view_catalog.py)
    url = await nursery.start(serve, create_app(catalog, live_poll_s=0.02))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        yield View(data, catalog, client, url)


async def _ok(v: View, path: str) -> str:
    r = await v.client.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text[:2000])
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    return r.text


def _rows(html: str, table_id: str) -> list[str]:
    body = html.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr[ >].*?</tr>", re.split(r"<tbody[^>]*>", body, maxsplit=1)[1], flags=re.S)


# --------------------------------------------------------------------------------------------
# sessions
# --------------------------------------------------------------------------------------------


async def test_sessions_list_newest_first_with_search_and_filters(view: View) -> None:
    d = view.data
    html = await _ok(view, "/sessions")
    ids = re.findall(r'href="/sessions/([^"/]+)"', html)
    assert ids == sorted({d.root_session, d.branch_session, d.xss_session}, reverse=True)

    html = await _ok(view, "/sessions?q=DANGEROUS")  # message text, case-insensitive
    assert re.findall(r'href="/sessions/([^"/]+)"', html) == [d.xss_session]
    html = await _ok(view, "/sessions?status=failed")
    assert re.findall(r'href="/sessions/([^"/]+)"', html) == [d.branch_session]
    html = await _ok(view, "/sessions?tag=variant%3Dretry")
    assert re.findall(r'href="/sessions/([^"/]+)"', html) == [d.branch_session]
    html = await _ok(view, "/sessions?model=gpt-4.1")
    assert re.findall(r'href="/sessions/([^"/]+)"', html) == [d.xss_session]
    html = await _ok(view, "/sessions?q=no+such+text+anywhere")
    assert "no sessions match" in html


async def test_session_page_shows_the_transcript_and_the_branch_tree(view: View) -> None:
    d = view.data
    html = await _ok(view, f"/sessions/{d.root_session}")
    assert '<details class="thinking"><summary>thinking</summary><div class="text">precedence first</div>' in html
    assert "<b>calculator</b>" in html and "&#34;expression&#34;: &#34;7 + 5 * 3&#34;" in html
    assert "120 in · 30 out · $0.0012" in html  # usage and cost per message
    assert f'href="/sessions/{d.branch_session}"' in html  # the branch tree links the branch
    html = await _ok(view, f"/sessions/{d.branch_session}")
    assert re.search(r'class="msg tool\s+error"', html) and '<span class="badge bad">error</span>' in html
    assert f'href="/sessions/{d.root_session}"' in html
    assert f'href="/sessions/{d.branch_session}/diff"' in html
    assert '<li class="current">' in html


async def test_branch_diff_against_the_parent_from_the_branch_point(view: View) -> None:
    d = view.data
    html = await _ok(view, f"/sessions/{d.branch_session}/diff")
    rows = re.findall(r'<div class="diffrow (\w+)">.*?id="m(\d+)"', html, flags=re.S)
    ops = sorted(rows)
    assert ("branch", "2") in ops and ("branch", "3") in ops  # the branch's own messages
    assert ("parent", "2") in ops and ("parent", "3") in ops  # what the parent had there instead
    assert "division by zero" in html and "The answer is 22." in html
    r = await view.client.get(f"/sessions/{d.root_session}/diff")
    assert r.status_code == 404 and "not a branch" in r.text


# --------------------------------------------------------------------------------------------
# evaluations
# --------------------------------------------------------------------------------------------


async def test_eval_runs_list_and_run_page_with_metrics(view: View) -> None:
    html = await _ok(view, "/evals")
    assert "arith-baseline" in html and "arith-candidate" in html and "live-eval" in html
    run = view.run(view.data.eval_a)
    html = await _ok(view, f"/evals/{run}")
    assert 'id="metrics"' in html and ">correct<" in html and ">length<" in html
    rows = _rows(html, "samples")
    assert len(rows) == 50 and "q000" in rows[0] and "q049" in rows[-1]
    assert 'rel="next"' in html and "1\u201350 of 120" in html
    html = await _ok(view, f"/evals/{run}?page=3")
    rows = _rows(html, "samples")
    assert len(rows) == 20 and "q100" in rows[0]


async def test_sample_table_sorts_filters_and_searches_on_the_server(view: View) -> None:
    run = view.run(view.data.eval_a)
    rows = _rows(await _ok(view, f"/evals/{run}?sort=reward&order=desc"), "samples")
    assert all(">1.000<" in r for r in rows[:10])
    rows = _rows(await _ok(view, f"/evals/{run}?failed=yes"), "samples")
    assert len(rows) == 1 and "q005" in rows[0] and "provider_error" in rows[0]
    rows = _rows(await _ok(view, f"/evals/{run}?metric=correct&op=%3C&value=0.5"), "samples")
    assert rows and all("not sure" in r for r in rows)
    rows = _rows(await _ok(view, f"/evals/{run}?meta=level%3Dhard&sort=id"), "samples")
    assert rows and all(int(re.search(r"q(\d+)", r)[1]) % 2 == 0 for r in rows)  # type: ignore[index]
    rows = _rows(await _ok(view, f"/evals/{run}?q=what+is+42+*+3"), "samples")
    assert len(rows) == 1 and "q042" in rows[0]
    rows = _rows(await _ok(view, f"/evals/{run}?sort=metric%3Alength&order=desc"), "samples")
    assert "q007" in rows[0]  # the longest response
    for bad in ("sort=nonsense", "failed=maybe", "metric=correct&value=abc", "op=%3D%3D&metric=x&value=1"):
        r = await view.client.get(f"/evals/{run}?{bad}")
        assert r.status_code == 400, bad


async def test_sample_page_shows_the_trajectory_and_score(view: View) -> None:
    run = view.run(view.data.eval_a)
    html = await _ok(view, f"/evals/{run}/samples/q004")
    assert "what is 4 * 3?" in html and ">correct<" in html and "&#34;level&#34;: &#34;hard&#34;" in html
    html = await _ok(view, f"/evals/{run}/samples/q005")
    assert "provider error: 529 overloaded" in html and "no trajectory recorded" in html


async def test_compare_two_runs_regressions_first(view: View) -> None:
    a, b = view.run(view.data.eval_a), view.run(view.data.eval_b)
    html = await _ok(view, f"/compare?a={a}&b={b}")
    rows = _rows(html, "comparison")
    assert rows[0].startswith('<tr class="regressed"')
    deltas = [float(x) for x in re.findall(r'<td class="n">([+-]\d\.\d{3})</td>', html)]
    assert deltas == sorted(deltas) and deltas[0] < 0
    assert "<b>120</b> samples in both" in html
    r = await view.client.get(f"/compare?a={a}")
    assert r.status_code == 400


# --------------------------------------------------------------------------------------------
# GEPA
# --------------------------------------------------------------------------------------------


async def test_gepa_pages_plot_lineage_front_candidate_and_reflections(view: View) -> None:
    html = await _ok(view, "/gepa")
    assert "gepa-done" in html and "gepa-live" in html
    run = view.run(view.data.gepa)
    html = await _ok(view, f"/gepa/{run}")
    assert '<svg class="plot"' in html and "<path d=" in html
    assert 'class="front best" data-candidate="3"' in html and "★" in html
    matrix = _rows(html, "instance-scores")
    assert len(matrix) == 4 and "#3" in matrix[0] and matrix[0].count('class="n cell top"') == 4
    html = await _ok(view, f"/gepa/{run}/candidates/3")
    assert '<span class="add">+Check operator precedence.</span>' in html
    assert "Improve this prompt (iteration 3)" in html  # the reflection
    assert 'id="instances"' in html
    html = await _ok(view, f"/gepa/{run}/candidates/0")
    assert "the seed: no reflection" in html


# --------------------------------------------------------------------------------------------
# JSON API
# --------------------------------------------------------------------------------------------


async def test_json_api_routes(view: View) -> None:
    d = view.data
    run = view.run(d.eval_a)
    got = (await view.client.get("/api/sessions?limit=2")).json()
    assert got["total"] == 3 and len(got["items"]) == 2
    got = (await view.client.get(f"/api/sessions/{d.branch_session}")).json()
    assert got["row"]["parent_id"] == d.root_session and len(got["messages"]) == 4
    assert {r["run_id"] for r in (await view.client.get("/api/evals")).json()} >= {run}
    assert (await view.client.get(f"/api/evals/{run}")).json()["row"]["n_samples"] == 120
    got = (await view.client.get(f"/api/evals/{run}/samples?failed=yes")).json()
    assert [s["sample_id"] for s in got["items"]] == ["q005"]
    assert (await view.client.get(f"/api/evals/{run}/samples/q003")).json()["id"] == "q003"
    assert len((await view.client.get("/api/gepa")).json()) == 2
    got = (await view.client.get(f"/api/gepa/{view.run(d.gepa)}")).json()
    assert got["row"]["best_idx"] == 3 and len(got["candidates"]) == 4
    r = await view.client.get("/api/evals/nope")
    assert r.status_code == 404 and "nope" in r.json()["error"]


# --------------------------------------------------------------------------------------------
# errors and hostile input
# --------------------------------------------------------------------------------------------


async def test_unknown_ids_give_404_pages(view: View) -> None:
    run = view.run(view.data.eval_a)
    gepa = view.run(view.data.gepa)
    for path in (
        "/sessions/20260101-000000-000000-abcdef",
        "/sessions/not a session id",
        "/evals/no-such-run",
        f"/evals/{run}/samples/no-such-sample",
        "/gepa/no-such-run",
        f"/gepa/{gepa}/candidates/99",
        "/live/eval/no-such-run",
        "/live/bogus/x",
        "/no/such/page",
    ):
        r = await view.client.get(path)
        assert r.status_code == 404, path
        assert "Not found" in r.text and "<!doctype html>" in r.text, path


async def _raw_get(url: str, target: str) -> tuple[int, bytes]:
    """GET with the request target sent exactly as given (no client-side normalization)."""
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        while len(body) < length:
            body += await stream.receive_some(65536)
    return int(head.split(b" ", 2)[1]), head + body


async def test_path_traversal_in_any_path_parameter_is_refused(view: View) -> None:
    run = view.run(view.data.eval_a)
    secret = view.data.root / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT")
    rel = "..%2F" * 12 + "etc%2Fpasswd"
    for target in (
        f"/sessions/{rel}",
        "/sessions/..%2F..%2Fsecret.txt",
        f"/sessions/{rel}/diff",
        f"/evals/{rel}",
        "/evals/..%2Fsessions",
        f"/evals/{run}/samples/{rel}",
        f"/evals/{run}/samples/../../../../etc/passwd",
        f"/api/evals/{run}/samples/{rel}",
        f"/gepa/{rel}",
        "/static/../app.py",
        "/static/..%2Fapp.py",
        "/static/..%2F..%2F..%2Fsecret.txt",
        f"/live/session/{rel}",
        f"/compare?a={rel}&b={run}",
        "/../../../../etc/passwd",
    ):
        status, body = await _raw_get(view.url, target)
        assert status in (400, 404), (target, status)
        assert b"root:x:" not in body and b"TOP-SECRET" not in body and b"def create_app" not in body, target
    status, body = await _raw_get(view.url, "/static/style.css")
    assert status == 200 and b"--accent" in body


async def test_model_output_is_escaped_everywhere(view: View) -> None:
    d = view.data
    run = view.run(d.eval_a)
    for path in (
        f"/sessions/{d.xss_session}",
        "/sessions",  # (the xss session has no user text with markup, but its preview is listed)
        f"/evals/{run}",
        f"/evals/{run}/samples/q007",
        f"/gepa/{view.run(d.gepa)}/candidates/2",
    ):
        html = await _ok(view, path)
        assert "<script>document" not in html and "<img src=x" not in html, path
    html = await _ok(view, f"/sessions/{d.xss_session}")
    assert "&lt;script&gt;document.body.setAttribute(" in html
    html = await _ok(view, f"/evals/{run}/samples/q007")
    assert "&lt;img src=x onerror=" in html


# --------------------------------------------------------------------------------------------
# live updates
# --------------------------------------------------------------------------------------------


async def _events(client: httpx2.AsyncClient, path: str) -> AsyncIterator[tuple[str, dict]]:
    async with client.stream("GET", path) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event = "message"
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                yield event, json.loads(line[6:])
                event = "message"


async def test_live_eval_run_streams_new_numbers_until_it_finishes(view: View) -> None:
    out = view.data.eval_running
    run = view.run(out)
    html = await _ok(view, f"/evals/{run}")
    assert f'data-live="/live/eval/{run}"' in html and 'data-field="n_samples"' in html
    seen: list[dict] = []
    stream = _events(view.client, f"/live/eval/{run}")
    kind, first = await stream.__anext__()
    assert first["status"] == "running" and first["n_samples"] == "10"
    log = SampleLog(out / SAMPLES_FILE)
    samples = [make_sample(i, i % 2 == 0) for i in range(10, 15)]
    for s in samples:
        log.write(s)
    log.close()
    async for _, data in stream:
        seen.append(data)
        if data.get("n_samples") == "15":
            break
    assert seen[-1]["n_failed"] == "0"
    write_json_atomic(out / REPORT_FILE, EvalReport("arith-live", tuple(samples)).to_dict())
    async for kind, data in stream:
        if kind == "done":
            break
        assert data["status"] in ("running", "completed")
    else:
        raise AssertionError("the stream ended without a done event")
    await stream.aclose()


async def test_live_gepa_run_streams_candidates_and_plot(view: View) -> None:
    run_dir = view.data.gepa_running
    run = view.run(run_dir)
    stream = _events(view.client, f"/live/gepa/{run}")
    _, first = await stream.__anext__()
    assert first["status"] == "running" and first["n_candidates"] == "2"
    append_gepa_candidate(run_dir, 4)
    async for _, data in stream:
        if data.get("n_candidates") == "4":
            assert "<svg" in data["plot"]
            break
    write_result_files(run_dir, gepa_result(4))
    async for kind, _ in stream:
        if kind == "done":
            break
    await stream.aclose()


async def test_live_session_streams_its_growing_transcript_numbers(view: View) -> None:
    from _view_data import assistant

    from rollouts.store import FileSessionStore, SessionStatus

    sid = view.data.xss_session
    async with FileSessionStore(view.data.sessions, fsync_every=0) as store:
        await store.update(sid, status=SessionStatus.RUNNING)
        stream = _events(view.client, f"/live/session/{sid}")
        _, first = await stream.__anext__()
        assert first == {"status": "running", "n_messages": "2", "tokens": "150", "cost": "$0.0012"}
        await store.append_message(sid, Message("user", "and again?"))
        await store.append_message(sid, assistant("again"))
        async for _, data in stream:
            if data["n_messages"] == "4":
                assert data["tokens"] == "300"
                break
        await store.update(sid, status=SessionStatus.COMPLETED)
        async for kind, _ in stream:
            if kind == "done":
                break
        await stream.aclose()


async def test_the_app_mounts_inside_a_host_with_its_own_pages(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The seam the rollout service uses: mount under a prefix, add routes and navigation."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse
    from starlette.routing import Mount, Route

    from rollouts.view.links import ServerLinks
    from rollouts.view.pages import render_page

    data = await make_view_data(tmp_path / "data")
    catalog = FilesCatalog([data.eval_a], cache_dir=tmp_path / "cache")
    links = ServerLinks("/ui", (("Batches", "/ui/batches"),))

    async def batches(request: Request) -> HTMLResponse:
        return HTMLResponse(render_page(links, "Batches", "<p>3 batches <b>&lt;running&gt;</b></p>"))

    ui = create_app(catalog, prefix="/ui", run_indexer=False, routes=[Route("/batches", batches)], nav=links.nav)
    host = Starlette(routes=[Mount("/ui", app=ui)])
    url = await nursery.start(serve, host)
    async with httpx2.AsyncClient(base_url=url) as client:
        run = catalog.run_id(data.eval_a)
        r = await client.get(f"/ui/evals/{run}")
        assert r.status_code == 200 and f'href="/ui/evals/{run}/samples/q000?pos=0"' in r.text
        assert 'href="/ui/static/style.css"' in r.text and 'href="/ui/batches">Batches</a>' in r.text
        r = await client.get("/ui/batches")
        assert r.status_code == 200 and "<b>&lt;running&gt;</b>" in r.text and "<h1>Batches</h1>" in r.text
        assert (await client.get("/ui/static/live.js")).status_code == 200


async def test_runs_list_filters_and_sorts_and_compares_n_runs_on_every_metric(view: View) -> None:
    a, b = view.run(view.data.eval_a), view.run(view.data.eval_b)
    page = await _ok(view, "/evals")
    assert len(_rows(page, "runs")) == 3
    one = await _ok(view, "/evals?q=BASELINE")
    assert len(_rows(one, "runs")) == 1 and "arith-baseline" in one
    assert "no eval run matches" in await _ok(view, "/evals?q=nothing-like-it")
    names = [
        re.search(r'<a href="[^"]*">([^<]+)</a>', r).group(1)
        for r in _rows(await _ok(view, "/evals?sort=name&order=asc"), "runs")
    ]  # type: ignore[union-attr]
    assert names == sorted(names)
    desc = [
        re.search(r'<a href="[^"]*">([^<]+)</a>', r).group(1)
        for r in _rows(await _ok(view, "/evals?sort=name&order=desc"), "runs")
    ]  # type: ignore[union-attr]
    assert desc == names[::-1]
    assert (await view.client.get("/evals?sort=nope")).status_code == 400
    # N runs (here the two, and the baseline against itself is refused as one run)
    cmp = await _ok(view, f"/compare?run={a}&run={b}")
    rows = _rows(cmp, "compared-runs")
    assert len(rows) == 2 and "baseline" in rows[0]
    assert "<th>correct</th>" in cmp and "<th>length</th>" in cmp  # every metric, not only reward
    assert (await view.client.get(f"/compare?runs={a},{a}")).status_code == 400
    assert (await view.client.get(f"/compare?runs={a},nope")).status_code == 404
    assert (await view.client.get("/compare?runs=" + ",".join(f"r{i}" for i in range(9)))).status_code == 400
    assert (await view.client.get(f"/compare?runs={a},{b}&vs={a}")).status_code == 400
    assert len(_rows(await _ok(view, f"/compare?a={a}&b={b}"), "comparison")) > 0  # (the old two-run links)


async def test_a_run_with_epochs_shows_its_reducers(tmp_path: Path, nursery: trio.Nursery) -> None:
    from _view_data import write_eval

    run = tmp_path / "ep"
    write_eval(run, [make_sample(i, i % 2 == 0) for i in range(4)], "epochs")
    report = json.loads((run / REPORT_FILE).read_text())
    report["summary"]["epochs"] = {"epochs": 2, "rows": 2, "complete_rows": 2, "pass_at": [1, 2], "pass_threshold": 1.0,
                                   "reducers": {"mean": 0.5, "max": 1.0, "majority": 0.5, "pass@1": 0.5, "pass@2": 1.0},
                                   "rows_per_reducer": {"mean": 2, "max": 2, "majority": 2, "pass@1": 2, "pass@2": 2}}  # fmt: skip
    write_json_atomic(run / REPORT_FILE, report)
    catalog = FilesCatalog([run], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = await nursery.start(serve, create_app(catalog))
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        page = (await client.get(f"/evals/{catalog.run_id(run)}")).text
    rows = _rows(page, "reducers")
    assert [re.search(r"<td>([^<]+)</td>", r).group(1) for r in rows] == ["mean", "max", "majority", "pass@1", "pass@2"]  # type: ignore[union-attr]
    assert "<b>2</b> epochs per row" in page
