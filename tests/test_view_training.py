"""Issue 31 item 5, "look rather than read": a GRPO run directory opens in `rollouts view` with
its reward, KL, loss, held-out and seconds-per-step curves drawn by the viewer as inline SVG (no
script, the CSP unchanged), and each step links to its sampled trajectories when the run kept
them (`GRPOConfig(keep_step_samples=True)`). The run is a real one on the tiny model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

try:
    import torch
    import transformers  # noqa: F401
except ImportError:  # never skipped: say what to install
    pytest.fail(
        "the training tests need torch and transformers: pip install torch==2.13.0 -e '.[train]'", pytrace=False
    )

from _training_helpers import PROMPTS, sevens
from test_training_grpo import _config

from rollouts.training import grpo_train, local_policy
from rollouts.training.tiny import tiny_chat_model
from rollouts.view import FilesCatalog, create_app, serve
from rollouts.view.bundle import write_bundle

torch.set_num_threads(1)
STEPS = 3


async def _train(out: Path, *, keep: bool) -> dict[str, Any]:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(out, num_steps=STEPS, n_samples_per_prompt=4, checkpoint_every=2, keep_step_samples=keep)
    backend, policy = local_policy(model, tokenizer, config, name=f"tiny-view-{keep}")
    await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def training_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real tiny runs: one keeping each step's samples, one not (trained once per module)."""
    root = tmp_path_factory.mktemp("training")

    async def both() -> None:
        kept = await _train(root / "runs" / "grpo-kept", keep=True)
        plain = await _train(root / "runs" / "grpo-plain", keep=False)
        assert kept.keys() == plain.keys()
        assert all(torch.equal(kept[k], plain[k]) for k in kept)  # keeping samples changes no weight

    trio.run(both)
    return root / "runs"


def test_the_viewer_spells_the_training_file_names_as_training_writes_them() -> None:
    from rollouts.training import checkpoints, grpo
    from rollouts.view import _training_files

    assert (_training_files.LOG_FILE, _training_files.CHECKPOINTS, _training_files.STEPS_DIR) == (
        grpo.LOG_FILE,
        checkpoints.CHECKPOINTS,
        grpo.STEPS_DIR,
    )


async def test_keep_step_samples_writes_each_steps_rollouts_and_only_when_asked(training_runs: Path) -> None:
    kept, plain = training_runs / "grpo-kept", training_runs / "grpo-plain"
    assert not (plain / "steps").exists()
    steps = sorted(p.name for p in (kept / "steps").iterdir())
    assert steps == [f"step_{i:06d}" for i in range(STEPS)]
    lines = (kept / "steps" / "step_000001" / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4 and json.loads(lines[0])["id"].startswith("step1-")


async def test_a_training_run_is_listed_with_its_steps_linked_to_their_samples(
    tmp_path: Path, training_runs: Path
) -> None:
    catalog = FilesCatalog([training_runs], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    rows = {r.name: r for r in await catalog.list_training_runs()}
    assert set(rows) == {"grpo-kept", "grpo-plain"}
    kept = rows["grpo-kept"]
    log = [json.loads(x) for x in (training_runs / "grpo-kept" / "log.jsonl").read_text().splitlines()]
    assert (kept.steps, kept.last_step, kept.checkpoints) == (STEPS, STEPS - 1, 2)
    assert (kept.reward_first, kept.reward_last, kept.heldout_last) == (
        log[0]["reward_mean"],
        log[-1]["reward_mean"],
        None,
    )
    d = await catalog.get_training_run(kept.run_id)
    assert d.series("kl") == [(float(e["step"]), e["kl"]) for e in log]
    assert all(s.samples_run_id is not None for s in d.steps)
    # a step's samples are an eval run of the catalog, not in the runs list
    assert (await catalog.get_eval_run(d.steps[1].samples_run_id or "")).row.n_samples == 8
    assert [r.name for r in await catalog.list_eval_runs()] == []
    plain = await catalog.get_training_run(rows["grpo-plain"].run_id)
    assert all(s.samples_run_id is None for s in plain.steps)
    # a static copy links only pages it has (the steps' samples get none)
    await write_bundle(catalog, tmp_path / "bundle")
    html = (tmp_path / "bundle" / "training" / f"{kept.run_id}.html").read_text()
    assert html.count("<svg") == 10 and "../evals/" not in html


async def test_a_held_out_curve_is_drawn_when_the_log_has_one(
    tmp_path: Path, training_runs: Path, nursery: trio.Nursery
) -> None:
    import httpx2

    run = tmp_path / "with-heldout"
    shutil.copytree(training_runs / "grpo-plain", run)
    lines = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    for i, e in enumerate(lines):
        if i % 2 == 0:
            e["heldout_reward"] = 0.25 + i / 10  # (what a held-out evaluation adds, on the steps it runs)
    lines[0]["heldout_reward_start"] = 0.125  # (and before the first update, HeldOut.at_start)
    (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines) + '{"step": 9, "rew')  # torn tail
    catalog = FilesCatalog([run], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    (row,) = await catalog.list_training_runs()
    assert row.steps == STEPS and (row.heldout_start, row.heldout_last) == (0.125, 0.25 + 2 / 10)
    d = await catalog.get_training_run(row.run_id)
    assert d.series("heldout_reward") == [(-1.0, 0.125), (0.0, 0.25), (2.0, 0.45)]  # start drawn at step -1
    assert d.series("kl")[0][0] == 0.0
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        page = (await client.get(f"/training/{row.run_id}")).text
        main = page[page.index('id="curves"') : page.index("more curves")]
        assert main.count('class="line"') == 5  # reward, held-out, KL, loss, seconds per step
        assert main.count("<circle") == 3 + 3 + 3 + 3 + 3  # held-out: the start and the two steps that have it
        assert 'held-out 0.125 → <b data-field="heldout_last">0.450</b>' in page
        assert "No held-out evaluations" not in page
        assert (await client.get("/training/nope")).status_code == 404
        assert "0.125 → <b>0.450</b>" in (await client.get("/training")).text  # the runs list
        assert [r["name"] for r in (await client.get("/api/training")).json()] == ["with-heldout"]
    files = await write_bundle(catalog, tmp_path / "bundle")
    assert tmp_path / "bundle" / "training" / f"{row.run_id}.html" in files


async def test_the_training_page_draws_its_curves_in_chromium(
    tmp_path: Path, training_runs: Path, nursery: trio.Nursery
) -> None:
    from test_view_browser import _in_browser, _require_browser

    _require_browser()
    catalog = FilesCatalog([training_runs], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    shots = tmp_path / "shots"
    shots.mkdir()

    def drive(page: Any) -> None:
        csp: list[str] = []
        page.on("console", lambda m: csp.append(m.text) if "Content Security Policy" in m.text else None)
        page.goto(url + "/")
        with page.expect_navigation():
            page.click("header.top >> text=Training")
        with page.expect_navigation():  # (the reads below do not wait: the page must have loaded)
            page.click("#training-runs a >> text=grpo-kept")
        figures = page.locator("#curves figure.curve")
        titles = [t.strip() for t in figures.locator("figcaption").all_inner_texts()]
        assert titles == ["reward", "held-out reward", "KL", "loss", "seconds per step"], titles
        for name in ("reward", "KL", "loss", "seconds per step"):
            svg = page.locator("#curves figure.curve", has_text=name).first.locator("svg.curve-plot")
            box = svg.bounding_box()
            assert box is not None and box["width"] > 200 and box["height"] > 100, name
            assert svg.locator("path.line").count() == 1 and svg.locator("circle").count() == STEPS, name
            d = svg.locator("path.line").get_attribute("d") or ""
            assert d.startswith("M") and d.count("L") == STEPS - 1, name
        assert "no values" in figures.nth(1).inner_text()  # this log has no held-out evaluations
        assert figures.nth(1).locator("svg.empty").count() == 1
        assert page.locator("#steps tbody tr").count() == STEPS
        page.screenshot(path=shots / "training.png", full_page=True)
        # a step's dot on the reward curve opens that step's rollouts
        with page.expect_navigation():
            figures.first.locator("svg a").nth(1).click()
        assert page.locator("#samples tbody tr").count() == 8
        assert "step1-" in page.locator("#samples tbody tr").first.inner_text()
        page.go_back()
        with page.expect_navigation():
            page.click("#step-0 a >> text=samples")
        assert "step0-" in page.locator("#samples tbody tr").first.inner_text()
        assert not csp, csp

    await trio.to_thread.run_sync(_in_browser(drive))
    keep = os.environ.get("ROLLOUTS_VIEW_SCREENSHOTS")
    if keep:
        shutil.copyfile(shots / "training.png", Path(keep) / "view-training.png")


async def test_a_long_training_log_gives_a_page_of_bounded_size(tmp_path: Path, nursery: trio.Nursery) -> None:
    import httpx2

    from rollouts.view.plots import POINTS_MAX

    run = tmp_path / "long"
    run.mkdir()
    lines = (
        json.dumps({"step": i, "reward_mean": (i % 97) / 97, "kl": 0.01, "loss": 0.1, "seconds": 1.5})
        for i in range(20_000)
    )
    (run / "log.jsonl").write_text("".join(x + "\n" for x in lines))
    catalog = FilesCatalog([run], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    (row,) = await catalog.list_training_runs()
    assert row.steps == 20_000
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    async with httpx2.AsyncClient(base_url=url, timeout=30) as client:
        page = (await client.get(f"/training/{row.run_id}")).text
        older = (await client.get(f"/training/{row.run_id}?page=2")).text
    assert len(page) < 300_000 and "<circle" not in page  # thinned lines, no dot per step
    d = page[page.index('id="curves"') :]
    first_path = d[d.index(' d="M') :].split('"')[1]
    assert first_path.count("L") <= POINTS_MAX
    assert 'id="step-19999"' in page and 'id="step-19899"' not in page and 'id="step-19899"' in older


async def test_a_running_training_page_redraws_its_curves_as_steps_are_logged(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    from test_view_browser import WAIT_MS, _in_browser, _require_browser

    _require_browser()
    run = tmp_path / "running"
    run.mkdir()

    def log(step: int) -> None:
        with open(run / "log.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "reward_mean": step / 10, "kl": 0.0, "loss": 0.1, "seconds": 2.0}) + "\n")

    for i in range(2):
        log(i)
    catalog = FilesCatalog([run], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog, live_poll_s=0.05))).rstrip("/")
    (row,) = await catalog.list_training_runs()
    assert row.active

    def drive(page: Any) -> None:
        from playwright.sync_api import expect

        page.goto(f"{url}/training/{row.run_id}")
        page.wait_for_selector("body[data-live-updates]", state="attached")  # the first event arrived
        reward = page.locator("#curves figure.curve").first.locator("circle")
        expect(reward).to_have_count(2)
        log(2)  # the trainer finishes a step
        expect(page.locator('[data-field="steps"]')).to_have_text("3", timeout=WAIT_MS)
        expect(reward).to_have_count(3, timeout=WAIT_MS)  # redrawn in place
        assert page.locator('[data-field="reward_last"]').inner_text() == "0.200"
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # no reload

    await trio.to_thread.run_sync(_in_browser(drive))
