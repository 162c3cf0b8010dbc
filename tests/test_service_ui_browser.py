"""The service UI in a browser: headless Chromium (Debian's `chromium`, driven by Playwright's
Python package through `executable_path`; nothing downloaded) signs in with a workspace token,
watches a batch's progress update live (server-sent events, no reload), starts a GEPA job from
the form and watches its progress, promotes an agent version, and opens a sample whose model
output holds a `<script>` (it must not run). The app is `rollouts service serve`'s (API + /ui)
over a SQLite store, on 127.0.0.1; the test plays the workers by writing results to the store.

Playwright's sync API runs in a worker thread; the drive calls back into trio with
`trio.from_thread.run`. Screenshots go to the test's tmp dir (ROLLOUTS_VIEW_SCREENSHOTS=DIR also
copies them there: that is how docs/service-ui-*.png are made). Fails, never skips, without the
browser."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _service_ui_data import UiData, finish, make_ui_data
from test_view_browser import _in_browser, _require_browser

from rollouts.service import accounts, jobs
from rollouts.service.api import ApiLimits
from rollouts.service.api import create_app as create_api
from rollouts.service.server import with_ui
from rollouts.service.store import Store
from rollouts.view import serve

WAIT_MS = 30_000


@pytest.fixture
async def site(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[tuple[str, Store, UiData, Path]]:
    _require_browser()
    store = await Store.open(f"sqlite:///{tmp_path}/service.db")
    data = await make_ui_data(store)
    app = with_ui(create_api(store), store, None, ApiLimits(), live_poll_s=0.05)
    url = await nursery.start(serve, app)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        yield url.rstrip("/"), store, data, shots
    finally:
        store.close()
    keep = os.environ.get("ROLLOUTS_VIEW_SCREENSHOTS")
    if keep:
        for png in shots.glob("*.png"):
            shutil.copyfile(png, Path(keep) / f"service-ui-{png.name}")


async def test_sign_in_watch_a_batch_start_a_gepa_job_and_promote(site: tuple[str, Store, UiData, Path]) -> None:
    url, store, d, shots = site
    b = d.batch

    def trio_call(fn: Any, *args: Any, **kw: Any) -> Any:
        return trio.from_thread.run(lambda: fn(*args, **kw))

    def drive(page: Any) -> None:
        from playwright.sync_api import expect

        dialogs: list[str] = []
        page.on("dialog", lambda dlg: (dialogs.append(dlg.message), dlg.dismiss()))

        # sign in
        page.goto(url + "/ui/batches")
        assert page.url.endswith("/ui/login")
        page.fill("input[name=token]", "rlt_not-a-token")
        page.click("button[type=submit]")
        assert "That token was not accepted." in page.inner_text("main")
        page.fill("input[name=token]", d.token_a)
        page.screenshot(path=shots / "login.png")
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/batches")
        assert d.batch_b not in page.content()

        # the batches list updates itself as tasks finish
        page.wait_for_selector("body[data-live-updates]", state="attached")
        assert page.inner_text(f'[data-field="{b}:done"]') == "4"
        trio_call(finish, store, b, "t4", 1.0, "ok")
        expect(page.locator(f'[data-field="{b}:done"]')).to_have_text("5", timeout=WAIT_MS)
        page.screenshot(path=shots / "batches.png", full_page=True)

        # a batch page too, to the end
        page.click(f"a[href='/ui/batches/{b}']")
        page.wait_for_selector("body[data-live-updates]", state="attached")
        assert page.inner_text(f'[data-field="{b}:status"]') == "running"
        trio_call(finish, store, b, "t5", 0.0, "no")
        expect(page.locator(f'[data-field="{b}:done"]')).to_have_text("6", timeout=WAIT_MS)
        expect(page.locator(f'[data-field="{b}:status"]')).to_have_text("partial", timeout=WAIT_MS)
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
        page.screenshot(path=shots / "batch.png", full_page=True)

        # its samples, and the one whose answer holds a <script>: shown, not run
        page.click("text=Samples (score, status, turns, tokens, cost, time)")
        page.click(f"a[href^='/ui/evals/{b}/samples/t0?']")
        assert "<script>alert('pwned')</script>" in page.inner_text("main")
        page.screenshot(path=shots / "sample.png", full_page=True)

        # start a GEPA job from the form, and watch its progress
        page.goto(url + "/ui/gepa-jobs")
        page.select_option("select[name=agent_id]", d.agent_a)
        page.fill(
            "textarea[name=trainset]",
            json.dumps([{"task_id": "a", "user_message": "2 + 2", "context": {"answer": "4"}}]),
        )
        page.fill("input[name=max_metric_calls]", "40")
        page.fill("input[name=reflection_model]", "openai-compatible/fake")
        with page.expect_navigation():
            page.click("form.gepa-form button[type=submit]")
        assert page.locator("p.error").count() == 0, page.inner_text("p.error")
        rows = page.locator("table.gepa-jobs tbody tr")
        expect(rows).to_have_count(2)
        jid = rows.first.locator("a").inner_text()
        assert jid != d.job and page.url.endswith(f"/ui/gepa-jobs#{jid}")
        owner = "browser-test"
        trio_call(store.call, jobs.cancel_job, d.ws_b, d.job_b)  # (so that the claim below takes the new job)
        claimed = trio_call(store.call, jobs.claim_job, owner, 60.0)
        assert claimed is not None and claimed["job_id"] == jid
        page.wait_for_selector("body[data-live-updates]", state="attached")
        expect(page.locator(f'[data-field="{jid}:status"]')).to_have_text("running", timeout=WAIT_MS)
        trio_call(store.call, jobs.save_progress, jid, owner, metric_calls=7, best_score=0.5, candidates=2)
        expect(page.locator(f'[data-field="{jid}:calls"]')).to_have_text("7", timeout=WAIT_MS)
        expect(page.locator(f'[data-field="{jid}:best"]')).to_have_text("0.500", timeout=WAIT_MS)
        page.screenshot(path=shots / "gepa-jobs.png", full_page=True)
        page.goto(url + f"/ui/gepa/{d.job}")
        page.screenshot(path=shots / "gepa-job.png", full_page=True)

        # promote version 2
        page.goto(url + "/ui/agents")
        page.click("tr[data-version='2'] button")
        page.wait_for_url("**/ui/agents*")
        assert "active" in page.inner_text("tr[data-version='2']")
        assert "Promote" in page.inner_text("tr[data-version='1']")
        page.screenshot(path=shots / "agents.png", full_page=True)
        assert dialogs == []

    await trio.to_thread.run_sync(_in_browser(drive))
    assert len(list(shots.glob("*.png"))) == 7
    agent = await store.read(accounts.get_agent, d.ws_a, d.agent_a)
    assert agent is not None and agent["active_version"] == 2


async def test_the_compare_form_stays_under_ui(site: tuple[str, Store, UiData, Path]) -> None:
    """The evaluations page's compare form posted to a hard-coded /compare, which is outside the
    service's /ui mount (the API answered 404): it goes where the links object says."""
    url, _store, d, _shots = site

    def drive(page: Any) -> None:
        page.goto(url + "/ui/login")
        page.fill("input[name=token]", d.token_a)
        page.click("button[type=submit]")
        page.wait_for_url("**/ui/batches")
        page.goto(url + "/ui/evals")
        page.check(f"#compare-form input[value='{d.batch}']")
        page.check(f"#compare-form input[value='{d.batch2}']")
        with page.expect_navigation():
            page.click("#compare-form button[type=submit]")
        assert "/ui/compare?" in page.url, page.url
        assert page.inner_text("h1") == "Compare runs"
        assert "6 samples in both" in page.inner_text("main").replace("\n", " ")
        assert page.locator("#compared-runs tbody tr").count() == 2

    await trio.to_thread.run_sync(_in_browser(drive))
