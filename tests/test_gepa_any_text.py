"""Follow-ups of issue 33 items 1, 2 and 7 in GEPA's run directory.

* A dataset row holding a lone surrogate (as `json.loads` reads `"\\ud83d"`) made the rollout
  log (`JsonlLog`) raise `UnicodeEncodeError` when it wrote the row's line: the GEPA run ended
  there, and resuming it hit the same row again. The line is now written with the surrogate as
  its JSON escape, so the run completes, and a resumed run reads the row back exactly.
* A finished rollout whose row holds NaN (pandas' missing value) was never reused on resume:
  the log stores NaN as null and the adapter compared `json.dumps(row)` (NaN) against it. Rows
  are now compared as the log stores them (`eval.io.row_json`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from _gepa_task import Kill, TagTask, rows

from rollouts import EvalConfig, Metric, Sample, Score, ScriptedModel
from rollouts.gepa import GEPAResult, RolloutsAdapter, optimize
from rollouts.gepa.checkpoint import ROLLOUTS_FILE, JsonlLog

LONE = "\ud83d"  # half an emoji, as json.loads gives it for "\ud83d"


def _with(extra: dict[str, Any], topics: str, prefix: str = "") -> list[dict[str, Any]]:
    return [{**row, **extra} for row in rows(topics, prefix)]


async def _run(
    task: TagTask, run_dir: Path | None, train: list[dict[str, Any]], val: list[dict[str, Any]]
) -> GEPAResult:
    return await optimize(
        task.seed(),
        train,
        val,
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        run_dir=run_dir,
        max_metric_calls=60,
        seed=2,
    )


def _same(a: GEPAResult, b: GEPAResult) -> None:
    da, db = a.to_dict(), b.to_dict()
    da.pop("run_dir")
    db.pop("run_dir")
    assert da == db


def test_lone_surrogate_jsonl_log_writes_and_reads_back_the_text(tmp_path: Path) -> None:
    log = JsonlLog(tmp_path / "log.jsonl")
    log.append({"text": f"a{LONE}b", "pair": "\ud83d\ude00"})
    log.close()
    raw = (tmp_path / "log.jsonl").read_bytes()
    raw.decode("utf-8")  # the file is valid UTF-8
    assert JsonlLog(tmp_path / "log.jsonl").records == [{"text": f"a{LONE}b", "pair": "\U0001f600"}]


@pytest.mark.parametrize("kill_at", [None, 12])
async def test_lone_surrogate_row_gepa_run_completes_and_resumes(tmp_path: Path, kill_at: int | None) -> None:
    train = _with({"note": f"caf{LONE}"}, "abcab")
    val = _with({"note": LONE}, "abca", "v")
    reference = await _run(TagTask(), None, train, val)
    run = tmp_path / "run"
    if kill_at is None:
        first = await _run(TagTask(), run, train, val)
        _same(first, reference)
    else:
        with pytest.raises(Kill):
            await _run(TagTask(kill_at=kill_at), run, train, val)
    again = TagTask()
    _same(await _run(again, run, train, val), reference)
    if kill_at is None:
        assert again.task_calls == 0  # a finished run calls nothing
    records = [json.loads(line) for line in (run / ROLLOUTS_FILE).read_text(encoding="utf-8").splitlines()]
    assert records and all(LONE in r["sample"]["input"]["note"] for r in records)  # stored losslessly


@pytest.mark.parametrize("missing", [math.nan, math.inf])
async def test_nan_row_gepa_rollout_is_reused_on_resume(tmp_path: Path, missing: float) -> None:
    model = ScriptedModel(lambda req: f"echo {req.last_user_text}")

    def score(sample: Sample) -> Score:
        return Score((Metric("correct", float(sample.input["question"] in sample.response), 1.0),))

    cfg = EvalConfig(endpoint=model.endpoint, score_fn=score, show_progress=False)
    log = tmp_path / ROLLOUTS_FILE
    batch = [{"question": "a", "extra": missing}, {"question": "b", "extra": 1.5}]
    first = RolloutsAdapter(cfg, log_path=log)
    out1 = await first.evaluate(batch, {"system_prompt": "S"}, capture_traces=True, eval_id="e1")
    first.close()
    assert model.calls == 2
    second = RolloutsAdapter(cfg, log_path=log)
    out2 = await second.evaluate(batch, {"system_prompt": "S"}, capture_traces=True, eval_id="e1")
    second.close()
    assert model.calls == 2  # both read back from the log, the NaN row too
    assert out2.scores == out1.scores == [1.0, 1.0] and out2.outputs == out1.outputs


async def test_nan_row_gepa_run_killed_and_resumed_repeats_no_finished_rollout(tmp_path: Path) -> None:
    train = _with({"weight": math.nan}, "abcab")
    val = _with({"weight": math.nan}, "abca", "v")
    reference = await _run(TagTask(), None, train, val)
    run = tmp_path / "run"
    killed = TagTask(kill_at=12)
    with pytest.raises(Kill):
        await _run(killed, run, train, val)
    logged = len((run / ROLLOUTS_FILE).read_text(encoding="utf-8").splitlines())
    assert logged >= 4
    again = TagTask()
    _same(await _run(again, run, train, val), reference)
    # what was logged before the kill is not run again
    assert again.task_calls <= reference.metric_calls - logged


async def test_lone_surrogate_in_a_proposed_text_gepa_run_completes_and_resumes(tmp_path: Path) -> None:
    """A reflection reply holding a lone surrogate becomes candidate text: the run dir's logs,
    state and result files store it; best_<component>.txt shows it as an escape."""

    def make() -> TagTask:
        task = TagTask()
        plain = task._reflect

        def reflect(req: Any) -> str:
            return plain(req).replace("is handled.", f"is handled {LONE}.")

        task.reflector._fn = reflect
        return task

    train, val = rows("abcab"), rows("abca", "v")
    run = tmp_path / "run"
    first = await _run(make(), run, train, val)
    assert any(LONE in c.components["system_prompt"] for c in first.candidates)
    again = make()
    _same(await _run(again, run, train, val), first)
    assert again.task_calls == 0 and again.reflect_calls == 0
    best = first.best_candidate["system_prompt"]
    shown = (run / "best_system_prompt.txt").read_text(encoding="utf-8").rstrip("\n")
    assert shown == best.encode("utf-8", "backslashreplace").decode("utf-8")
