"""Issue 13 item 1: eval resume reuses a recorded sample only when everything that changes its
outcome is the same (endpoint with sampling and extra params, prepared messages, environment,
max turns, score function); otherwise a clear error naming what changed and the ways out
(another output dir, rescore, overwrite). GEPA's rollout reuse rests on the same fingerprint."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli_support import FAKE_KEYS, cli_env, run_cli

from rollouts import CalculatorEnvironment, EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.environments.basic import BasicEnvironment
from rollouts.errors import ConfigurationError
from rollouts.eval.fingerprint import callable_identity, task_fingerprint
from rollouts.eval.resume import ResumeMismatch
from rollouts.gepa import RolloutsAdapter, optimize

ROWS = [{"id": "a", "question": "what is 2 + 3?", "answer": "5"}, {"id": "b", "question": "say hi", "answer": "hi"}]


def _contains(sample: Sample) -> Score:
    return Score((Metric("contains", float(str(sample.ground_truth) in sample.response), 1.0),))


def _exact(sample: Sample) -> Score:
    return Score((Metric("exact", float(str(sample.ground_truth) == sample.response), 1.0),))


def _prepare_with(system: str) -> Any:
    def prepare(row: dict[str, Any]) -> list[Message]:
        return [Message("system", system), Message("user", row["question"])]

    return prepare


def _config(model: ScriptedModel, out: Path, **kw: Any) -> EvalConfig:
    kw.setdefault("prepare_messages", _prepare_with("A"))
    kw.setdefault("score_fn", _contains)
    return EvalConfig(endpoint=kw.pop("endpoint", model.endpoint), output_dir=out, show_progress=False, **kw)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------------------------
# The reproduction from the issue, through the real command
# --------------------------------------------------------------------------------------------


def test_eval_resume_fingerprint_cli_other_system_prompt_and_scorer_is_refused_not_reused(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = cli_env(tmp_path)
    base = ("eval", "data.jsonl", "-m", "scripted/echo", "--no-progress", "--output", "out")
    first = run_cli(*base, "--system-prompt", "A", "--score", "contains", tmp=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    recorded = (tmp_path / "out" / "samples.jsonl").read_text()

    second = run_cli(*base, "--system-prompt", "B", "--score", "exact_match", tmp=tmp_path, env=env)
    assert second.returncode == 2, second.stdout + second.stderr
    assert "reused" not in second.stdout
    err = second.stderr
    assert "score function" in err and "prepared messages" in err and "--rescore" not in err, err
    assert "another output_dir" in err and "--overwrite" in err
    assert (tmp_path / "out" / "samples.jsonl").read_text() == recorded  # nothing mixed in

    # only the scorer changed: refused too, and --rescore is offered and works without model calls
    log = tmp_path / "calls.log"
    env3 = cli_env(tmp_path, ROLLOUTS_SCRIPTED_CALL_LOG=str(log))
    third = run_cli(*base, "--system-prompt", "A", "--score", "exact_match", tmp=tmp_path, env=env3)
    assert third.returncode == 2 and "score function" in third.stderr and "--rescore" in third.stderr
    fourth = run_cli(*base, "--system-prompt", "A", "--score", "exact_match", "--rescore", tmp=tmp_path, env=env3)
    assert fourth.returncode == 0, fourth.stderr
    assert not log.exists() or log.read_text() == ""  # no model call
    assert "rescored 2" in fourth.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert list(report["summary"]["metrics"]) == ["exact_match"]

    fifth = run_cli(*base, "--system-prompt", "B", "--score", "exact_match", "--overwrite", tmp=tmp_path, env=env3)
    assert fifth.returncode == 0, fifth.stderr
    assert "reused 0" in fifth.stdout and len(log.read_text().splitlines()) == 2


def test_eval_resume_fingerprint_cli_default_dirs_differ_per_setting(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = cli_env(tmp_path)
    base = ("eval", "data.jsonl", "-m", "scripted/echo", "--no-progress")
    for prompt in ("A", "B", "A"):
        r = run_cli(*base, "--system-prompt", prompt, "--score", "contains", tmp=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
    dirs = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(dirs) == 2 and all(d.startswith("data-scripted-echo-") for d in dirs)
    assert "reused 2" in r.stdout  # the third run found the first one's directory


# --------------------------------------------------------------------------------------------
# Every part of the fingerprint, through the Python API
# --------------------------------------------------------------------------------------------


def _with_temperature(cfg: EvalConfig) -> EvalConfig:
    return replace(cfg, endpoint=replace(cfg.endpoint, temperature=0.9))


def _with_extra_params(cfg: EvalConfig) -> EvalConfig:
    return replace(cfg, endpoint=replace(cfg.endpoint, extra_params={"top_k": 5}))


CHANGES = {
    "temperature": (_with_temperature, "model endpoint"),
    "extra_params": (_with_extra_params, "model endpoint"),
    "system prompt": (lambda c: replace(c, prepare_messages=_prepare_with("B")), "prepared messages"),
    "environment": (lambda c: replace(c, environment_factory=BasicEnvironment), "environment"),
    "max_turns": (lambda c: replace(c, max_turns=3), "max_turns"),
    "score_fn": (lambda c: replace(c, score_fn=_exact), "score function"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_eval_resume_fingerprint_each_part_is_checked(tmp_path: Path, change: str) -> None:
    model = ScriptedModel(lambda req: "5")
    cfg = _config(model, tmp_path, environment_factory=CalculatorEnvironment, max_turns=2)
    first = await evaluate(ROWS, cfg)
    assert first.summary["counts"]["completed"] == 2 and model.calls == 2
    assert (await evaluate(ROWS, cfg)).reused == 2 and model.calls == 2  # same settings: reused

    alter, named = CHANGES[change]
    with pytest.raises(ResumeMismatch, match=named) as info:
        await evaluate(ROWS, alter(cfg))
    assert "another output_dir" in str(info.value) and "overwrite" in str(info.value)
    assert ("rescore" in str(info.value)) == (change == "score_fn")
    assert model.calls == 2  # nothing ran
    assert len(_lines(tmp_path / "samples.jsonl")) == 2


async def test_eval_resume_fingerprint_is_stored_with_each_sample_and_in_the_report(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "5")
    cfg = _config(model, tmp_path)
    await evaluate(ROWS, cfg)
    records = _lines(tmp_path / "samples.jsonl")
    task = task_fingerprint(cfg).to_dict()
    for rec in records:
        assert {k: rec["fingerprint"][k] for k in task} == task
        assert len(rec["fingerprint"]["messages"]) == 16
    assert records[0]["fingerprint"]["messages"] != records[1]["fingerprint"]["messages"]  # per row
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["config"]["fingerprint"] == task and len(report["config"]["output_hash"]) == 8


async def test_eval_resume_fingerprint_keeps_secrets_out_and_ignores_the_key(tmp_path: Path) -> None:
    secret = FAKE_KEYS["OPENAI_API_KEY"]
    model = ScriptedModel(lambda req: "5")
    ep = replace(model.endpoint, api_key=secret, extra_params={"headers": {"Authorization": f"Bearer {secret}"}})
    cfg = _config(model, tmp_path, endpoint=ep)
    await evaluate(ROWS, cfg)
    for f in sorted(tmp_path.glob("*")):  # noqa: ASYNC240 (a test reading its outputs)
        assert secret not in f.read_text(), f
    # another key (same everything else) does not change an outcome: reused
    other_key = replace(ep, api_key="sk-other", extra_params={"headers": {"Authorization": "Bearer sk-other"}})
    assert (await evaluate(ROWS, replace(cfg, endpoint=other_key))).reused == 2


async def test_eval_resume_fingerprint_rescore_keeps_trajectories(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "5")
    cfg = _config(model, tmp_path)
    await evaluate(ROWS, cfg)
    rescored = await evaluate(ROWS, replace(cfg, score_fn=_exact, rescore=True))
    assert model.calls == 2 and rescored.rescored == 2 and rescored.reused == 0
    assert [s.score.metrics[0].name for s in rescored.samples if s.score] == ["exact", "exact"]
    assert [s.reward for s in rescored.samples] == [1.0, 0.0]
    assert all(s.metadata.get("rescored") for s in rescored.samples)
    # now recorded with the new scorer: a plain resume reuses them
    again = await evaluate(ROWS, replace(cfg, score_fn=_exact))
    assert again.reused == 2 and model.calls == 2
    # rescore cannot paper over another change
    with pytest.raises(ResumeMismatch, match="prepared messages"):
        await evaluate(ROWS, replace(cfg, score_fn=_contains, prepare_messages=_prepare_with("B"), rescore=True))


async def test_eval_resume_fingerprint_overwrite_starts_over(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "5")
    cfg = _config(model, tmp_path)
    await evaluate(ROWS, cfg)
    fresh = await evaluate(ROWS, replace(cfg, prepare_messages=_prepare_with("B"), overwrite=True))
    assert fresh.reused == 0 and model.calls == 4
    assert len(_lines(tmp_path / "samples.jsonl")) == 2  # the old records are gone
    with pytest.raises(ConfigurationError, match="rescore or overwrite"):
        replace(cfg, rescore=True, overwrite=True)


async def test_eval_resume_fingerprint_refuses_records_without_one(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: "5")
    cfg = _config(model, tmp_path)
    await evaluate(ROWS, cfg)
    path = tmp_path / "samples.jsonl"
    old = [{k: v for k, v in r.items() if k != "fingerprint"} for r in _lines(path)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    (tmp_path / "report.json").unlink()
    with pytest.raises(ResumeMismatch, match="without a fingerprint"):
        await evaluate(ROWS, cfg)


def test_eval_resume_fingerprint_score_fn_identity_sees_closures_and_partials() -> None:
    from rollouts.eval import scorers

    a = scorers.combine(scorers.metric("contains", scorers.contains(), 1.0))
    b = scorers.combine(scorers.metric("exact_match", scorers.exact_match(), 1.0))
    a2 = scorers.combine(scorers.metric("contains", scorers.contains(), 1.0))
    assert callable_identity(a) != callable_identity(b)
    assert callable_identity(a) == callable_identity(a2)  # equal settings, new objects
    assert callable_identity(functools.partial(_exact)) != callable_identity(functools.partial(_contains))

    def declared(sample: Sample) -> Score:
        return _exact(sample)

    declared.rollouts_fingerprint = {"rubric": "v2"}  # type: ignore[attr-defined]
    before = callable_identity(declared)
    declared.rollouts_fingerprint = {"rubric": "v3"}  # type: ignore[attr-defined]
    assert callable_identity(declared) != before


# --------------------------------------------------------------------------------------------
# GEPA
# --------------------------------------------------------------------------------------------


async def test_eval_resume_fingerprint_gepa_rollout_log_refuses_another_task(tmp_path: Path) -> None:
    model = ScriptedModel(lambda req: f"echo {req.last_user_text}")
    cfg = EvalConfig(endpoint=model.endpoint, score_fn=_contains, show_progress=False)
    log = tmp_path / "rollouts.jsonl"
    batch = [{"question": "a", "answer": "a"}]
    first = RolloutsAdapter(cfg, log_path=log)
    await first.evaluate(batch, {"system_prompt": "S"}, eval_id="e1")
    first.close()
    second = RolloutsAdapter(_with_temperature(cfg), log_path=log)
    with pytest.raises(ConfigurationError, match="model endpoint"):
        await second.evaluate(batch, {"system_prompt": "S"}, eval_id="e1")
    second.close()
    assert model.calls == 1
    third = RolloutsAdapter(replace(cfg, score_fn=_exact), log_path=log)
    with pytest.raises(ConfigurationError, match="score function"):
        await third.evaluate(batch, {"system_prompt": "S"}, eval_id="e1")
    third.close()


async def test_eval_resume_fingerprint_gepa_run_dir_refuses_another_task(tmp_path: Path) -> None:
    task_model = ScriptedModel(lambda req: "5")
    reflector = ScriptedModel(lambda req: "```\nbetter\n```")
    cfg = EvalConfig(endpoint=task_model.endpoint, score_fn=_contains, show_progress=False)
    rows = [{"question": "q", "answer": "5"}]
    kw: dict[str, Any] = {"reflection_endpoint": reflector.endpoint, "max_metric_calls": 4, "run_dir": tmp_path}
    await optimize("S", rows, task=cfg, **kw)
    with pytest.raises(ConfigurationError, match=r"task\.score_fn"):
        await optimize("S", rows, task=replace(cfg, score_fn=_exact), **kw)
