"""The browser tier: headless Chromium (Debian's `chromium`, driven by Playwright's Python
package through `executable_path`; no browser is downloaded) clicks through the viewer served
under trio on 127.0.0.1.

Playwright's sync API runs in a worker thread (`trio.to_thread`), so nothing of asyncio touches
the server's trio loop. This tier fails, never skips, when the browser is missing.

Screenshots go to the test's tmp dir; set ROLLOUTS_VIEW_SCREENSHOTS=DIR to also copy them there
(that is how docs/view-*.png are made).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from _view_data import ViewData, append_gepa_candidate, make_view_data

from rollouts.view import FilesCatalog, create_app, serve

CHROMIUM = os.environ.get("ROLLOUTS_CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get update && apt-get install -y chromium && pip install playwright  (never `playwright install`)"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 30_000  # the longest any one browser step may take before the test fails


def _require_browser() -> None:
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM} (or $ROLLOUTS_CHROMIUM): {INSTALL}")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail(f"the browser tests need Playwright's Python package: {INSTALL}")


@dataclass
class Site:
    data: ViewData
    url: str
    shots: Path

    def run(self, path: Path) -> str:
        return FilesCatalog.run_id(path)


@pytest.fixture
async def site(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Site]:
    _require_browser()
    data = await make_view_data(tmp_path / "data")
    catalog = FilesCatalog([data.root], cache_dir=tmp_path / "cache", refresh_interval=0.1)
    await catalog.index_once()
    url = await nursery.start(serve, create_app(catalog, live_poll_s=0.05))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    yield Site(data, url.rstrip("/"), shots)
    keep = os.environ.get("ROLLOUTS_VIEW_SCREENSHOTS")
    if keep:
        for png in shots.glob("*.png"):
            shutil.copyfile(png, Path(keep) / f"view-{png.name}")


def _in_browser(drive: Callable[[Any], None]) -> Callable[[], None]:
    """`drive(page)` with a fresh headless Chromium page (run it in a worker thread)."""

    def run() -> None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                page.set_default_timeout(WAIT_MS)
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                drive(page)
                assert not errors, errors
            finally:
                browser.close()

    return run


async def test_click_through_sessions_branches_evals_and_samples(site: Site) -> None:
    d = site.data
    shots = site.shots

    def drive(page: Any) -> None:
        page.goto(site.url + "/")
        page.screenshot(path=shots / "home.png")
        page.click("header.top >> text=Sessions")
        assert page.locator("#sessions tbody tr").count() == 3
        page.screenshot(path=shots / "sessions.png")
        page.fill("input[name=q]", "dangerous")
        page.click("form.filters button")
        assert page.locator("#sessions tbody tr").count() == 1

        page.goto(site.url + "/sessions")
        page.click(f"#sessions a[href='/sessions/{d.root_session}']")
        assert page.locator("article.msg").count() == 4
        assert not page.locator("details.thinking").first.evaluate("e => e.open")  # collapsed
        page.locator("details.thinking summary").first.click()
        assert page.locator("details.thinking").first.evaluate("e => e.open")
        page.click(f"ul.tree a[href='/sessions/{d.branch_session}']")  # branch tree: move to the branch
        page.wait_for_url(f"**/sessions/{d.branch_session}")
        assert page.locator("article.msg.error").count() == 1
        page.screenshot(path=shots / "session.png", full_page=True)
        page.click("#diff-link")
        assert page.locator(".diffrow.branch").count() == 2 and page.locator(".diffrow.parent").count() == 2
        page.screenshot(path=shots / "diff.png", full_page=True)

        page.click("header.top >> text=Evaluations")
        page.screenshot(path=shots / "evals.png")
        page.click("#runs >> text=arith-baseline")
        assert page.locator("#samples tbody tr").count() == 50
        page.screenshot(path=shots / "eval.png")
        page.select_option("select[name=failed]", "yes")
        page.click("#sample-filters button")
        page.wait_for_url("**failed=yes**")
        rows = page.locator("#samples tbody tr")
        assert rows.count() == 1 and "q005" in rows.first.inner_text()
        page.click("#samples a >> text=q005")
        assert "provider error: 529 overloaded" in page.inner_text("main")
        page.go_back()
        page.goto(site.url + f"/evals/{site.run(d.eval_a)}")
        page.click("#samples th a >> text=score")  # sort on the server, best first
        page.wait_for_url("**sort=reward**")
        assert ">1.000<" in page.locator("#samples tbody tr").first.inner_html()
        page.goto(site.url + f"/evals/{site.run(d.eval_a)}/samples/q007")  # its response is markup
        page.screenshot(path=shots / "sample.png", full_page=True)
        assert page.evaluate("document.body.getAttribute('data-pwned')") is None
        assert "<script>document.body" in page.inner_text("main")  # shown as text, not run

        page.goto(site.url + f"/compare?a={site.run(d.eval_a)}&b={site.run(d.eval_b)}")
        assert "regressed" in (page.locator("#comparison tbody tr").first.get_attribute("class") or "")
        page.screenshot(path=shots / "compare.png")

        page.goto(site.url + f"/sessions/{d.xss_session}")
        assert page.evaluate("document.body.getAttribute('data-pwned')") is None

        page.click("header.top >> text=GEPA")
        page.click("#gepa-runs >> text=gepa-done")
        assert page.locator("svg.plot path.line").count() == 1
        assert page.locator("ul.tree li.front").count() == 4
        page.screenshot(path=shots / "gepa.png", full_page=True)
        page.click("ul.tree a >> text=#3")
        assert "+Check operator precedence." in page.inner_text("pre.diff")
        page.screenshot(path=shots / "candidate.png", full_page=True)

    await trio.to_thread.run_sync(_in_browser(drive))
    assert len(list(site.shots.glob("*.png"))) == 10


async def test_a_running_gepa_page_updates_itself_by_server_sent_events(site: Site) -> None:
    run_dir = site.data.gepa_running

    def drive(page: Any) -> None:
        from playwright.sync_api import expect

        page.goto(site.url + f"/gepa/{site.run(run_dir)}")
        assert page.inner_text("[data-field=n_candidates]") == "2"
        page.wait_for_selector("body[data-live-updates]", state="attached")  # the first event arrived
        points = page.locator("svg.plot circle").count()
        append_gepa_candidate(run_dir, 4)  # the engine checkpoints two more candidates
        expect(page.locator("[data-field=n_candidates]")).to_have_text("4", timeout=WAIT_MS)  # (CSP: no eval)
        assert page.locator("svg.plot circle").count() > points  # the plot was redrawn in place
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload
        page.screenshot(path=site.shots / "gepa-live.png")

    await trio.to_thread.run_sync(_in_browser(drive))


async def test_the_live_eval_page_updates_its_samples_table(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The live eval page updated its counters but not the samples table until a reload: the
    rows come with each live event, for the page's own filters and order."""
    from _view_data import make_sample, write_eval

    from rollouts.eval.io import SAMPLES_FILE, SampleLog

    _require_browser()
    run_dir = tmp_path / "run"
    write_eval(run_dir, [make_sample(0, True), make_sample(1, False)], "live", report=False)  # running
    catalog = FilesCatalog([run_dir], cache_dir=tmp_path / "cache", refresh_interval=0.1)
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog, live_poll_s=0.05))).rstrip("/")
    run = catalog.run_id(run_dir)

    def append(i: int, correct: bool) -> None:
        log = SampleLog(run_dir / SAMPLES_FILE)
        log.write(make_sample(i, correct))
        log.close()

    def drive(page: Any) -> None:
        from playwright.sync_api import expect

        page.goto(f"{url}/evals/{run}?sort=reward&order=desc")
        page.wait_for_selector("body[data-live-updates]", state="attached")
        rows = page.locator("#samples tbody tr")
        expect(rows).to_have_count(2)
        append(2, True)
        expect(rows).to_have_count(3, timeout=WAIT_MS)
        expect(page.locator('[data-field="n_samples"]').first).to_have_text("3", timeout=WAIT_MS)
        ids = [t.strip() for t in page.locator("#samples tbody tr td.mono").all_inner_texts()]
        assert ids == ["q002", "q000", "q001"], ids  # in the page's order (reward, descending)
        page.click("#samples tbody tr >> text=q002")  # the new row's link works
        assert "/samples/q002?" in page.url
        assert page.evaluate("performance.getEntriesByType('navigation')[0].type") == "navigate"

    await trio.to_thread.run_sync(_in_browser(drive))


HOSTILE_MD = (
    "# Result\n\nThe **answer** is `42`.\n\n```python\nprint('hi')\n```\n\n"
    '<script>window.__pwned = 1</script>\n<img src=x onerror="window.__pwned = 2">\n'
    "[click](javascript:window.__pwned=3) ![pic](https://evil.example/x.png) "
    "<a href='javascript:window.__pwned=4'>raw</a>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
)


async def test_sample_page_previous_next_markdown_ansi_target_and_collapsing(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """Previous/next follow the table's own filter and order; message text renders as Markdown
    with a hostile payload inert (the CSP unchanged); tool output's ANSI colours render; the
    target and each score's explanation show beside the transcript; long outputs start
    collapsed."""
    from _view_data import write_eval

    from rollouts.dtypes import Message, Trajectory
    from rollouts.eval.sample import Metric, Sample, Score

    _require_browser()

    def sample(i: int, reward: float) -> Sample:
        msgs = (
            Message("user", f"question {i}"),
            Message(
                "tool", "\x1b[31mFAILED\x1b[0m test_x\n" + "".join(f"line {k}\n" for k in range(80)), tool_call_id="c"
            ),
            Message("assistant", HOSTILE_MD if i == 1 else f"answer {i}"),
        )
        why = {"explanation": f"because {i}"}
        return Sample(id=f"s{i}", input={"q": f"question {i}", "answer": f"gold {i}"}, trajectory=Trajectory(messages=msgs),
                      score=Score((Metric("exact", reward, 1.0, why),)), status="completed")  # fmt: skip

    rewards = [0.5, 1.0, 0.0, 1.0, 0.25]
    write_eval(tmp_path / "run", [sample(i, r) for i, r in enumerate(rewards)], "md")
    catalog = FilesCatalog([tmp_path / "run"], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    run = catalog.run_id(tmp_path / "run")

    def drive(page: Any) -> None:
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{url}/evals/{run}?sort=reward&order=desc&metric=exact&op=%3E%3D&value=0.25")
        # a favicon; a wide table scrolls in its box, the page itself does not
        icon = page.locator("link[rel=icon]").get_attribute("href")
        assert page.request.get(url + icon).status == 200
        page.set_viewport_size({"width": 560, "height": 800})
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        assert page.evaluate(
            "document.querySelector('.scroll').scrollWidth > document.querySelector('.scroll').clientWidth"
        )
        page.set_viewport_size({"width": 1280, "height": 860})
        ids = [t.strip() for t in page.locator("#samples tbody tr td.mono").all_inner_texts()]
        assert ids == ["s3", "s1", "s0", "s4"], ids  # s2 filtered out; ties in the sort's direction
        page.click("#samples >> text=s3")
        seen = [page.inner_text("h1 .mono")]
        assert page.locator("#prev-sample").count() == 0
        while page.locator("#next-sample").count():
            page.click("#next-sample")
            seen.append(page.inner_text("h1 .mono"))
        assert seen == ids, seen
        page.click("#prev-sample")
        page.click("#prev-sample")
        assert page.inner_text("h1 .mono") == "s1"
        # Markdown rendered, the payload inert
        md = page.locator("article.assistant .md")
        assert md.locator("h1").inner_text() == "Result" and md.locator("strong").inner_text() == "answer"
        assert md.locator("pre code").inner_text().strip() == "print('hi')" and md.locator("table td").count() == 2
        assert md.locator("script, img, a[href^=javascript]").count() == 0
        assert "<script>window.__pwned = 1</script>" in md.inner_text()
        assert page.evaluate("window.__pwned === undefined") and not dialogs
        # ANSI colours, collapsed long output, target, explanation
        tool = page.locator("article.tool")
        assert tool.locator("details.long").count() == 1 and not tool.locator("details.long").get_attribute("open")
        tool.locator("details.long summary").click()
        assert tool.locator("span.ansi-fg31").inner_text() == "FAILED"
        assert "\x1b" not in tool.inner_text()
        assert page.inner_text("#target") == "gold 1"
        assert "because 1" in page.inner_text("aside")
        page.screenshot(path=tmp_path / "sample.png", full_page=True)

    await trio.to_thread.run_sync(_in_browser(drive))


async def test_a_samples_timeline_shows_each_model_and_tool_call(tmp_path: Path, nursery: trio.Nursery) -> None:
    """The per-event timeline: each model call with its latency, time to first token, tokens,
    cost and attempts; each tool call with its duration; errors in place; rows link to messages."""
    from _view_data import write_eval

    from rollouts.dtypes import Completion, Message, TextContent, ToolCallContent, Trajectory, Usage
    from rollouts.eval.sample import Sample

    _require_browser()
    u = Usage(input_tokens=100, output_tokens=20, cost_usd=0.002)
    msgs = (
        Message("user", "compute", timestamp="2026-01-01T00:00:00+00:00"),
        Message("assistant", (ToolCallContent("c1", "calculator", {"x": "1/0"}),), provider="openai", model="gpt-4.1",
                usage=u, timestamp="2026-01-01T00:00:01+00:00"),
        Message("tool", "division by zero", tool_call_id="c1", details={"is_error": True},
                timestamp="2026-01-01T00:00:02.500000+00:00"),
        Message("assistant", (TextContent("It fails."),), provider="openai", model="gpt-4.1", usage=u,
                timestamp="2026-01-01T00:00:04+00:00"),
    )  # fmt: skip
    comps = (
        Completion("openai", "gpt-4.1", "tool_calls", 1, 0.8, 0.2, 1),
        Completion("openai", "gpt-4.1", "stop", 3, 1.2, 0.3, 2),
    )
    write_eval(tmp_path / "run", [Sample(id="t", input={"q": "compute"}, trajectory=Trajectory(messages=msgs, completions=comps),
                                        status="completed")], "timeline")  # fmt: skip
    catalog = FilesCatalog([tmp_path / "run"], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")

    def drive(page: Any) -> None:
        page.goto(f"{url}/evals/{catalog.run_id(tmp_path / 'run')}/samples/t")
        rows = page.locator("#timeline tbody tr")
        assert rows.count() == 3
        cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(3)]
        assert cells[0][1:5] == ["model", "openai/gpt-4.1", "0.80s", "0.20s"] and cells[0][5:8] == [
            "100",
            "20",
            "$0.0020",
        ]
        assert cells[1][1] == "tool" and cells[1][2].startswith("calculator") and "error" in cells[1][2]
        assert cells[1][3] == "1.50s"
        assert cells[2][8] == "2" and rows.nth(2).locator("td span.bad").count() == 1  # a retried call, marked
        rows.nth(1).locator("a").click()
        assert page.url.endswith("#m2") and page.locator("#m2").is_visible()

    await trio.to_thread.run_sync(_in_browser(drive))
