"""Issue 32 item 1: evaluate()'s executor seam. evaluate() admits rows, decides per row (run,
re-score, reuse) and records every sample; an executor only runs the rows it is handed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.errors import ConfigurationError
from rollouts.eval.config import Row
from rollouts.eval.executor import Feed, InProcess, Record, Submit


def _prepare(row: dict[str, Any]) -> list[Message]:
    return [Message("user", str(row["q"]))]


def _score(sample: Sample) -> Score:
    return Score((Metric("correct", float(sample.response == f"answer {sample.input['q']}"), weight=1.0),))


class _Watched:
    """The in-process executor, with what it was handed and how many rows were out at once."""

    def __init__(self, capacity: int, refuse: str | None = None) -> None:
        self.inner = InProcess()
        self.slots = capacity
        self.refuse = refuse
        self.ran: list[str] = []
        self.out = 0
        self.most_out = 0

    def prepare(self, config: EvalConfig) -> None:
        if self.refuse is not None:
            raise ConfigurationError(self.refuse)

    def capacity(self, config: EvalConfig) -> int:
        return self.slots

    async def run(self, config: EvalConfig, feed: Feed, record: Record) -> None:
        async def watched_feed(submit: Submit) -> None:
            async def watched_submit(row: Row, sample_id: str) -> None:
                self.ran.append(sample_id)
                self.out += 1
                self.most_out = max(self.most_out, self.out)
                await submit(row, sample_id)

            await feed(watched_submit)

        async def watched_record(sample: Sample) -> None:
            self.out -= 1
            await record(sample)

        await self.inner.run(config, watched_feed, watched_record)


async def test_evaluate_hands_the_rows_to_run_to_its_executor_and_keeps_resume_itself(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: f"answer {req.last_user_text}")
    config = EvalConfig(
        endpoint=model.endpoint, prepare_messages=_prepare, score_fn=_score, show_progress=False, output_dir=tmp_path
    )
    rows = [{"q": i} for i in range(12)]
    first = _Watched(capacity=3)
    report = await evaluate(rows, config, executor=first)
    assert sorted(first.ran, key=int) == [str(i) for i in range(12)]
    assert first.most_out <= 3  # evaluate() admits no more than the executor's capacity
    assert report.summary["counts"]["completed"] == 12 and report.summary["reward"]["mean"] == 1.0

    again = _Watched(capacity=3)
    resumed = await evaluate(rows + [{"q": 12}], config, executor=again)
    assert again.ran == ["12"]  # the recorded rows were reused by evaluate(), never handed over
    assert resumed.reused == 12 and [s.id for s in resumed.samples] == [str(i) for i in range(13)]

    rescoring = _Watched(capacity=3)
    rescored = await evaluate(rows, replace(config, score_fn=lambda s: Score(()), rescore=True), executor=rescoring)
    assert rescoring.ran == [] and rescored.rescored == 12  # re-scored by evaluate(), in this process


async def test_an_executor_refusing_the_config_stops_evaluate_before_anything_is_written(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "x")
    config = EvalConfig(endpoint=model.endpoint, prepare_messages=_prepare, output_dir=tmp_path / "out")
    with pytest.raises(ConfigurationError, match="cannot run here"):
        await evaluate([{"q": 1}], config, executor=_Watched(1, refuse="cannot run here"))
    assert not (tmp_path / "out").exists()
