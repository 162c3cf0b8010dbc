"""The viewer inside the rollout service, on SQLite and on a real PostgreSQL (the same tests
for both): the database catalog's queries (filtering, sorting, paging in SQL, every query scoped
to one workspace), and the /ui routes served by hypercorn under trio on 127.0.0.1: sign-in by
cookie, 401/redirect without one, another workspace's objects 404, CSRF on forms, model output
escaped, live progress by server-sent events."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
import trio
from _service_ui_data import XSS, UiData, finish, make_ui_data

from rollouts.gepa.checkpoint import REFLECTIONS_FILE
from rollouts.gepa.proposers import ReflectionJournal
from rollouts.service import accounts, jobs
from rollouts.service.api import ApiLimits
from rollouts.service.api import create_app as create_api
from rollouts.service.catalog import ServiceCatalog
from rollouts.service.server import with_ui
from rollouts.service.store import Store
from rollouts.service.ui import COOKIE, MAX_FORM_BYTES, csrf_token
from rollouts.view import serve
from rollouts.view.catalog import Catalog, NotFound, SampleQuery, SessionQuery


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    s = await Store.open(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
async def data(store: Store) -> UiData:
    return await make_ui_data(store)


# ---- the catalog --------------------------------------------------------------------------------


async def test_batches_are_eval_runs_of_their_workspace_only(store: Store, data: UiData) -> None:
    cat = ServiceCatalog(store, data.ws_a)
    assert isinstance(cat, Catalog)  # the viewer's protocol
    runs = await cat.list_eval_runs()
    assert [r.run_id for r in runs] == [data.batch2, data.batch]  # newest first
    one = {r.run_id: r for r in runs}[data.batch]
    assert (one.status, one.n_samples, one.n_failed, one.name) == ("running", 4, 1, "solver v1")
    assert one.mean_reward == pytest.approx(2 / 3)
    assert {r.run_id: r for r in runs}[data.batch2].status == "completed"
    detail = await cat.get_eval_run(data.batch)
    assert detail.metric_names == ("exact_match",)
    assert detail.row.metrics["exact_match"] == pytest.approx(2 / 3)
    assert detail.report["task_count"] == 6
    for missing in (data.batch_b, "nope"):
        with pytest.raises(NotFound):
            await cat.get_eval_run(missing)
        with pytest.raises(NotFound):
            await cat.list_samples(missing, SampleQuery())
        with pytest.raises(NotFound):
            await cat.get_sample(missing, "t0")
        with pytest.raises(NotFound):
            await cat.version("eval", missing)
    with pytest.raises(NotFound):
        await cat.get_gepa_run(data.job_b)
    with pytest.raises(NotFound):
        await cat.compare_runs(data.batch, data.batch_b)
    cat = ServiceCatalog(store, data.ws_b)
    assert [r.run_id for r in await cat.list_eval_runs()] == [data.batch_b]
    assert [r.run_id for r in await cat.list_gepa_runs()] == [data.job_b]
    with pytest.raises(NotFound):
        await cat.get_sample(data.batch, "t0")
    with pytest.raises(ValueError, match="workspace"):  # never a catalog without a workspace
        ServiceCatalog(store, "")


@pytest.mark.parametrize("rows", ["current", "before_migration_4"])
async def test_samples_are_filtered_sorted_and_paged_in_sql(store: Store, data: UiData, rows: str) -> None:
    cat = ServiceCatalog(store, data.ws_a)
    if rows == "before_migration_4":  # results written before the figures had columns: read from the JSON
        await store.call(
            lambda tx: tx.execute(
                "UPDATE tasks SET reward = NULL, tokens = NULL, turns = NULL, cost_usd = NULL WHERE batch_id = ?",
                (data.batch,),
            )
        )
    else:
        got = await store.read(
            lambda tx: tx.one(
                "SELECT reward, tokens, turns, cost_usd FROM tasks WHERE task_id = 't0' AND batch_id = ?", (data.batch,)
            )
        )
        assert got == (1.0, 60, 3, 0.03)

    async def ids(**q: object) -> list[str]:
        page = await cat.list_samples(data.batch, SampleQuery(**q))  # type: ignore[arg-type]
        return [s.sample_id for s in page.items]

    assert await ids() == ["t0", "t1", "t2", "t3", "t4", "t5"]
    # no score (NULL) sorts first ascending, last descending; ties in the sort's direction
    assert await ids(sort="reward", descending=True) == ["t2", "t0", "t1", "t5", "t4", "t3"]
    assert await ids(sort="reward") == ["t3", "t4", "t5", "t1", "t0", "t2"]
    assert (await ids(sort="tokens", descending=True))[:3] == ["t0", "t2", "t1"]
    assert (await ids(sort="turns", descending=True))[:3] == ["t0", "t2", "t1"]
    assert (await ids(sort="metric:exact_match"))[3:] == ["t1", "t0", "t2"]
    assert await ids(failed=True) == ["t3", "t4", "t5"]
    assert await ids(status="failed") == ["t3"]
    assert await ids(status="pending") == ["t4", "t5"]
    assert await ids(failed=False) == ["t0", "t1", "t2"]
    assert await ids(metric="exact_match", op=">=", value=1.0) == ["t0", "t2"]
    assert await ids(metric="exact_match", op="<", value=0.5) == ["t1"]
    assert await ids(meta=("level", "1")) == ["t1", "t3", "t5"]
    assert await ids(text="WHAT IS 4 ") == ["t4"]
    assert await ids(text="<answer>3</answer>") == ["t1"]
    assert await ids(text="100%") == []  # LIKE wildcards are literal
    page = await cat.list_samples(data.batch, SampleQuery(offset=2, limit=2))
    assert ([s.sample_id for s in page.items], page.total, page.has_next) == (["t2", "t3"], 6, True)
    row = (await cat.list_samples(data.batch, SampleQuery(limit=1))).items[0]
    assert (row.reward, row.turns, row.tokens, row.status) == (1.0, 3, 60, "completed")
    assert row.cost_usd == pytest.approx(0.03) and row.duration_s == pytest.approx(0.11)
    assert row.input_preview == "what is 0 + 0?" and XSS in row.response_preview
    with pytest.raises(ValueError, match="sort must be"):
        await ids(sort="nope; DROP TABLE tasks")
    assert await ids(meta=("a') OR 1=1 --", "x")) == []  # a key is data, never SQL
    sample = await cat.get_sample(data.batch, "t0")
    assert sample.trajectory is not None and XSS in sample.response
    assert sample.reward == 1.0 and sample.input["answer"] == "0" and sample.status == "completed"
    assert (await cat.get_sample(data.batch, "t4")).status == "pending"


async def test_compare_gepa_jobs_and_version_tokens(store: Store, data: UiData) -> None:
    cat = ServiceCatalog(store, data.ws_a)
    c = await cat.compare_runs(data.batch, data.batch2)
    assert (c.shared, c.regressed, c.improved, c.only_a, c.only_b) == (6, 1, 2, 0, 0)
    assert [r.sample_id for r in c.rows.items][:2] == ["t0", "t2"]  # regressions first
    assert list(await cat.runs_sharing_samples(data.batch)) == [data.batch2]  # what compare offers
    with pytest.raises(NotFound):
        await cat.runs_sharing_samples(data.batch_b)  # another workspace's batch
    runs = await cat.list_gepa_runs()
    assert [r.run_id for r in runs] == [data.job]
    g = await cat.get_gepa_run(data.job)
    assert (g.row.status, g.row.n_candidates, g.row.metric_calls, len(g.candidates)) == ("running", 4, 22, 4)
    assert g.pareto_front and g.on_front and len(g.history) == 3
    assert await cat.gepa_reflections(data.job, 1) == ()

    before = await cat.version("eval", data.batch)
    assert await cat.version("eval", data.batch) == before
    await finish(store, data.batch, "t4", 1.0, "ok")
    assert await cat.version("eval", data.batch) != before
    job_before = await cat.version("gepa", data.job)
    await store.call(jobs.save_progress, data.job, "test-owner", metric_calls=30, best_score=1.0, candidates=5)
    assert await cat.version("gepa", data.job) != job_before
    assert (await cat.list_sessions(SessionQuery())).total == 0


async def test_gepa_reflections_come_from_the_jobs_run_directories(store: Store, data: UiData, tmp_path: Path) -> None:
    """Every run directory of the job on this server (a resumed job continues in a new one) is
    read, each reflection once; another workspace's job is NotFound even with files on disk."""
    for owner, records in (
        ("srv-1", [(1, "system", "p1", "a1"), (2, "system", "p2", "a2")]),
        ("srv-2", [(1, "system", "p1", "a1"), (1, "tools", "p1b", "a1b")]),  # (resumed: iteration 1 again)
    ):
        journal = ReflectionJournal(tmp_path / data.job / owner / REFLECTIONS_FILE)
        for it, comp, prompt, answer in records:
            journal.record(
                ReflectionJournal.key(it, comp, prompt), iteration=it, component=comp, prompt=prompt, answer=answer
            )
        journal.close()
    (tmp_path / data.job_b / "srv-1").mkdir(parents=True)
    cat = ServiceCatalog(store, data.ws_a, gepa_dir=tmp_path)
    got = await cat.gepa_reflections(data.job, 1)
    assert [(r.iteration, r.component, r.prompt, r.answer) for r in got] == [
        (1, "system", "p1", "a1"),
        (1, "tools", "p1b", "a1b"),
    ]
    assert [r.answer for r in await cat.gepa_reflections(data.job, 2)] == ["a2"]
    assert await cat.gepa_reflections(data.job, 3) == []
    with pytest.raises(NotFound):
        await cat.gepa_reflections(data.job_b, 1)
    cat = ServiceCatalog(store, data.ws_b, gepa_dir=tmp_path)
    assert await cat.gepa_reflections(data.job_b, 1) == []  # (its server kept no reflections)


# ---- the UI over HTTP ---------------------------------------------------------------------------


@dataclass
class Ui:
    data: UiData
    store: Store
    url: str
    client: httpx2.AsyncClient

    async def login(self, token: str) -> httpx2.Response:
        return await self.client.post("/ui/login", data={"token": token})


@pytest.fixture
async def ui(store: Store, data: UiData, nursery: trio.Nursery) -> AsyncIterator[Ui]:
    app = with_ui(create_api(store), store, None, ApiLimits(), live_poll_s=0.02)
    url = await nursery.start(serve, app)
    async with httpx2.AsyncClient(base_url=url.rstrip("/"), timeout=30) as client:
        yield Ui(data, store, url, client)


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m, html[:2000]
    return m.group(1)


async def test_without_a_session_pages_redirect_to_login_and_data_routes_are_401(ui: Ui) -> None:
    for path in ("/ui/batches", "/ui/", f"/ui/evals/{ui.data.batch}", "/ui/agents", "/ui/gepa-jobs"):
        r = await ui.client.get(path)
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login"), path
    for path in ("/ui/api/evals", f"/ui/live/eval/{ui.data.batch}", f"/ui/live-batches/{ui.data.batch}"):
        r = await ui.client.get(path)
        assert (r.status_code, r.json()) == (401, {"error": "unauthorized"}), path
    r = await ui.client.post(f"/ui/agents/{ui.data.agent_a}/versions/2/promote", data={"csrf": "x"})
    assert r.status_code == 401
    login = await ui.client.get("/ui/login")
    assert login.status_code == 200 and 'name="token"' in login.text.replace("'", '"')

    for bad in ("rlt_" + "x" * 43, "nonsense", ui.data.token_a + "x", ""):
        r = await ui.login(bad)
        assert r.status_code == 401 and "That token was not accepted." in r.text
        assert "set-cookie" not in r.headers and (not bad or bad not in r.text)
    r = await ui.client.get("/ui/batches", headers={"cookie": f"{COOKIE}=rlt_{'y' * 43}"})
    assert r.status_code == 303


async def test_login_sets_a_strict_httponly_cookie_and_logout_clears_it(ui: Ui) -> None:
    r = await ui.login(ui.data.token_a)
    assert (r.status_code, r.headers["location"]) == (303, "/ui/batches")
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    page = await ui.client.get("/ui/batches")
    assert page.status_code == 200 and ui.data.batch in page.text and ui.data.batch2 in page.text
    assert ">Sessions<" not in page.text and ">Sessions<" not in (await ui.client.get("/ui/")).text  # (none here)
    assert (await ui.client.get("/ui/sessions")).status_code == 404  # no page it cannot fill
    assert (await ui.client.get("/ui/api/sessions")).status_code == 404
    assert ui.data.batch_b not in page.text
    assert ui.data.token_a not in page.text  # the token is never on a page (the CSRF token is its hash)

    r = await ui.client.post("/ui/logout", data={"csrf": "wrong"})
    assert r.status_code == 403
    r = await ui.client.post("/ui/logout", data={"csrf": _csrf(page.text)})
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert (await ui.client.get("/ui/batches")).status_code == 303


async def test_a_revoked_token_ends_the_session(ui: Ui) -> None:
    await ui.login(ui.data.token_a)
    assert (await ui.client.get("/ui/batches")).status_code == 200
    for tok in await ui.store.call(accounts.list_tokens):
        if tok["workspace"] == "alpha":
            await ui.store.call(accounts.revoke_token, tok["id"])
    assert (await ui.client.get("/ui/batches")).status_code == 303
    assert (await ui.client.get("/ui/api/evals")).status_code == 401


async def test_another_workspaces_objects_are_404_in_the_ui(ui: Ui) -> None:
    d = ui.data
    await ui.login(d.token_a)
    for path in (
        f"/ui/batches/{d.batch_b}", f"/ui/evals/{d.batch_b}", f"/ui/evals/{d.batch_b}/samples/t0",
        f"/ui/api/evals/{d.batch_b}", f"/ui/api/evals/{d.batch_b}/samples", f"/ui/live/eval/{d.batch_b}",
        f"/ui/live-batches/{d.batch_b}", f"/ui/gepa/{d.job_b}", f"/ui/api/gepa/{d.job_b}",
        f"/ui/live/gepa/{d.job_b}", f"/ui/compare?a={d.batch}&b={d.batch_b}",
    ):  # fmt: skip
        r = await ui.client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text[:500])
    assert (await ui.client.get(f"/ui/batches/{d.batch}")).status_code == 200
    agents = await ui.client.get("/ui/agents")
    assert d.agent_b not in agents.text
    r = await ui.client.post(f"/ui/agents/{d.agent_b}/versions/1/promote", data={"csrf": _csrf(agents.text)})
    assert r.status_code == 404
    # and the other way round
    ui.client.cookies.clear()
    await ui.login(d.token_b)
    assert (await ui.client.get(f"/ui/evals/{d.batch}")).status_code == 404
    assert [r["run_id"] for r in (await ui.client.get("/ui/api/evals")).json()] == [d.batch_b]


async def test_model_output_is_escaped_on_every_service_page(ui: Ui) -> None:
    d = ui.data
    await ui.login(d.token_a)
    for path in (f"/ui/evals/{d.batch}/samples/t0", f"/ui/evals/{d.batch}", f"/ui/batches/{d.batch}", "/ui/agents"):
        r = await ui.client.get(path)
        assert r.status_code == 200, path
        assert "<script>alert" not in r.text, path
        assert "&lt;script&gt;alert" in r.text, path
        assert "script-src 'self'" in r.headers["content-security-policy"]


async def active_version(ui: Ui) -> int:
    agent = await ui.store.read(accounts.get_agent, ui.data.ws_a, ui.data.agent_a)
    assert agent is not None
    return int(agent["active_version"])


async def test_promote_needs_the_sessions_csrf_token(ui: Ui) -> None:
    d = ui.data
    await ui.login(d.token_a)
    page = (await ui.client.get("/ui/agents")).text
    assert "/ui/agents/" + d.agent_a + "/versions/2/promote" in page
    url = f"/ui/agents/{d.agent_a}/versions/2/promote"
    for bad in ({}, {"csrf": ""}, {"csrf": csrf_token(d.token_b)}):
        r = await ui.client.post(url, data=bad)
        assert r.status_code == 403 and "reload the page" in r.text
        assert await active_version(ui) == 1
    r = await ui.client.post(url, data={"csrf": _csrf(page)})
    assert r.status_code == 303
    assert await active_version(ui) == 2
    assert (
        await ui.client.post(f"/ui/agents/{d.agent_a}/versions/9/promote", data={"csrf": _csrf(page)})
    ).status_code == 404


async def test_the_gepa_form_starts_a_job_and_bad_input_names_the_field(ui: Ui) -> None:
    d = ui.data
    await ui.login(d.token_a)
    page = (await ui.client.get("/ui/gepa-jobs")).text
    assert d.job in page and d.job_b not in page
    form = {
        "csrf": _csrf(page),
        "agent_id": d.agent_a,
        "trainset": json.dumps([{"task_id": "a", "user_message": "2 + 2", "context": {"answer": "4"}}]),
        "score": "exact_match_tag",
        "max_metric_calls": "40",
        "parallelism": "3",
        "reflection_model": "openai-compatible/fake",
    }
    r = await ui.client.post("/ui/gepa-jobs", data={**form, "trainset": "[{" + XSS})
    assert r.status_code == 422 and "trainset: is not JSON" in r.text and "<script>alert" not in r.text
    r = await ui.client.post("/ui/gepa-jobs", data={**form, "max_metric_calls": "lots"})
    assert r.status_code == 422 and "max_metric_calls" in r.text
    r = await ui.client.post("/ui/gepa-jobs", data={**form, "agent_id": d.agent_b})
    assert r.status_code == 404
    r = await ui.client.post("/ui/gepa-jobs", data={**form, "csrf": "0" * 64})
    assert r.status_code == 403
    assert len(await ServiceCatalog(ui.store, d.ws_a).list_gepa_runs()) == 1  # nothing stored so far
    r = await ui.client.post("/ui/gepa-jobs", data=form)
    assert r.status_code == 303
    runs = await ServiceCatalog(ui.store, d.ws_a).list_gepa_runs()
    assert len(runs) == 2 and runs[0].max_metric_calls == 40 and runs[0].status == "running"  # queued
    job = await ui.store.read(jobs.get_job, d.ws_a, runs[0].run_id)
    assert job is not None and job["status"] == "queued"


async def test_batch_progress_streams_live_until_the_batch_finishes(ui: Ui) -> None:
    d = ui.data
    await ui.login(d.token_a)
    events: list[dict[str, str]] = []
    async with ui.client.stream("GET", f"/ui/live-batches/{d.batch}") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == 1:
                    assert events[0][f"{d.batch}:done"] == "4"
                    await finish(ui.store, d.batch, "t4", 1.0, "ok")
                elif events[-1][f"{d.batch}:done"] == "5":
                    await finish(ui.store, d.batch, "t5", 0.0, "no")
            if line == "event: done":
                break
    assert events[-1][f"{d.batch}:done"] == "6" and events[-1][f"{d.batch}:status"] == "partial"


async def test_posts_from_another_origin_are_refused(ui: Ui) -> None:
    d = ui.data
    host = ui.url.split("://", 1)[1].strip("/")
    r = await ui.client.post("/ui/login", data={"token": d.token_a}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = await ui.client.post("/ui/login", data={"token": d.token_a}, headers={"origin": f"http://{host}"})
    assert r.status_code == 303
    assert r.headers["referrer-policy"] == "same-origin"  # (so that browsers send Origin on our own forms)
    page = (await ui.client.get("/ui/agents")).text
    url = f"/ui/agents/{d.agent_a}/versions/2/promote"
    for origin in ("http://evil.example", "null", f"http://{host}.evil.example"):
        r = await ui.client.post(url, data={"csrf": _csrf(page)}, headers={"origin": origin})
        assert r.status_code == 403, origin
    assert await active_version(ui) == 1


async def test_the_service_serves_the_ui_next_to_the_api(db_url: str, nursery: trio.Nursery) -> None:
    from rollouts.service.server import serve as serve_service

    url = await nursery.start(
        lambda task_status: serve_service(db_url, port=0, gepa_jobs=False, task_status=task_status)
    )
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        r = await client.get("/")
        assert (r.status_code, r.headers["location"]) == (303, "/ui/batches")
        assert (await client.get("/ui/batches")).headers["location"] == "/ui/login"
        assert (await client.get("/ui/login")).status_code == 200
        assert (await client.get("/v1/health")).json()["status"] == "ok"
        assert (await client.get("/v1/agents")).status_code == 401
        assert (await client.get("/ui/static/live.js")).status_code == 200


async def test_a_live_stream_ends_when_its_sign_in_is_revoked(ui: Ui) -> None:
    """A stream opened before its token was revoked kept streaming (up to a day): every poll
    checks the sign-in again, and the stream ends with `event: denied`."""
    d = ui.data
    await ui.login(d.token_a)
    for path in ("/ui/live-batches", f"/ui/live-batches/{d.batch}", "/ui/live-gepa-jobs", f"/ui/live/eval/{d.batch}"):
        seen: list[str] = []
        async with ui.client.stream("GET", path) as r:
            assert r.status_code == 200, path
            async for line in r.aiter_lines():
                seen.append(line)
                if line.startswith("data: ") and len([x for x in seen if x.startswith("data: ")]) == 1:
                    for tok in await ui.store.call(accounts.list_tokens):
                        if tok["workspace"] == "alpha":
                            await ui.store.call(accounts.revoke_token, tok["id"])
                if line == "event: denied":
                    break
        assert "event: denied" in seen, path
        assert (await ui.client.get(path)).status_code == 401  # (the reconnect is refused)
        ui.client.cookies.clear()
        _, token = await ui.store.call(accounts.create_token, "alpha")
        await ui.login(token)


async def test_no_ui_response_can_be_framed(ui: Ui) -> None:
    """The service UI could be framed by a page on another port (a click promoted a version)."""
    anon = [("/ui/login", 200), ("/ui/batches", 303), ("/ui/api/evals", 401), ("/ui/static/live.js", 200)]
    for path, status in anon:
        r = await ui.client.get(path)
        assert r.status_code == status, path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        assert r.headers["x-frame-options"] == "DENY", path
    r = await ui.client.post("/ui/login", data={"token": "x"}, headers={"origin": "http://evil.example"})
    assert r.status_code == 403 and r.headers["x-frame-options"] == "DENY"
    await ui.login(ui.data.token_a)
    for path in ("/ui/batches", "/ui/agents", f"/ui/evals/{ui.data.batch}", "/ui/nope"):
        r = await ui.client.get(path)
        assert r.headers["x-frame-options"] == "DENY" and r.headers["referrer-policy"] == "same-origin", path


async def test_a_form_over_the_limit_is_refused_by_the_one_body_reader(ui: Ui) -> None:
    """Issue 32 item 5: the UI's forms had a body reader of their own beside the API's; both
    read through requests.read_body now (413 naming the form once it passes MAX_FORM_BYTES)."""
    d = ui.data
    await ui.login(d.token_a)
    page = (await ui.client.get("/ui/gepa-jobs")).text
    form = f"csrf={_csrf(page)}&agent_id={d.agent_a}&trainset=".encode()
    left = MAX_FORM_BYTES + 1 - len(form)

    async def streamed() -> AsyncIterator[bytes]:  # (no declared length: read until over the limit)
        yield form
        for start in range(0, left, 65536):
            yield b"x" * min(65536, left - start)

    headers = {"content-type": "application/x-www-form-urlencoded"}
    r = await ui.client.post("/ui/gepa-jobs", content=streamed(), headers=headers)
    assert r.status_code == 413 and f"the form is over {MAX_FORM_BYTES} bytes" in r.text


async def test_a_copied_cookie_stops_working_after_sign_out(ui: Ui) -> None:
    """The cookie held the raw long-lived API token, so a copied cookie still worked after
    sign-out: it now holds a server-side session id, ended by sign-out, expiring, and ended by
    revoking its token."""
    from rollouts.service import ui_sessions

    d = ui.data
    r = await ui.login(d.token_a)
    cookie = ui.client.cookies[COOKIE]
    assert cookie.startswith("rus_") and d.token_a not in r.headers["set-cookie"]
    assert "max-age" in r.headers["set-cookie"].lower()
    copied = {"cookie": f"{COOKIE}={cookie}"}
    async with httpx2.AsyncClient(base_url=ui.client.base_url, timeout=30) as thief:
        assert (await thief.get("/ui/batches", headers=copied)).status_code == 200
        page = (await ui.client.get("/ui/batches")).text
        assert (await ui.client.post("/ui/logout", data={"csrf": _csrf(page)})).status_code == 303
        r = await thief.get("/ui/batches", headers=copied)
        assert (r.status_code, r.headers["location"]) == (303, "/ui/login")
        assert (await thief.get("/ui/api/evals", headers=copied)).status_code == 401
        # an expired session, and the raw token as a cookie, are refused too
        started = await ui.store.call(ui_sessions.start_session, d.token_a, -1.0)
        assert started is not None
        assert (await thief.get("/ui/batches", headers={"cookie": f"{COOKIE}={started[0]}"})).status_code == 303
        assert (await thief.get("/ui/batches", headers={"cookie": f"{COOKIE}={d.token_a}"})).status_code == 303
    assert await ui.store.call(ui_sessions.start_session, "rlt_unknown") is None
