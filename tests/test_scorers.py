"""Score helpers: extraction, matchers with feedback, the combinator, the LLM judge."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from rollouts import EvalConfig, Message, Metric, Sample, ScriptedModel, Trajectory, evaluate
from rollouts.eval.scorers import (
    BUILTIN_METRICS,
    builtin_score_fn,
    combine,
    contains,
    exact_match,
    extract_boxed,
    extract_last_number,
    extract_regex,
    extract_tag,
    llm_judge,
    llm_judge_metric,
    metric,
    numeric_match,
    parse_number,
    regex_match,
)
from rollouts.providers.scripted import ScriptedRequest


def _sample(response: str, **row: Any) -> Sample:
    traj = Trajectory((Message("user", row.pop("question", "Q?")), Message("assistant", response)))
    return Sample(id="s", input=row, trajectory=traj, status="completed")


def test_extractors() -> None:
    assert extract_tag()("I think <answer> 42 </answer> or <answer>43</answer>") == "43"
    assert extract_tag("final")("<FINAL>x</FINAL>") == "x"
    assert extract_tag()("no tag") is None
    assert extract_regex(r"Answer: (\w+)")("Answer: a ... Answer: b") == "b"
    assert extract_regex(r"Answer: (\w+)", last=False)("Answer: a ... Answer: b") == "a"
    assert extract_regex(r"Answer: (\w+)")("nothing") is None
    assert extract_last_number("it costs $1,234.50, not 7") == "7"
    assert extract_last_number("total: -3.5e2") == "-3.5e2"
    assert extract_last_number("none") is None
    assert extract_boxed(r"so \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_boxed("no box") is None
    assert parse_number("1,234") == 1234.0
    assert parse_number("$5") == 5.0
    assert parse_number("3/4") == 0.75
    assert parse_number("1/0") is None
    assert parse_number("abc") is None
    assert parse_number("inf") is None


async def _value(fn: Any, sample: Sample) -> tuple[float, str]:
    score = await combine(metric("m", fn, weight=1.0))(sample)
    m = score.get("m")
    assert m is not None
    return m.value, m.metadata.get("feedback", "")


async def test_exact_match_normalizes_and_explains() -> None:
    fn = exact_match(extract=extract_tag("answer"))
    assert await _value(fn, _sample("<answer>  Paris </answer>", answer="paris")) == (1.0, "correct: 'Paris'")
    assert await _value(fn, _sample("<answer>Lyon</answer>", answer="Paris")) == (
        0.0,
        "expected 'Paris', got 'Lyon' (inside <answer>...</answer> tags)",
    )
    value, feedback = await _value(fn, _sample("Paris", answer="Paris"))
    assert value == 0.0 and "no answer found" in feedback
    assert (await _value(exact_match(case_sensitive=True), _sample("paris", answer="Paris")))[0] == 0.0
    assert (await _value(exact_match(), _sample("b", answer=["a", "b"])))[0] == 1.0
    assert (await _value(exact_match(answer_key="label"), _sample("x", label="x")))[0] == 1.0
    with pytest.raises(ValueError, match="no expected answer"):
        await _value(exact_match(), _sample("x"))


async def test_numeric_match_tolerates_format() -> None:
    fn = numeric_match()
    assert (await _value(fn, _sample("so the total is 1,000.", ground_truth="1000")))[0] == 1.0
    assert (await _value(fn, _sample("0.333", ground_truth="1/3")))[0] == 0.0
    assert (await _value(numeric_match(rel_tol=1e-2), _sample("0.333", ground_truth="1/3")))[0] == 1.0
    assert await _value(fn, _sample("41", ground_truth=42)) == (0.0, "expected 42, got 41")
    assert (await _value(numeric_match(extract=extract_tag()), _sample("<answer>7</answer> 8", answer=7)))[0] == 1.0
    with pytest.raises(ValueError, match="not a number"):
        await _value(fn, _sample("1", ground_truth="blue"))


async def test_contains_and_regex_match() -> None:
    assert (await _value(contains(), _sample("The capital is PARIS.", answer="paris")))[0] == 1.0
    assert (await _value(contains(), _sample("Lyon", answer="paris")))[0] == 0.0
    assert (await _value(regex_match(r"^\d+$"), _sample("123")))[0] == 1.0
    assert (await _value(regex_match(r"^\d+$"), _sample("12a")))[0] == 0.0


async def test_combine_weights_names_and_sync_async_metrics() -> None:
    async def async_len(sample: Sample) -> float:
        await trio.lowlevel.checkpoint()
        return float(len(sample.response))

    def as_metric(sample: Sample) -> Metric:
        return Metric("ignored-name", 0.5, weight=99, metadata={"feedback": "half"})

    score_fn = combine(
        metric("correct", exact_match(), weight=3.0),
        metric("half", as_metric, weight=1.0),
        metric("len", async_len),
        metric("flag", lambda s: True),
    )
    score = await score_fn(_sample("yes", answer="yes"))
    assert [m.name for m in score.metrics] == ["correct", "half", "len", "flag"]
    assert [m.weight for m in score.metrics] == [3.0, 1.0, 0.0, 0.0]
    assert score.reward == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert score.get("len").value == 3.0  # type: ignore[union-attr]
    assert score.get("flag").value == 1.0  # type: ignore[union-attr]
    assert "half" in score.feedback and "correct" in score.feedback

    with pytest.raises(ValueError, match="duplicate"):
        combine(metric("a", exact_match()), metric("a", contains()))
    with pytest.raises(ValueError, match="at least one"):
        combine()
    with pytest.raises(TypeError, match="returned str"):
        await combine(metric("bad", lambda s: "nope"))(_sample("x"))  # type: ignore[arg-type,return-value]


async def test_llm_judge_through_a_scripted_endpoint() -> None:
    prompts: list[str] = []

    def judge_reply(req: ScriptedRequest) -> str:
        prompts.append(req.last_user_text)
        return "The answer is right but terse.\n<score>8</score>"

    judge = ScriptedModel(judge_reply)
    score_fn = llm_judge(judge.endpoint, rubric="Correct and complete.", extra=(metric("len", lambda s: 4.0),))
    score = await score_fn(_sample("Paris", question="Capital of France?", answer="Paris"))
    m = score.get("judge")
    assert m is not None and m.value == 0.8 and m.weight == 1.0
    assert "terse" in m.metadata["feedback"] and m.metadata["raw_score"] == 8
    assert score.reward == 0.8 and score.get("len") is not None
    assert "Capital of France?" in prompts[0] and "Correct and complete." in prompts[0]
    assert "Paris" in prompts[0] and "0 to 10" in prompts[0]

    bad = ScriptedModel(["I refuse to grade."])
    with pytest.raises(ValueError, match="no score"):
        await llm_judge_metric(bad.endpoint, rubric="r")(_sample("x"))  # type: ignore[misc]

    clipped = ScriptedModel(["Score: 15"])
    result = await llm_judge_metric(clipped.endpoint, rubric="r", max_score=10)(_sample("x"))  # type: ignore[misc]
    assert isinstance(result, Metric) and result.value == 1.0


async def test_judge_inside_evaluate_shares_the_eval() -> None:
    model = ScriptedModel(lambda req: f"<answer>{req.last_user_text}</answer>")
    judge = ScriptedModel(
        lambda req: "<score>5</score>" if "<answer>1</answer>" in req.last_user_text else "<score>10</score>"
    )
    score_fn = llm_judge(judge.endpoint, rubric="r", extra=(metric("exact", exact_match(extract=extract_tag()), 0.0),))
    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["answer"]))],
        score_fn=score_fn,
        show_progress=False,
    )
    report = await evaluate([{"answer": 1}, {"answer": 2}], config)
    assert report.rewards == (0.5, 1.0)
    assert report.summary["metrics"]["exact"]["mean"] == 1.0
    assert judge.calls == 2


async def test_judge_tokens_and_cost_are_in_the_summary_apart_from_the_agents() -> None:
    model = ScriptedModel(lambda req: "the answer")
    judge = ScriptedModel(lambda req: "fine <score>7</score>")
    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", "q")],
        score_fn=llm_judge(judge.endpoint, rubric="r"),
        show_progress=False,
    )
    report = await evaluate([{"i": i} for i in range(3)], config)
    per_sample = [s.score.get("judge").metadata["judge_usage"] for s in report.samples]  # type: ignore[union-attr]
    scoring = report.summary["scoring"]
    assert scoring["input_tokens"] == sum(u["input_tokens"] for u in per_sample) > 0
    assert scoring["output_tokens"] == sum(u["output_tokens"] for u in per_sample) > 0
    assert report.summary["tokens"]["input"] == sum(
        s.trajectory.total_usage().input_tokens  # type: ignore[union-attr]
        for s in report.samples
    )
    assert report.summary["total_cost_usd"] == report.summary["cost_usd"] + scoring["cost_usd"]
    assert "scoring (judge): tokens" in report.format()
    assert report.summary["metrics"]["judge"]["mean"] == pytest.approx(0.7)


async def test_judge_limiter_bounds_concurrent_judge_calls() -> None:
    now = peak = 0

    async def judge_reply(req: ScriptedRequest) -> str:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        await trio.sleep(0.005)
        now -= 1
        return "<score>10</score>"

    model = ScriptedModel(lambda req: "x")
    judge = ScriptedModel(judge_reply)
    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", "q")],
        score_fn=llm_judge(judge.endpoint, rubric="r", limiter=trio.CapacityLimiter(2)),
        max_concurrent=8,
        show_progress=False,
    )
    report = await evaluate([{"i": i} for i in range(10)], config)
    assert peak == 2 and judge.calls == 10
    assert report.summary["reward"]["mean"] == 1.0


async def test_a_judge_with_a_bad_key_stops_the_eval() -> None:
    from rollouts.errors import AuthenticationError

    model = ScriptedModel(lambda req: "x")
    judge = ScriptedModel(lambda req: AuthenticationError("invalid key", provider="scripted", status_code=401))
    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", "q")],
        score_fn=llm_judge(judge.endpoint, rubric="r"),
        show_progress=False,
    )
    with pytest.raises(AuthenticationError):
        await evaluate([{"i": i} for i in range(3)], config)


async def test_builtin_scorers_by_name_are_one_table_for_every_caller() -> None:
    """`--score exact_match,contains` (and the service's batches) name metrics from one library
    table; each is weighted 1 and an unknown name is refused by name."""
    score = await builtin_score_fn(["numeric_match", "contains"])(_sample("it is 42", answer="42"))
    assert [(m.name, m.value, m.weight) for m in score.metrics] == [("numeric_match", 1.0, 1.0), ("contains", 1.0, 1.0)]
    assert set(BUILTIN_METRICS) >= {"exact_match", "exact_match_tag", "boxed_match", "numeric_match", "contains"}
    with pytest.raises(ValueError, match="unknown scorer nope; built-in scorers: boxed_match, contains"):
        builtin_score_fn(["contains", "nope"])
    with pytest.raises(TypeError):
        BUILTIN_METRICS["mine"] = BUILTIN_METRICS["contains"]  # type: ignore[index]  # read-only on purpose
