"""RolloutsAdapter: candidates applied to an EvalConfig (system prompt, {{placeholders}}, tool
descriptions, an apply function), batches run through evaluate() concurrently, reflective records
with readable trajectories and feedback, and the rollout log reused on resume."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from rollouts import (
    CalculatorEnvironment,
    EvalConfig,
    Message,
    Metric,
    Sample,
    Score,
    ScriptedModel,
    ScriptedReply,
    ScriptedToolCall,
)
from rollouts.errors import ConfigurationError
from rollouts.gepa import RolloutsAdapter, render_trajectory
from rollouts.gepa.apply import ToolTextEnvironment
from rollouts.providers.scripted import ScriptedRequest


def _score(sample: Sample) -> Score:
    ok = str(sample.input.get("answer")) in sample.response
    return Score((Metric("correct", float(ok), 1.0, {"feedback": f"expected {sample.input.get('answer')}"}),))


def _echo_system() -> ScriptedModel:
    return ScriptedModel(lambda req: f"system={req.system!r} user={req.last_user_text!r}")


async def test_system_prompt_is_inserted_or_replaces_the_rows_own() -> None:
    model = _echo_system()
    adapter = RolloutsAdapter(EvalConfig(endpoint=model.endpoint, score_fn=_score, show_progress=False))
    batch = [{"question": "q1", "answer": "x"}, {"question": "q2", "system": "old", "answer": "x"}]
    out = await adapter.evaluate(batch, {"system_prompt": "NEW"})
    assert out.outputs == ["system='NEW' user='q1'", "system='NEW' user='q2'"]
    assert out.scores == [0.0, 0.0]
    assert out.feedback == ["expected x", "expected x"]
    assert out.objective_scores == [{"correct": 0.0}, {"correct": 0.0}]
    # (samples come back even without capture_traces: the evaluation cache keeps them)
    assert out.trajectories is not None and [s.response for s in out.trajectories] == out.outputs
    assert adapter.decode_trajectory(adapter.encode_trajectory(out.trajectories[0])) == out.trajectories[0]


async def test_placeholders_are_filled_in_messages() -> None:
    model = _echo_system()

    def prepare(row: dict[str, Any]) -> list[Message]:
        return [Message("user", "{{style}} | " + row["question"] + " | {{style}}")]

    cfg = EvalConfig(endpoint=model.endpoint, score_fn=_score, prepare_messages=prepare, show_progress=False)
    adapter = RolloutsAdapter(cfg)
    out = await adapter.evaluate([{"question": "q"}], {"system_prompt": "S", "style": "terse"})
    assert out.outputs == ["system='S' user='terse | q | terse'"]
    with pytest.raises(ConfigurationError, match=r"'mood'.*\{\{mood\}\}"):
        await adapter.check_candidate({"system_prompt": "S", "mood": "x"}, {"question": "q"})


async def test_tool_descriptions_come_from_the_candidate_and_tools_still_work() -> None:
    seen: list[dict[str, str]] = []

    def reply(req: ScriptedRequest) -> ScriptedReply | str:
        seen.append({t.name: t.description for t in req.tools})
        if req.messages[-1].role == "tool":
            return "The answer is 7."
        return ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 7}),))

    model = ScriptedModel(reply)
    cfg = EvalConfig(
        endpoint=model.endpoint, score_fn=_score, environment_factory=CalculatorEnvironment, show_progress=False
    )
    adapter = RolloutsAdapter(cfg)
    out = await adapter.evaluate(
        [{"question": "7?", "answer": "7"}], {"system_prompt": "S", "tool:add": "Adds. Use it."}, capture_traces=True
    )
    assert out.scores == [1.0]
    assert seen[0]["add"] == "Adds. Use it." and seen[0]["subtract"] == "Subtract a number from the current value."
    assert len(seen) == 2 and seen[1]["add"] == "Adds. Use it."  # after the tool ran (the loop cloned the env)
    records = adapter.make_reflective_dataset({}, out, ["tool:add"])["tool:add"]
    assert records[0]["Inputs"] == "7?"
    assert '[calls tool add({"value": 7})]' in records[0]["Agent trajectory"]
    assert "[tool result: add]" in records[0]["Agent trajectory"]
    assert records[0]["Score"] == "1" and records[0]["Feedback"] == "expected 7"
    with pytest.raises(ConfigurationError, match="tool:nope"):
        await RolloutsAdapter(cfg).check_candidate({"tool:nope": "x"}, {"question": "q"})


async def test_unknown_tool_component_fails_the_samples_with_a_clear_error() -> None:
    model = ScriptedModel(lambda req: "hi")
    cfg = EvalConfig(
        endpoint=model.endpoint, score_fn=_score, environment_factory=CalculatorEnvironment, show_progress=False
    )
    out = await RolloutsAdapter(cfg).evaluate([{"question": "q"}], {"tool:nope": "x"}, capture_traces=True)
    assert out.scores == [0.0]
    assert out.feedback is not None and "tool:nope" in out.feedback[0] and "did not complete" in out.feedback[0]
    no_env = replace(cfg, environment_factory=None)
    with pytest.raises(ConfigurationError, match="no environment_factory"):
        RolloutsAdapter(no_env).config_for({"tool:add": "x"})


async def test_tool_text_environment_round_trips() -> None:
    env = ToolTextEnvironment(CalculatorEnvironment(3.0), {"add": "ADD"})
    clone = await ToolTextEnvironment.deserialize(json.loads(json.dumps(await env.serialize())))
    assert [t.description for t in clone.get_tools() if t.name == "add"] == ["ADD"]
    assert await clone.inner.serialize() == await env.inner.serialize()


async def test_apply_function_takes_over() -> None:
    model = _echo_system()

    def apply(cfg: EvalConfig, cand: dict[str, str]) -> EvalConfig:
        return replace(cfg, prepare_messages=lambda row: [Message("user", cand["anything"] + row["question"])])

    adapter = RolloutsAdapter(EvalConfig(endpoint=model.endpoint, score_fn=_score, show_progress=False), apply=apply)
    out = await adapter.evaluate([{"question": "?"}], {"anything": "A"})
    assert out.outputs == ["system='' user='A?'"]


async def test_failed_sample_feedback_is_its_error() -> None:
    def broken(sample: Sample) -> Score:
        raise ValueError("the scorer broke")

    model = ScriptedModel(lambda req: "hi")
    adapter = RolloutsAdapter(EvalConfig(endpoint=model.endpoint, score_fn=broken, show_progress=False))
    out = await adapter.evaluate([{"question": "q"}], {"system_prompt": "S"}, capture_traces=True)
    assert out.scores == [0.0]
    record = adapter.make_reflective_dataset({}, out, ["system_prompt"])["system_prompt"][0]
    assert "did not complete (failed)" in record["Feedback"] and "the scorer broke" in record["Feedback"]


async def test_needs_a_score_function() -> None:
    with pytest.raises(ConfigurationError, match="score_fn"):
        RolloutsAdapter(EvalConfig(endpoint=ScriptedModel(["x"]).endpoint))


async def test_rollout_log_reuses_finished_samples(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: f"echo {req.last_user_text}")
    cfg = EvalConfig(endpoint=model.endpoint, score_fn=_score, show_progress=False)
    log = tmp_path / "rollouts.jsonl"
    batch = [{"question": "a", "answer": "a"}, {"question": "b", "answer": "z"}]
    first = RolloutsAdapter(cfg, log_path=log)
    out1 = await first.evaluate(batch, {"system_prompt": "S"}, capture_traces=True, eval_id="e1")
    first.close()
    assert model.calls == 2
    second = RolloutsAdapter(cfg, log_path=log)
    out2 = await second.evaluate(batch, {"system_prompt": "S"}, capture_traces=True, eval_id="e1")
    assert model.calls == 2  # read back, not run again
    assert out2.scores == out1.scores == [1.0, 0.0] and out2.outputs == out1.outputs
    await second.evaluate(batch, {"system_prompt": "other"}, eval_id="e1")  # another candidate: runs
    await second.evaluate([*batch[:1], {"question": "c"}], {"system_prompt": "S"}, eval_id="e1")  # a changed row
    second.close()
    assert model.calls == 2 + 2 + 1


async def test_rollout_log_survives_a_torn_last_line(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "x")
    cfg = EvalConfig(endpoint=model.endpoint, score_fn=_score, show_progress=False)
    log = tmp_path / "rollouts.jsonl"
    batch = [{"question": "a"}, {"question": "b"}]
    first = RolloutsAdapter(cfg, log_path=log)
    await first.evaluate(batch, {"system_prompt": "S"}, eval_id="e")
    first.close()
    with log.open("a") as f:
        f.write('{"eval": "e", "pos"')  # a crash mid-write
    second = RolloutsAdapter(cfg, log_path=log)
    await second.evaluate(batch, {"system_prompt": "S"}, eval_id="e")
    second.close()
    assert model.calls == 2
    assert [json.loads(line)["pos"] for line in log.read_text().splitlines()] in ([0, 1], [1, 0])


async def test_concurrent_evaluations_share_the_model_call_limit() -> None:
    in_flight = peak = 0

    async def reply(req: ScriptedRequest) -> str:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(0.01)
        in_flight -= 1
        return "ok"

    model = ScriptedModel(reply)
    cfg = EvalConfig(endpoint=model.endpoint, score_fn=_score, max_concurrent=10, max_concurrent_model_calls=3)
    adapter = RolloutsAdapter(replace(cfg, show_progress=False))
    rows = [{"question": str(i)} for i in range(6)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(adapter.evaluate, rows, {"system_prompt": "a"})
        nursery.start_soon(adapter.evaluate, rows, {"system_prompt": "b"})
    assert model.calls == 12 and peak == 3


def test_render_trajectory_clips_long_text() -> None:
    msgs = [Message("system", "hidden"), Message("user", "u" * 50), Message("assistant", "a" * 5000)]
    text = render_trajectory(msgs, per_message_chars=100, total_chars=10_000)
    assert "hidden" not in text and "[user]\n" + "u" * 50 in text
    assert "characters left out" in text and len(text) < 400
