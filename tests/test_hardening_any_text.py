"""Issue 33 items 1, 2 and 7: any text and any row value is stored losslessly, and what was
written is what resume compares.

* item 1: a dataset row holding a lone surrogate (as `json.loads` reads `"\\ud83d"`) ended the
  whole evaluate() (UnicodeEncodeError writing samples.jsonl); a failure marks only its sample;
* item 2: a reply holding a lone surrogate (a server's JSON escape) crashed a recorded run in
  the session log's encoder; an astral character whose surrogate halves were streamed in two
  deltas arrived as two code points;
* item 7: a completed sample whose row holds NaN was never reused (stored as null, compared as NaN).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rollouts import Endpoint, EvalConfig, Message, RunConfig, Sample, Score, ScriptedModel, evaluate, run_agent
from rollouts.dtypes import Actor, AgentState, Trajectory
from rollouts.eval.io import load_jsonl
from rollouts.eval.scorers import combine, exact_match, metric
from rollouts.store import FileSessionStore
from rollouts.testing.fake_server import open_fake_server

LONE = "\ud83d"  # the high half of U+1F600, alone
EMOJI = "\U0001f600"


def _config(model: ScriptedModel, out: Path | None, **kw: Any) -> EvalConfig:
    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=combine(metric("correct", exact_match(), weight=1.0)),
        output_dir=out,
        show_progress=False,
        **kw,
    )


async def test_surrogate_row_fails_only_its_sample_and_is_stored_losslessly(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"q": "a", "answer": "a"}\n{"q": "x\\ud83d", "answer": "x\\ud83d"}\n{"q": "b", "answer": "b"}\n')
    rows = list(load_jsonl(data))
    assert rows[1]["q"] == "x" + LONE
    model = ScriptedModel(lambda req: req.last_user_text, name="echo")
    out = tmp_path / "run"
    report = await evaluate(rows, _config(model, out))
    assert report.status == "completed"
    assert [s.status for s in report.samples] == ["completed"] * 3  # no failure at all: it is just text
    assert [s.reward for s in report.samples] == [1.0, 1.0, 1.0]
    lines = (out / "samples.jsonl").read_bytes().decode("utf-8").splitlines()  # valid UTF-8
    recorded = {r["id"]: r for r in map(json.loads, lines)}
    assert recorded["1"]["input"]["q"] == "x" + LONE  # read back exactly
    assert recorded["1"]["trajectory"]["messages"][-1]["content"][0]["text"] == "x" + LONE
    # resume reuses all three (the digest of what was written equals the row's)
    again = await evaluate(rows, _config(ScriptedModel([], name="echo"), out))
    assert again.reused == 3 and again.status == "completed"


async def test_surrogate_row_an_unwritable_sample_fails_only_itself(tmp_path: Path) -> None:
    """Whatever the row or the score holds: a sample that cannot be written fails alone."""
    model = ScriptedModel(lambda req: "ok")

    def score(sample: Sample) -> Score:
        meta = {("tuple", "key"): 1} if sample.input["q"] == 1 else {}
        return Score((metric_value(1.0, meta),))

    def metric_value(v: float, meta: dict[Any, Any]) -> Any:
        from rollouts import Metric

        return Metric("m", v, weight=1.0, metadata=meta)

    cfg = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=score,
        output_dir=tmp_path,
        show_progress=False,
    )
    rows: list[dict[Any, Any]] = [{"q": 0}, {"q": 1}, {"q": 2, (1, 2): "a tuple key"}]
    report = await evaluate(rows, cfg)
    assert report.status == "completed"
    by_id = {s.id: s for s in report.samples}
    assert by_id["0"].status == "completed" and by_id["2"].status == "completed"
    assert by_id["1"].status == "failed" and "recording the sample" in (by_id["1"].error or "")
    recorded = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [r["status"] for r in recorded].count("completed") == 2
    assert {"unstorable_row": repr(rows[2])} in [r["input"] for r in recorded]  # its row as text


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_surrogate_reply_is_recorded_losslessly_and_split_pairs_are_joined(
    tmp_path: Path, transport: str
) -> None:
    # The fake server writes its deltas with json.dumps (ASCII escapes): with 3 characters per
    # delta, "ab\ud83d" and "\ude00!" arrive in two deltas, as a server splitting an emoji does.
    replies = ["ab\ud83d\ude00!", "lone " + LONE]
    async with open_fake_server(replies, chunk_size=3) as srv:
        endpoint = Endpoint("openai-compatible", "fake", api_base=srv.base_url, api_key="sk-test", transport=transport)
        store = FileSessionStore(tmp_path / "sessions")
        texts = []
        for _ in replies:
            state = AgentState(actor=Actor(Trajectory((Message("user", "hi"),)), endpoint))
            states = await run_agent(state, RunConfig(session_store=store))
            session, messages = await store.get(states[-1].session_id)  # type: ignore[arg-type]
            assert session.status.value == "completed"
            assert tuple(messages) == states[-1].actor.trajectory.messages  # read back exactly
            texts.append(messages[-1].text)
    assert texts == ["ab" + EMOJI + "!", "lone " + LONE]
    assert all(len(json.loads(line)) for p in (tmp_path / "sessions").rglob("*.jsonl") for line in p.open())


@pytest.mark.parametrize("missing", [math.nan, None])
async def test_nan_row_is_reused_on_resume(tmp_path: Path, missing: float | None) -> None:
    rows = [{"q": "a", "answer": "a", "note": missing}, {"q": "b", "answer": "b", "note": 1.5}]
    first = await evaluate(rows, _config(ScriptedModel(lambda req: req.last_user_text, name="echo"), tmp_path))
    assert [s.status for s in first.samples] == ["completed", "completed"]
    second = await evaluate(rows, _config(ScriptedModel([], name="echo"), tmp_path))
    assert second.reused == 2 and [s.reward for s in second.samples] == [1.0, 1.0]
    assert second.samples[0].input["note"] is None  # what was written: NaN is stored as null
