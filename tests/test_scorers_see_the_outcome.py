"""Issue 33 items 13 and 14 (its first half).

13: what a score function receives was documented nowhere and the final environment was not
available to it: `Sample.environment_state` is the environment's `serialize()` when the run
ended (documented with an example scorer on `Sample`, which this test runs).
14: `exact_match_tag`'s feedback hid the format ("no answer found in the response (expected 63)"
without naming the `<answer>` tag), so GEPA's reflection model could not learn it: feedback says
what was expected in what form."""

from __future__ import annotations

import json
from pathlib import Path

from rollouts import CalculatorEnvironment, EvalConfig, Message, Metric, Sample, Score, evaluate
from rollouts.dtypes import Trajectory
from rollouts.eval.scorers import (
    builtin_score_fn,
    exact_match,
    extract_boxed,
    extract_tag,
    numeric_match,
)
from rollouts.providers.scripted_models import ensure_builtin_scripted_model


def _sample(text: str, answer: str = "63") -> Sample:
    return Sample("1", {"answer": answer}, Trajectory((Message("assistant", text),)))


async def test_exact_match_tag_feedback_names_the_answer_tag() -> None:
    score = await builtin_score_fn(["exact_match_tag"])(_sample("The answer is 63."))
    assert score.feedback == (
        "no answer found in the response: expected '63' inside <answer>...</answer> tags, e.g. <answer>63</answer>"
    )
    wrong = await builtin_score_fn(["exact_match_tag"])(_sample("<answer>62</answer>"))
    assert wrong.feedback == "expected '63', got '62' (inside <answer>...</answer> tags)"
    _, boxed = exact_match(extract=extract_boxed)(_sample("63"))  # type: ignore[misc]
    assert "inside \\boxed{...}, e.g. \\boxed{63}" in boxed
    _, number = numeric_match(extract=extract_tag("final"))(_sample("sixty-three"))  # type: ignore[misc]
    assert (
        number == "no number found in the response: expected 63 inside <final>...</final> tags, e.g. <final>63</final>"
    )


async def test_score_function_sees_the_final_environment_state(tmp_path: Path) -> None:
    model = ensure_builtin_scripted_model("calculator")
    seen: dict[str, object] = {}

    def score(sample: Sample) -> Score:  # the example of Sample's docstring
        seen[sample.id] = sample.environment_state
        right = (sample.environment_state or {}).get("current_value") == sample.input["answer"]
        said = str(sample.ground_truth) in sample.response
        return Score((Metric("right", float(right), weight=1.0), Metric("said_it", float(said))))

    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", row["question"])],
        environment_factory=CalculatorEnvironment,
        score_fn=score,
        output_dir=tmp_path,
        show_progress=False,
    )
    rows = [{"question": "what is 7 + 5 * 3?", "answer": 36.0}, {"question": "what is 2 + 2?", "answer": 5.0}]
    report = await evaluate(rows, config)
    assert seen == {"0": {"current_value": 36.0}, "1": {"current_value": 4.0}}
    assert [s.reward for s in report.samples] == [1.0, 0.0]
    recorded = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {r["id"]: r["environment_state"] for r in recorded} == seen
    assert Sample.from_dict(recorded[0]).environment_state == seen[recorded[0]["id"]]  # rescoring sees it too
