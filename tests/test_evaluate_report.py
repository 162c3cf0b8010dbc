"""EvalReport: the summary and the config are computed when first read (or when report.json is
written), so callers that never read them (GEPA's many small evaluations) do not pay for them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.eval.report import EvalReport
from rollouts.eval.summary import summarize


def _config(**kw: Any) -> EvalConfig:
    model = ScriptedModel(lambda req: f"answer {req.last_user_text}")
    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=lambda s: Score((Metric("correct", float(s.response == f"answer {s.input['q']}"), weight=1.0),)),
        show_progress=False,
        **kw,
    )


@pytest.fixture
def summarize_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import rollouts.eval.report as eval_report

    calls: list[int] = []
    real = eval_report.summarize

    def counting(samples: Any) -> dict[str, Any]:
        calls.append(1)
        return real(samples)

    monkeypatch.setattr(eval_report, "summarize", counting)
    return calls


async def test_summary_is_computed_once_and_only_when_read(summarize_calls: list[int]) -> None:
    report = await evaluate([{"q": i} for i in range(3)], _config())
    assert summarize_calls == []
    assert report.summary["counts"]["completed"] == 3 and report.summary["reward"]["mean"] == 1.0
    assert re.fullmatch(r"eval-scripted-\d+-\d{8}-\d{6}", report.config["eval_name"])  # task, model, time
    assert report.config["max_concurrent"] == 8
    assert report.summary is report.summary and len(summarize_calls) == 1
    assert json.loads(json.dumps(report.to_dict()))["summary"] == report.summary


async def test_report_json_still_gets_both(tmp_path: Path, summarize_calls: list[int]) -> None:
    report = await evaluate([{"q": i} for i in range(3)], _config(output_dir=tmp_path))
    # With an output_dir the samples are not held: the summary is accumulated as they finish
    # (no summarize() over a list at the end) and the samples are read back when first used.
    assert summarize_calls == []
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["summary"]["counts"]["completed"] == 3
    assert data["config"]["eval_name"] == data["eval_name"] and data["eval_name"].startswith(f"{tmp_path.name}-")
    assert report.summary == data["summary"] and summarize_calls == []
    assert [s.id for s in report.samples] == ["0", "1", "2"] and report.summary == summarize(report.samples)


def test_fields_given_as_values_or_functions() -> None:
    sample = Sample("a", {"q": 1}, status="failed")
    assert EvalReport("e", (sample,)).summary["counts"]["failed"] == 1
    assert EvalReport("e", (sample,)).config == {}
    assert EvalReport("e", (), summary={"x": 1}, config={"y": 2}).summary == {"x": 1}
    made: list[int] = []
    lazy = EvalReport("e", (), config=lambda: made.append(1) or {"y": 2})
    assert made == [] and lazy.config == {"y": 2} and lazy.config == {"y": 2} and made == [1]
    assert lazy == EvalReport("e", (), config={"y": 2})
