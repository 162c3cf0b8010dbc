"""Issue 13 item 14: a NaN (or infinite) reward must not write invalid JSON. A Metric refuses a
non-finite value (the sample fails, naming the metric); any other non-finite number in a record
(free-form metadata) is written as null, so every line of samples.jsonl and report.json parses."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.eval.io import dumps_json, write_json_atomic


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_nan_reward_writes_valid_json(tmp_path: Path, value: float) -> None:
    model = ScriptedModel(lambda req: "x")

    def score(sample: Sample) -> Score:
        if sample.input["q"] == 1:
            return Score((Metric("m", value, weight=1.0),))
        return Score((Metric("m", 1.0, weight=1.0, metadata={"ratio": value}),))

    cfg = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=score,
        output_dir=tmp_path,
        show_progress=False,
    )
    report = await evaluate([{"q": 1}, {"q": 2}], cfg)
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    records = {r["id"]: r for r in map(_strict, lines)}
    assert records["0"]["status"] == "failed" and "finite" in records["0"]["error"] and "'m'" in records["0"]["error"]
    assert records["1"]["status"] == "completed" and records["1"]["score"]["metrics"][0]["metadata"]["ratio"] is None
    data = _strict((tmp_path / "report.json").read_text())
    assert data["summary"]["reward"]["mean"] == 1.0
    assert report.summary["counts"]["failed"] == 1


def test_nan_reward_json_writers_never_emit_nan(tmp_path: Path) -> None:
    assert _strict(dumps_json({"a": [math.nan, 1.5, {"b": math.inf}]})) == {"a": [None, 1.5, {"b": None}]}
    write_json_atomic(tmp_path / "x.json", {"v": -math.inf})
    assert _strict((tmp_path / "x.json").read_text()) == {"v": None}
