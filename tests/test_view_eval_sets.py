"""Issue 30 item 2's "the viewer's compare page opens an eval set": `rollouts view` on an eval
set's directory (or on a folder holding it) lists the set and opens its comparison, per task
each model's mean reward with its bootstrap interval, n and failures, linked to each pair's run
and to the runs compared sample by sample. The set is made by `evaluate_set()` with scripted
models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel
from rollouts.eval.sets import EvalTask, evaluate_set
from rollouts.providers.scripted import ScriptedRequest
from rollouts.view import FilesCatalog, create_app, serve
from rollouts.view.bundle import write_bundle


def _score(sample: Sample) -> Score:
    return Score((Metric("correct", float(sample.response == str(sample.input["answer"])), 1.0),))


def _model(name: str, right_every: int) -> ScriptedModel:
    def reply(request: ScriptedRequest) -> str:
        n = int(request.last_user_text.split()[-1])
        return str(2 * n if n % right_every == 0 else 2 * n + 1)

    return ScriptedModel(reply, name=name)


async def _make_set(out: Path) -> None:
    good, half = _model("vs-good", 1), _model("vs-half", 2)
    config = EvalConfig(good.endpoint, prepare_messages=lambda row: [Message("user", f"double {row['n']}")],
                        score_fn=_score, max_turns=1, show_progress=False)  # fmt: skip
    tasks = [
        EvalTask("doubles", [{"id": f"d{i}", "n": i, "answer": 2 * i} for i in range(1, 21)], config),
        EvalTask("small", [{"id": f"s{i}", "n": i, "answer": 2 * i} for i in range(1, 5)], config),
    ]
    await evaluate_set(tasks, [good.endpoint, half.endpoint], out, max_concurrent=4)


@pytest.fixture
async def eval_set(tmp_path: Path) -> Path:
    out = tmp_path / "data" / "sets" / "arith-set"  # (two levels under the folder given to the viewer)
    await _make_set(out)
    return out


@pytest.mark.parametrize("given", ["set", "parent", "grandparent"])
async def test_an_eval_set_is_listed_from_its_directory_or_a_folder_above(
    tmp_path: Path, eval_set: Path, given: str
) -> None:
    path = {"set": eval_set, "parent": eval_set.parent, "grandparent": eval_set.parent.parent}[given]
    catalog = FilesCatalog([path], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    (row,) = await catalog.list_eval_sets()
    assert (row.name, row.tasks, row.models) == (
        "arith-set",
        ("doubles", "small"),
        ("scripted/vs-good", "scripted/vs-half"),
    )
    assert (row.completed, row.failed, row.pending) == (4, 0, 0)
    d = await catalog.get_eval_set(row.set_id)
    index = json.loads((eval_set / "index.json").read_text())
    by = {(c.task, c.model): c for c in d.cells}
    good, half = by["doubles", "scripted/vs-good"], by["doubles", "scripted/vs-half"]
    assert (good.n, good.mean, good.ci) == (20, 1.0, (1.0, 1.0))
    want = index["comparison"]["doubles"]["scripted/vs-half"]
    assert (half.n, half.mean, list(half.ci or ())) == (20, 0.5, want["ci"]) and half.ci_method == "bootstrap"
    assert half.ci is not None and half.ci[0] < 0.5 < half.ci[1]
    # every pair's run is in the catalog too, and its link goes to it
    runs = {r.run_id: r for r in await catalog.list_eval_runs()}
    assert len(runs) == 4 and all(c.run_id in runs for c in d.cells)
    assert runs[good.run_id or ""].location == str((eval_set / index["pairs"][0]["dir"]).resolve())


async def test_an_index_naming_a_directory_outside_the_set_is_not_followed(tmp_path: Path, eval_set: Path) -> None:
    outside = tmp_path / "outside"
    shutil.copytree(eval_set / "doubles", outside)  # runs the viewer was not given
    index = json.loads((eval_set / "index.json").read_text())
    index["pairs"][0]["dir"] = "../../../outside/scripted-vs-good"
    (eval_set / "index.json").write_text(json.dumps(index))
    catalog = FilesCatalog([eval_set], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    assert all("outside" not in r.location for r in await catalog.list_eval_runs())
    d = await catalog.get_eval_set((await catalog.list_eval_sets())[0].set_id)
    assert d.cells[0].run_id is None  # no link out


async def test_the_eval_set_page_over_http_and_in_a_bundle(
    tmp_path: Path, eval_set: Path, nursery: trio.Nursery
) -> None:
    catalog = FilesCatalog([eval_set.parent], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    set_id = (await catalog.list_eval_sets())[0].set_id
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        evals = (await client.get("/evals")).text
        assert f'href="/sets/{set_id}"' in evals and "4 completed" in evals
        page = (await client.get(f"/sets/{set_id}")).text
        assert page.count('<section class="set-task"') == 2 and page.count("<svg") == 2
        assert "[1.000, 1.000]" in page
        api = (await client.get(f"/api/sets/{set_id}")).json()
        assert [c["mean"] for c in api["cells"]] == [1.0, 0.5, 1.0, 0.5]
        assert (await client.get("/sets/nope")).status_code == 404
    files = await write_bundle(catalog, tmp_path / "bundle")
    assert tmp_path / "bundle" / "sets" / f"{set_id}.html" in files
    html = (tmp_path / "bundle" / "sets" / f"{set_id}.html").read_text()
    assert 'href="../evals/' in html and "compare these runs" not in html  # (no compare in a static copy)


async def test_the_eval_set_page_in_chromium(tmp_path: Path, eval_set: Path, nursery: trio.Nursery) -> None:
    from test_view_browser import _in_browser, _require_browser

    _require_browser()
    catalog = FilesCatalog([eval_set.parent.parent], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    shots = tmp_path / "shots"
    shots.mkdir()

    def drive(page: Any) -> None:
        page.goto(url + "/evals")
        page.click("#eval-sets a >> text=arith-set")
        task = page.locator("section.set-task").first
        assert "doubles" in task.locator("h2").inner_text()
        plot = task.locator("svg.ci-plot")
        assert plot.locator("g.ci").count() == 2 and plot.locator("g.ci circle").count() == 2
        box = plot.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 40  # drawn, not blank
        # the half-right model's interval is a visible bar around its dot
        bar = plot.locator("g.ci").nth(1).locator("line.bar").first
        assert float(bar.get_attribute("x2") or 0) - float(bar.get_attribute("x1") or 0) > 10
        rows = task.locator("table.set-table tbody tr")
        assert [r.locator("td").first.inner_text() for r in rows.all()] == ["scripted/vs-good", "scripted/vs-half"]
        page.screenshot(path=shots / "eval-set.png", full_page=True)
        with page.expect_navigation():
            task.locator("a.compare-task").click()
        assert page.inner_text("h1") == "Compare runs"
        assert "20 samples in both" in page.inner_text("main").replace("\n", " ")
        page.go_back()
        with page.expect_navigation():
            page.locator("section.set-task").first.locator("table.set-table a >> text=samples").nth(1).click()
        assert page.locator("#samples tbody tr").count() == 20

    await trio.to_thread.run_sync(_in_browser(drive))
    keep = __import__("os").environ.get("ROLLOUTS_VIEW_SCREENSHOTS")
    if keep:
        shutil.copyfile(shots / "eval-set.png", Path(keep) / "view-eval-set.png")
