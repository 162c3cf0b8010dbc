"""evaluate() on scripted models: order, ids, concurrency limits, failure isolation, retries,
time limits, laziness, callbacks, summaries and the progress bar."""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel

from rollouts import (
    AgentState,
    CalculatorEnvironment,
    EnvironmentBase,
    EvalConfig,
    Message,
    Metric,
    RunConfig,
    Sample,
    Score,
    ScriptedModel,
    ScriptedReply,
    ScriptedToolCall,
    Tool,
    ToolCall,
    ToolResult,
    Usage,
    evaluate,
    evaluate_sample,
    tool_call,
)
from rollouts.errors import AuthenticationError, ConfigurationError, ProviderError
from rollouts.eval.progress import ProgressBar
from rollouts.eval.summary import flat_summary, group_samples, summarize, summarize_groups
from rollouts.events import TextDelta
from rollouts.providers.scripted import ScriptedRequest


def _prepare(row: dict[str, Any]) -> list[Message]:
    return [Message("user", str(row["q"]))]


def _echo_model(latency_s: float = 0.0) -> ScriptedModel:
    return ScriptedModel(lambda req: f"answer {req.last_user_text}", latency_s=latency_s)


def _correct(sample: Sample) -> Score:
    ok = sample.response == f"answer {sample.input['q']}"
    return Score((Metric("correct", float(ok), weight=1.0), Metric("length", float(len(sample.response)))))


def _config(model: ScriptedModel, **kw: Any) -> EvalConfig:
    kw.setdefault("prepare_messages", _prepare)
    kw.setdefault("score_fn", _correct)
    kw.setdefault("show_progress", False)
    return EvalConfig(endpoint=model.endpoint, **kw)


class _InFlight:
    """Counts concurrent entries (peak and current)."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def exit(self) -> None:
        self.now -= 1


# --------------------------------------------------------------------------------------------
# Order and ids
# --------------------------------------------------------------------------------------------


async def test_results_in_dataset_order_whatever_the_completion_order() -> None:
    n = 12
    ended = [trio.Event() for _ in range(n)]

    async def reply(req: ScriptedRequest) -> str:
        i = int(req.last_user_text)
        if i + 1 < n:
            await ended[i + 1].wait()  # later rows finish first (ordered by events, not by timing)
        return f"answer {i}"

    finished: list[str] = []

    def on_end(s: Sample) -> None:
        finished.append(s.id)
        ended[int(s.id)].set()

    model = ScriptedModel(reply)
    report = await evaluate([{"q": i} for i in range(n)], _config(model, max_concurrent=n, on_sample_end=on_end))
    assert [s.id for s in report.samples] == [str(i) for i in range(n)]
    assert finished != [str(i) for i in range(n)], "completion order should differ from dataset order"
    assert finished[0] == str(n - 1)
    assert [s.input["q"] for s in report.samples] == list(range(n))
    assert all(s.status == "completed" and s.reward == 1.0 for s in report.samples)
    assert report.status == "completed"


async def test_sample_ids_come_from_the_row_id_else_its_index() -> None:
    model = _echo_model()
    rows = [{"id": "alpha", "q": 1}, {"q": 2}, {"id": 7, "q": 3}]
    report = await evaluate(rows, _config(model))
    assert [s.id for s in report.samples] == ["alpha", "1", "7"]
    assert report.get("7") is not None and report.get("7").input["q"] == 3  # type: ignore[union-attr]


async def test_duplicate_ids_are_a_clear_error() -> None:
    model = _echo_model()
    with pytest.raises(ConfigurationError, match="same id 'a'"):
        await evaluate([{"id": "a", "q": 1}, {"id": "a", "q": 2}], _config(model))


async def test_a_row_that_is_not_a_dict_is_a_clear_error() -> None:
    model = _echo_model()
    with pytest.raises(ConfigurationError, match="row 1 is a str"):
        await evaluate([{"q": 1}, "oops"], _config(model))  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="row 1 is a NoneType"):  # not a silent end of the data
        await evaluate([{"q": 1}, None, {"q": 2}], _config(model))  # type: ignore[list-item]


async def test_max_samples_takes_the_first_rows() -> None:
    model = _echo_model()
    report = await evaluate(({"q": i} for i in range(100)), _config(model, max_samples=5))
    assert [s.id for s in report.samples] == ["0", "1", "2", "3", "4"]
    assert model.calls == 5


async def test_async_iterable_dataset() -> None:
    async def rows() -> Any:
        for i in range(4):
            await trio.lowlevel.checkpoint()
            yield {"q": i}

    model = _echo_model()
    report = await evaluate(rows(), _config(model, max_concurrent=2))
    assert [s.id for s in report.samples] == ["0", "1", "2", "3"]
    assert report.summary["reward"]["mean"] == 1.0


# --------------------------------------------------------------------------------------------
# Concurrency
# --------------------------------------------------------------------------------------------


async def test_max_concurrent_bounds_samples_in_flight(autojump_clock: Any) -> None:
    flight = _InFlight()

    async def reply(req: ScriptedRequest) -> str:
        flight.enter()
        try:
            await trio.sleep(0.01)  # virtual time: the 6th sample starts before the 1st one's call ends
        finally:
            flight.exit()
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    report = await evaluate([{"q": i} for i in range(40)], _config(model, max_concurrent=6))
    assert flight.peak == 6
    assert report.summary["counts"]["completed"] == 40


class _SlowToolEnv(EnvironmentBase):
    """One tool that sleeps; in-flight executions are counted on the class."""

    flight = _InFlight()
    both = _InFlight()  # model calls + tool executions at once

    def get_tools(self) -> tuple[Tool, ...]:
        return (Tool("work", "does slow work", {"type": "object", "properties": {}}),)

    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        type(self).flight.enter()
        type(self).both.enter()
        try:
            await trio.sleep(0.02)
        finally:
            type(self).flight.exit()
            type(self).both.exit()
        return ToolResult(tool_call.id, "worked")


async def test_model_call_and_tool_limits_are_separate_and_respected() -> None:
    model_flight = _InFlight()
    _SlowToolEnv.flight = _InFlight()
    _SlowToolEnv.both = _InFlight()

    async def reply(req: ScriptedRequest) -> Any:
        model_flight.enter()
        _SlowToolEnv.both.enter()
        try:
            await trio.sleep(0.01)
        finally:
            model_flight.exit()
            _SlowToolEnv.both.exit()
        if req.messages[-1].role == "tool":
            return f"answer {req.last_user_text}"
        return tool_call("work")

    model = ScriptedModel(reply)
    config = _config(
        model,
        max_concurrent=10,
        max_concurrent_model_calls=2,
        max_concurrent_tools=3,
        environment_factory=_SlowToolEnv,
    )
    report = await evaluate([{"q": i} for i in range(30)], config)
    assert report.summary["counts"]["completed"] == 30
    assert model.calls == 60
    assert model_flight.peak == 2
    assert _SlowToolEnv.flight.peak == 3
    # A sample running a tool holds no model-call slot: more than 2 things ran at once.
    assert _SlowToolEnv.both.peak > 2
    assert report.summary["turns"]["mean"] == 2


async def test_lazy_dataset_is_pulled_only_as_slots_free_up() -> None:
    pulled = 0
    finished = 0
    max_ahead = 0
    max_concurrent = 4

    def rows() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for i in range(1000):
            pulled += 1
            yield {"q": i}

    def on_start(sample_id: str, row: Any) -> None:
        nonlocal max_ahead
        max_ahead = max(max_ahead, pulled - finished)

    def on_end(sample: Sample) -> None:
        nonlocal finished
        finished += 1

    model = _echo_model(latency_s=0.0005)
    gen = rows()
    config = _config(
        model, max_concurrent=max_concurrent, max_samples=200, on_sample_start=on_start, on_sample_end=on_end
    )
    report = await evaluate(gen, config)
    assert len(report.samples) == 200
    assert pulled == 200, "max_samples stops pulling rows"
    assert max_ahead <= max_concurrent
    # the rest of the generator is still there, untouched
    assert next(gen) == {"q": 200}

    pulled = finished = max_ahead = 0
    report = await evaluate(
        rows(), _config(model, max_concurrent=max_concurrent, on_sample_start=on_start, on_sample_end=on_end)
    )
    assert pulled == 1000 and len(report.samples) == 1000
    assert max_ahead <= max_concurrent


async def test_fresh_environment_per_sample_with_tools() -> None:
    def reply(req: ScriptedRequest) -> Any:
        n = int(req.last_user_text)
        tool_msgs = [m for m in req.messages if m.role == "tool"]
        if not tool_msgs:
            return tool_call("add", value=n)
        return ScriptedReply("done", (ScriptedToolCall("complete_task", {"final_result": tool_msgs[-1].text}),))

    model = ScriptedModel(reply)
    seen: list[Any] = []

    def factory(row: dict[str, Any]) -> CalculatorEnvironment:
        env = CalculatorEnvironment()
        seen.append(env)
        return env

    def score(sample: Sample) -> Score:
        tool_texts = [m.text for m in sample.trajectory.messages if m.role == "tool"]  # type: ignore[union-attr]
        return Score((Metric("adds_from_zero", float(str(sample.input["q"]) in tool_texts[0]), weight=1.0),))

    report = await evaluate(
        [{"q": i} for i in range(1, 9)], _config(model, environment_factory=factory, score_fn=score)
    )
    assert len(seen) == 8 and len({id(e) for e in seen}) == 8
    assert report.summary["reward"]["mean"] == 1.0, [s.trajectory for s in report.samples if s.reward < 1]


# --------------------------------------------------------------------------------------------
# Failure isolation
# --------------------------------------------------------------------------------------------


def _raise_on(row_q: int, exc: Exception) -> Any:
    def check(value: Any) -> None:
        if value == row_q:
            raise exc

    return check


@pytest.mark.parametrize(
    "hook",
    [
        "prepare_messages",
        "environment_factory",
        "agent",
        "score_fn",
        "on_sample_start",
        "on_sample_end",
        "on_sample_event",
    ],
)
async def test_an_exception_in_one_hook_fails_only_that_sample(hook: str) -> None:
    bad = 3

    def prepare(row: dict[str, Any]) -> list[Message]:
        if hook == "prepare_messages" and row["q"] == bad:
            raise KeyError("question")
        return _prepare(row)

    def factory(row: dict[str, Any]) -> EnvironmentBase:
        if hook == "environment_factory" and row["q"] == bad:
            raise OSError("no sandbox")
        return EnvironmentBase()

    def reply(req: ScriptedRequest) -> str:
        if hook == "agent" and req.last_user_text == str(bad):
            raise RuntimeError("model bug")
        return f"answer {req.last_user_text}"

    async def score(sample: Sample) -> Score:
        if hook == "score_fn" and sample.input["q"] == bad:
            raise ZeroDivisionError("bad metric")
        return _correct(sample)

    def on_start(sid: str, row: Any) -> None:
        if hook == "on_sample_start" and row["q"] == bad:
            raise ValueError("start hook")

    def on_end(sample: Sample) -> None:
        if hook == "on_sample_end" and sample.input["q"] == bad:
            raise ValueError("end hook")

    async def on_event(sid: str, event: Any) -> None:
        if hook == "on_sample_event" and sid == str(bad) and isinstance(event, TextDelta):
            raise ValueError("event hook")

    model = ScriptedModel(reply)
    config = _config(
        model,
        prepare_messages=prepare,
        environment_factory=factory,
        score_fn=score,
        on_sample_start=on_start,
        on_sample_end=on_end,
        on_sample_event=on_event,
        max_concurrent=3,
    )
    report = await evaluate([{"q": i} for i in range(8)], config)
    failed = [s for s in report.samples if s.status != "completed"]
    assert [s.id for s in failed] == [str(bad)]
    assert failed[0].status == "failed"
    assert failed[0].error is not None and failed[0].error.startswith(hook if hook != "agent" else "agent:")
    assert "traceback" in failed[0].metadata
    assert report.summary["counts"] == {"total": 8, "completed": 7, "failed": 1, "provider_error": 0, "pending": 0}
    assert all(s.reward == 1.0 for s in report.samples if s.status == "completed")


async def test_score_fn_returning_a_non_score_fails_the_sample() -> None:
    model = _echo_model()
    report = await evaluate([{"q": 1}], _config(model, score_fn=lambda s: 1.0))
    assert report.samples[0].status == "failed"
    assert "must return a Score" in (report.samples[0].error or "")


async def test_sync_and_async_score_functions_give_the_same_result() -> None:
    async def async_score(sample: Sample) -> Score:
        await trio.lowlevel.checkpoint()
        return _correct(sample)

    rows = [{"q": i} for i in range(5)]
    sync_report = await evaluate(rows, _config(_echo_model(), score_fn=_correct))
    async_report = await evaluate(rows, _config(_echo_model(), score_fn=async_score))
    assert [s.score for s in sync_report.samples] == [s.score for s in async_report.samples]
    assert sync_report.summary["metrics"] == async_report.summary["metrics"]
    assert async_report.summary["reward"]["mean"] == 1.0


async def test_async_prepare_messages_and_environment_factory() -> None:
    async def prepare(row: dict[str, Any]) -> list[Message]:
        await trio.lowlevel.checkpoint()
        return _prepare(row)

    async def factory() -> EnvironmentBase:
        await trio.lowlevel.checkpoint()
        return EnvironmentBase()

    report = await evaluate(
        [{"q": 1}, {"q": 2}], _config(_echo_model(), prepare_messages=prepare, environment_factory=factory)
    )
    assert report.summary["reward"]["mean"] == 1.0


async def test_no_score_fn_means_unscored_completed_samples() -> None:
    report = await evaluate([{"q": 1}], _config(_echo_model(), score_fn=None))
    s = report.samples[0]
    assert s.status == "completed" and s.score is None and s.response == "answer 1"
    assert report.summary["reward"]["n"] == 0


# --------------------------------------------------------------------------------------------
# Provider errors, authentication, time limits, cancellation
# --------------------------------------------------------------------------------------------


async def test_provider_errors_are_retried_with_backoff_then_recorded() -> None:
    attempts: dict[str, int] = {}

    def reply(req: ScriptedRequest) -> Any:
        q = req.last_user_text
        attempts[q] = attempts.get(q, 0) + 1
        if q == "flaky" and attempts[q] == 1:
            return ProviderError("overloaded", provider="scripted", status_code=529, retryable=True)
        if q == "down":
            return ProviderError("service unavailable", provider="scripted", status_code=503, retryable=True)
        return f"answer {q}"

    model = ScriptedModel(reply)
    config = _config(model, provider_error_retries=2, retry_backoff_s=0.001, retry_backoff_max_s=0.002)
    report = await evaluate([{"q": "ok"}, {"q": "flaky"}, {"q": "down"}], config)
    ok, flaky, down = report.samples
    assert ok.status == "completed" and ok.metadata["attempts"] == 1
    assert flaky.status == "completed" and flaky.metadata["attempts"] == 2 and flaky.reward == 1.0
    # the continued run keeps one conversation: user, assistant (no duplicate user message)
    assert [m.role for m in flaky.trajectory.messages] == ["user", "assistant"]  # type: ignore[union-attr]
    assert down.status == "provider_error" and down.metadata["attempts"] == 3
    assert attempts["down"] == 3
    assert "service unavailable" in (down.error or "")
    assert down.score is None
    assert report.summary["counts"]["provider_error"] == 1


async def test_authentication_error_stops_the_whole_eval(tmp_path: Path) -> None:
    def reply(req: ScriptedRequest) -> Any:
        if req.last_user_text == "2":
            return AuthenticationError("invalid api key", provider="scripted", status_code=401)
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    with pytest.raises(AuthenticationError):
        await evaluate([{"q": i} for i in range(5)], _config(model, max_concurrent=1, output_dir=tmp_path))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "failed"
    assert "AuthenticationError" in report["error"]
    assert report["summary"]["counts"]["completed"] == 2


async def test_sample_time_limit_fails_only_the_slow_sample_and_keeps_its_partial_trajectory(
    autojump_clock: Any,  # virtual time: the fast sample is done within 0.5 s however loaded the machine
) -> None:
    async def reply(req: ScriptedRequest) -> Any:
        if req.last_user_text == "slow" and req.messages[-1].role == "tool":
            await trio.sleep(10)
        if req.messages[-1].role == "user":
            return tool_call("add", value=1)
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    config = _config(model, environment_factory=CalculatorEnvironment, sample_timeout_s=0.5)
    with trio.fail_after(5):
        report = await evaluate([{"q": "fast"}, {"q": "slow"}], config)
    fast, slow = report.samples
    assert fast.status == "completed"
    assert slow.status == "failed" and "timed out after 0.5s" in (slow.error or "")
    assert slow.stop_reason == "aborted"
    roles = [m.role for m in slow.trajectory.messages]  # type: ignore[union-attr]
    assert roles == ["user", "assistant", "tool"]


async def test_slow_score_fn_hits_the_time_limit(autojump_clock: Any) -> None:  # virtual time: see above
    async def score(sample: Sample) -> Score:
        await trio.sleep(10)
        raise AssertionError("unreachable")

    with trio.fail_after(5):
        report = await evaluate([{"q": 1}], _config(_echo_model(), score_fn=score, sample_timeout_s=0.2))
    assert report.samples[0].status == "failed"
    assert "while scoring" in (report.samples[0].error or "")
    assert report.samples[0].response == "answer 1"


async def test_cancellation_propagates_and_writes_the_report(tmp_path: Path, autojump_clock: Any) -> None:
    # Virtual time: rows 0-2 are done before the 0.3 s cancel however loaded the machine.
    async def reply(req: ScriptedRequest) -> str:
        if int(req.last_user_text) >= 3:
            await trio.sleep(10)
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    config = _config(model, max_concurrent=8, output_dir=tmp_path)
    with trio.move_on_after(0.3) as scope:
        await evaluate([{"q": i} for i in range(8)], config)
        raise AssertionError("evaluate should have been cancelled")
    assert scope.cancelled_caught
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "cancelled"
    assert report["summary"]["counts"]["completed"] == 3
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == ["0", "1", "2"]


async def test_cancelling_inside_a_score_fn_is_not_recorded_as_a_failure(tmp_path: Path) -> None:
    outer = trio.CancelScope()

    async def score(sample: Sample) -> Score:
        outer.cancel()
        await trio.sleep(1)
        return _correct(sample)

    with outer:
        await evaluate([{"q": 1}], _config(_echo_model(), score_fn=score, output_dir=tmp_path))
    assert outer.cancelled_caught
    assert (tmp_path / "samples.jsonl").read_text() == ""
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "cancelled"


# --------------------------------------------------------------------------------------------
# evaluate_sample, callbacks
# --------------------------------------------------------------------------------------------


async def test_evaluate_sample_alone_with_a_given_environment() -> None:
    model = ScriptedModel([tool_call("add", value=4), "answer x"])
    env = CalculatorEnvironment()
    sample = await evaluate_sample({"q": "x"}, "s1", _config(model), environment=env)
    assert sample.id == "s1" and sample.status == "completed" and sample.reward == 1.0
    assert sample.metadata["turns"] == 2
    assert sample.metadata["usage"]["input_tokens"] > 0
    assert [m.role for m in sample.trajectory.messages] == ["user", "assistant", "tool", "assistant"]  # type: ignore[union-attr]


async def test_on_sample_event_sees_each_samples_stream_events() -> None:
    seen: dict[str, str] = {}

    def on_event(sid: str, event: Any) -> None:
        if isinstance(event, TextDelta):
            seen[sid] = seen.get(sid, "") + event.delta

    report = await evaluate([{"q": i} for i in range(4)], _config(_echo_model(), on_sample_event=on_event))
    assert seen == {s.id: s.response for s in report.samples}


async def test_default_prepare_messages_reads_prompt_question_or_messages() -> None:
    model = ScriptedModel(lambda req: f"{req.system}|{req.last_user_text}")
    rows = [
        {"prompt": "p"},
        {"question": "q", "system": "sys"},
        {"messages": [{"role": "system", "content": "s2"}, {"role": "user", "content": "m"}]},
        {"nothing": 1},
    ]
    report = await evaluate(rows, EvalConfig(endpoint=model.endpoint, show_progress=False))
    assert [s.response for s in report.samples[:3]] == ["|p", "sys|q", "s2|m"]
    assert report.samples[3].status == "failed"
    error = report.samples[3].error or ""
    assert "'input' field, or your own row -> messages function (--prepare MODULE:FUNCTION" in error
    assert "prepare_messages= in EvalConfig or GRPOConfig" in error


def test_config_validation_names_the_field() -> None:
    import dataclasses

    ep = ScriptedModel(["x"]).endpoint
    with pytest.raises(dataclasses.FrozenInstanceError):
        EvalConfig(endpoint=ep).max_concurrent = 3  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="must be an Endpoint"):
        EvalConfig(endpoint="openai/gpt-4")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_concurrent_model_calls"):
        EvalConfig(endpoint=ep, max_concurrent_model_calls=0)
    with pytest.raises(ConfigurationError, match="max_samples"):
        EvalConfig(endpoint=ep, max_samples=-1)
    with pytest.raises(ConfigurationError, match="max_concurrent"):
        EvalConfig(endpoint=ep, max_concurrent=0)
    with pytest.raises(ConfigurationError, match="sample_timeout_s"):
        EvalConfig(endpoint=ep, sample_timeout_s=-1)
    with pytest.raises(ConfigurationError, match="provider_error_retries"):
        EvalConfig(endpoint=ep, provider_error_retries=1000)
    with pytest.raises(ConfigurationError, match="cancel_scope"):
        EvalConfig(endpoint=ep, run_config=RunConfig(cancel_scope=trio.CancelScope()))


async def test_max_turns_bounds_each_sample() -> None:
    model = ScriptedModel(lambda req: tool_call("add", value=1))
    report = await evaluate(
        [{"q": 1}], _config(model, environment_factory=CalculatorEnvironment, max_turns=3, score_fn=None)
    )
    s = report.samples[0]
    assert s.stop_reason == "max_turns" and s.metadata["turns"] == 3 and model.calls == 3


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def _sample(i: int, status: str = "completed", correct: float = 1.0, level: str = "easy") -> Sample:
    from rollouts.dtypes import Trajectory

    usage = Usage(input_tokens=10 * i, output_tokens=i, cost_usd=0.001 * i)
    traj = Trajectory((Message("user", "q"), Message("assistant", "a", usage=usage)))
    score = Score((Metric("correct", correct, weight=1.0), Metric("len", float(i)))) if status == "completed" else None
    return Sample(
        id=str(i),
        input={"level": level},
        trajectory=traj,
        score=score,
        status=status,  # type: ignore[arg-type]
        metadata={"turns": i % 3 + 1},
    )


def test_summary_statistics_match_the_definitions() -> None:
    samples = [_sample(i, correct=float(i % 2), level="easy" if i < 5 else "hard") for i in range(1, 9)]
    samples.append(_sample(9, status="failed"))
    samples.append(_sample(10, status="provider_error"))
    s = summarize(samples)
    assert s["counts"] == {"total": 10, "completed": 8, "failed": 1, "provider_error": 1, "pending": 0}
    lens = [float(i) for i in range(1, 9)]
    assert s["metrics"]["len"]["mean"] == statistics.fmean(lens)
    assert math.isclose(s["metrics"]["len"]["std"], statistics.pstdev(lens))
    assert s["metrics"]["len"]["min"] == 1 and s["metrics"]["len"]["max"] == 8
    assert s["reward"]["mean"] == 0.5 and s["reward"]["n"] == 8
    assert s["reward_all"]["mean"] == 0.4 and s["reward_all"]["n"] == 10
    assert s["tokens"]["input"] == 10 * sum(range(1, 11)) and s["tokens"]["output"] == sum(range(1, 11))
    assert math.isclose(s["cost_usd"], 0.001 * 55)
    assert s["turns"]["total"] == sum(i % 3 + 1 for i in range(1, 11))
    flat = flat_summary(s)
    assert flat["mean_reward"] == 0.5 and flat["len_max"] == 8 and flat["n_failed"] == 1

    groups = group_samples(samples, "level")
    assert {k: len(v) for k, v in groups.items()} == {"easy": 6, "hard": 4}
    by = summarize_groups(samples, "level")
    assert by["easy"]["metrics"]["len"]["mean"] == 2.5
    assert by["easy"]["counts"]["failed"] == 1 and by["hard"]["counts"]["failed"] == 0
    by_status = summarize_groups(samples, lambda x: x.status)
    assert set(by_status) == {"completed", "failed", "provider_error"}


def test_summary_of_nothing() -> None:
    s = summarize([])
    assert s["counts"]["total"] == 0 and s["reward"]["mean"] is None and s["metrics"] == {}


async def test_report_summary_metrics_flat_view() -> None:
    report = await evaluate([{"q": i} for i in range(3)], _config(_echo_model()))
    assert report.summary_metrics["mean_reward"] == 1.0
    assert report.summary_metrics["correct_mean"] == 1.0
    assert report.rewards == (1.0, 1.0, 1.0)
    assert "reward: mean 1.0000" in report.format()


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_tty_only() -> None:
    tty = _Tty()
    bar = ProgressBar(4, stream=tty, min_interval_s=0)
    bar.update(_sample(1))
    bar.update(_sample(2, status="failed"))
    text = tty.getvalue()
    assert "\r" in text and "2/4" in text and "err 1" in text and "reward 1.000" in text and "ETA" in text
    bar.close()
    assert tty.getvalue().endswith("\n")

    pipe = io.StringIO()
    bar = ProgressBar(4, stream=pipe, min_interval_s=0)
    bar.update(_sample(1))
    bar.close()
    assert pipe.getvalue() == ""

    unknown = ProgressBar(None, stream=_Tty(), min_interval_s=0)
    unknown.update(_sample(1))
    assert "1 done" in unknown.line()


async def test_show_progress_false_draws_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    await evaluate([{"q": 1}], _config(_echo_model(), show_progress=False))
    assert capsys.readouterr().err == ""


async def test_concurrent_evaluations_can_share_one_model_limiter() -> None:
    flight = _InFlight()

    async def reply(req: ScriptedRequest) -> str:
        flight.enter()
        try:
            await trio.sleep(0.005)
        finally:
            flight.exit()
        return f"answer {req.last_user_text}"

    shared = RunConfig(model_limiter=trio.CapacityLimiter(3))
    model = ScriptedModel(reply)
    reports: list[Any] = []

    async def one(name: str) -> None:
        config = _config(model, run_config=shared, max_concurrent=10, eval_name=name)
        reports.append(await evaluate([{"q": i} for i in range(20)], config))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, "a")
        nursery.start_soon(one, "b")
    assert flight.peak == 3
    assert [r.summary["counts"]["completed"] for r in reports] == [20, 20]


async def test_context_too_long_is_a_scored_result_not_a_failure() -> None:
    from rollouts.errors import ContextTooLongError

    def reply(req: ScriptedRequest) -> Any:
        if req.last_user_text == "long":
            return ContextTooLongError("prompt is too long", provider="scripted", status_code=400)
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    report = await evaluate([{"q": "long"}, {"q": "short"}], _config(model, retry_backoff_s=0.001))
    long, short = report.samples
    assert long.status == "completed" and long.stop_reason == "context_too_long" and long.reward == 0.0
    assert long.metadata["attempts"] == 1
    assert short.reward == 1.0


async def test_progress_bar_in_evaluate_only_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    await evaluate([{"q": i} for i in range(3)], _config(_echo_model(), show_progress=True))
    assert pipe.getvalue() == ""

    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    await evaluate([{"q": i} for i in range(3)], _config(_echo_model(), show_progress=True, eval_name="demo"))
    out = tty.getvalue()
    assert out.startswith("\r") and out.endswith("\n")
    final = out.rstrip("\n").split("\r")[-1]
    assert final.startswith("demo") and "3/3" in final and "100%" in final and "reward 1.000" in final


async def test_progress_line_stays_live_while_no_sample_finishes(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: Any
) -> None:
    async def slow(req: ScriptedRequest) -> str:
        await trio.sleep(5)  # virtual time: the autojump clock skips ahead
        return f"answer {req.last_user_text}"

    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    await evaluate([{"q": 1}], _config(ScriptedModel(slow), show_progress=True))
    draws = tty.getvalue().split("\r")[1:]
    waiting = [d for d in draws if "0/1" in d]
    assert len(waiting) >= 4, draws
    assert "1/1" in draws[-1]


async def test_empty_dataset_and_zero_max_samples(tmp_path: Any) -> None:
    model = _echo_model()
    for rows, kw in (([], {}), ([{"q": 1}], {"max_samples": 0})):
        report = await evaluate(rows, _config(model, output_dir=tmp_path, **kw))
        assert report.samples == () and report.status == "completed"
        assert report.summary["counts"]["total"] == 0
    assert model.calls == 0
