"""Issue 19 item 3: big runs stay flat. With an output_dir evaluate() holds no finished sample
(the summary is accumulated, `report.samples` reads samples.jsonl back when first used), and
row ids cost a bit each unless the row has its own id. (Peak memory and CPU per sample at 10k
and 100k rows are measured outside the test suite; tests assert behaviour, not speed.)"""

from __future__ import annotations

import gc
import random
import weakref
from pathlib import Path
from typing import Any

import pytest

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.errors import ConfigurationError
from rollouts.eval.ids import SampleIds
from rollouts.eval.summary import SummaryBuilder, summarize


def _config(model: ScriptedModel, **kw: Any) -> EvalConfig:
    def score(sample: Sample) -> Score:
        return Score((Metric("ok", float(sample.response.endswith("0")), 1.0),))

    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=score,
        show_progress=False,
        max_concurrent=16,
        **kw,
    )


async def test_big_runs_stay_flat_finished_samples_are_not_held(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: f"answer {req.last_user_text}")
    alive: list[weakref.ref[Any]] = []
    rows = ({"q": i} for i in range(300))  # a lazy dataset
    cfg = _config(model, output_dir=tmp_path, on_sample_end=lambda s: alive.append(weakref.ref(s.trajectory)))
    report = await evaluate(rows, cfg)
    gc.collect()
    assert len(alive) == 300 and sum(r() is not None for r in alive) == 0  # nothing kept them
    assert report.summary["counts"]["completed"] == 300 and report.summary["reward"]["mean"] == pytest.approx(0.1)
    # the samples are still there for who asks: read back from samples.jsonl, in dataset order
    assert [s.id for s in report.samples] == [str(i) for i in range(300)]
    assert report.summary == summarize(report.samples)


async def test_big_runs_stay_flat_without_output_dir_keep_samples_false(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: f"answer {req.last_user_text}")
    alive: list[weakref.ref[Any]] = []
    cfg = _config(model, keep_samples=False, on_sample_end=lambda s: alive.append(weakref.ref(s.trajectory)))
    report = await evaluate(({"q": i} for i in range(100)), cfg)
    gc.collect()
    assert sum(r() is not None for r in alive) == 0
    assert report.samples == () and report.summary["counts"]["total"] == 100 and len(report.ids) == 100
    kept = await evaluate([{"q": 1}], _config(model))  # the default without output_dir: kept
    assert len(kept.samples) == 1


def test_big_runs_stay_flat_summary_builder_equals_summarize() -> None:
    rng = random.Random(5)
    samples = []
    for i in range(500):
        status = rng.choice(["completed", "completed", "failed", "provider_error"])
        score = Score((Metric("a", rng.random(), 1.0), Metric("b", rng.choice([0.0, 1.0]), 0.0)))
        samples.append(
            Sample(str(i), status=status, score=score if status == "completed" else None,
                   stop_reason="end_turn", metadata={"duration_s": rng.random(), "turns": rng.randint(1, 5)})
        )  # fmt: skip
    builder = SummaryBuilder()
    for s in samples:
        builder.add(s)
    got, want = builder.result(), summarize(samples)
    assert got["counts"] == want["counts"] and got["turns"]["total"] == sum(s.metadata["turns"] for s in samples)
    scored = [s.score.reward for s in samples if s.score is not None]
    mean = sum(scored) / len(scored)
    assert got["reward"]["mean"] == pytest.approx(mean, rel=1e-12)
    assert got["reward"]["std"] == pytest.approx((sum((x - mean) ** 2 for x in scored) / len(scored)) ** 0.5, rel=1e-9)
    assert got["reward"]["min"] == min(scored) and got["reward"]["max"] == max(scored)


def test_big_runs_stay_flat_sample_ids_are_compact_and_unique() -> None:
    ids = SampleIds()
    for i in range(1000):
        ids.add(i, str(i), explicit=False)
    assert len(ids) == 1000 and ids[999] == "999" and ids[-1] == "999" and list(ids)[:3] == ["0", "1", "2"]
    assert not ids._explicit  # index ids are bits, not strings
    ids.add(1000, "alpha", explicit=True)
    assert ids[1000] == "alpha"
    with pytest.raises(ConfigurationError, match="rows 1000 and 1001 have the same id 'alpha'"):
        ids.add(1001, "alpha", explicit=True)
    with pytest.raises(ConfigurationError, match="rows 7 and 1001 have the same id '7'"):
        ids.add(1001, "7", explicit=True)  # an explicit id equal to an earlier row's index id
    later = SampleIds()
    later.add(0, "1", explicit=True)
    with pytest.raises(ConfigurationError, match="rows 0 and 1 have the same id '1'"):
        later.add(1, "1", explicit=False)  # an index id equal to an earlier explicit id
    ok = SampleIds()
    ok.add(0, "007", explicit=True)  # not an index id
    ok.add(1, "1", explicit=False)
    assert list(ok) == ["007", "1"]


def test_running_stats_are_the_same_in_any_order_and_exact() -> None:
    """evaluate() adds samples as they finish (with workers, in a different order each run):
    the statistics must not change in their last digits with that order, and stay exact where
    a naive sum of squares cancels (a large mean, a tiny spread)."""
    import itertools
    import math
    import random

    from rollouts.eval.summary import RunningStats, stats

    rng = random.Random(7)
    values = [0.1, 0.7, 1.0, 0.0, 0.35, 1e-9, 12.5, 0.3333333333333333, 2.0 / 3.0]
    seen = set()
    for _ in range(50):
        rng.shuffle(values)
        r = RunningStats()
        for v in values:
            r.add(v)
        d = r.to_dict()
        seen.add((d["mean"], d["std"], d["min"], d["max"]))
    assert len(seen) == 1
    (mean, std, lo, hi) = seen.pop()
    ref = stats(values)
    assert (mean, lo, hi) == (ref["mean"], ref["min"], ref["max"]) and math.isclose(std, ref["std"], rel_tol=1e-15)
    close = [1000.0 + i * 1e-6 for i in range(10)]  # population std: 1e-6 * sqrt(8.25)
    for order in itertools.islice(itertools.permutations(close), 20):
        r = RunningStats()
        for v in order:
            r.add(v)
        assert math.isclose(r.to_dict()["std"] or 0.0, 1e-6 * math.sqrt(8.25), rel_tol=1e-6)
    r = RunningStats()
    for v in (1.0, math.inf):
        r.add(v)
    assert r.to_dict()["mean"] == math.inf and math.isnan(r.to_dict()["std"] or 0.0)
