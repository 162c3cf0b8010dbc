"""Compare N runs, offering only runs that share sample ids: the runs list's compare form, a
run's "compare with" links and the compare page's "add a run" all leave out runs on another
dataset (the form shows them disabled, with the reason)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import trio
from _view_data import make_sample, write_eval
from test_view_browser import WAIT_MS, _in_browser, _require_browser

from rollouts.eval.io import SAMPLES_FILE, SampleLog
from rollouts.view import FilesCatalog, create_app, serve


def _three_runs(root: Path) -> tuple[Path, Path, Path]:
    """Two runs on the same questions (q000..q009), one on others (z000..z009)."""
    a, b, c = root / "base", root / "cand", root / "other"
    write_eval(a, [make_sample(i, i % 2 == 0) for i in range(10)], "arith-base")
    write_eval(b, [make_sample(i, i % 3 == 0) for i in range(4, 14)], "arith-cand")
    write_eval(c, [dataclasses.replace(make_sample(i, True), id=f"z{i:03d}") for i in range(10)], "other-set")
    return a, b, c


async def test_runs_sharing_samples_lists_only_runs_on_the_same_ids(tmp_path: Path) -> None:
    a, b, c = _three_runs(tmp_path / "runs")
    catalog = FilesCatalog([tmp_path / "runs"], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    rid = catalog.run_id
    assert list(await catalog.runs_sharing_samples(rid(a))) == [rid(b)]
    assert list(await catalog.runs_sharing_samples(rid(b))) == [rid(a)]
    assert list(await catalog.runs_sharing_samples(rid(c))) == []
    # the answer is cached per pair until either run's samples file changes
    log = SampleLog(c / SAMPLES_FILE)
    log.write(make_sample(12, True))  # q012: in b only
    log.close()
    await catalog.index_once()
    assert list(await catalog.runs_sharing_samples(rid(c))) == [rid(b)]
    assert list(await catalog.runs_sharing_samples(rid(a))) == [rid(b)]


async def test_the_compare_form_offers_only_runs_sharing_sample_ids(tmp_path: Path, nursery: trio.Nursery) -> None:
    _require_browser()
    a, b, c = _three_runs(tmp_path / "runs")
    catalog = FilesCatalog([tmp_path / "runs"], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    ra, rb, rc = (catalog.run_id(p) for p in (a, b, c))

    def drive(page: Any) -> None:
        from playwright.sync_api import expect

        page.goto(url + "/evals")
        box = {r: page.locator(f"#compare-form input[name=run][value='{r}']") for r in (ra, rb, rc)}
        assert not any(x.is_disabled() for x in box.values())
        page.check(f"#compare-form input[value='{rb}']")  # the first checked is the baseline
        expect(page.locator("#compare-form")).to_have_attribute("data-sharing-for", rb, timeout=WAIT_MS)
        expect(box[rc]).to_be_disabled()
        assert not box[ra].is_disabled()
        why = page.locator(f"#runs tr:has(input[value='{rc}']) .why")
        assert "no shared samples" in why.inner_text()
        assert "shares no sample ids" in (box[rc].get_attribute("title") or "")
        # unchecking the baseline offers every run again
        page.uncheck(f"#compare-form input[value='{rb}']")
        expect(page.locator("#compare-form")).to_have_attribute("data-sharing-for", "", timeout=WAIT_MS)
        assert not box[rc].is_disabled() and why.inner_text() == ""
        page.check(f"#compare-form input[value='{rb}']")
        expect(box[rc]).to_be_disabled(timeout=WAIT_MS)
        page.check(f"#compare-form input[value='{ra}']")
        with page.expect_navigation():
            page.click("#compare-form button[type=submit]")
        names = page.locator("#compared-runs tbody tr").all_inner_texts()
        assert len(names) == 2 and "arith-cand" in names[0] and "arith-base" in names[1], names  # b is the baseline
        assert "6 samples in both" in page.inner_text("main").replace("\n", " ")
        assert page.locator("#add-run").count() == 0  # nothing else shares ids with b

        page.goto(f"{url}/evals/{ra}")
        offered = page.locator("#compare-with a").all_inner_texts()
        assert offered == ["arith-cand"], offered
        assert "1 other run share no sample ids" in page.inner_text("#compare-with")
        page.goto(f"{url}/evals/{rc}")
        assert "no other run shares sample ids" in page.inner_text("#compare-with")
        page.goto(f"{url}/compare?runs={ra},{rc}")  # a run given by hand that shares nothing
        assert "none" in page.locator("#compared-runs tbody tr").nth(1).inner_text()
        page.click("#add-run a >> text=arith-cand")
        assert page.locator("#compared-runs tbody tr").count() == 3

    await trio.to_thread.run_sync(_in_browser(drive))
