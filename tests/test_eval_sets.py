"""Issue 30 item 2: eval sets.

The bootstrap interval on known distributions (Bernoulli and normal: the normal-theory interval,
and its coverage over repeated draws); `evaluate_set()` running every task x model pair into one
directory under one shared limit; a set killed mid-run (SIGKILL, in a subprocess) and resumed,
running only what was missing; and `rollouts eval-set` (table, index, a rerun that calls no model).
"""

from __future__ import annotations

import functools
import json
import math
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from cli_support import cli_env, run_cli

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel
from rollouts.errors import ConfigurationError
from rollouts.eval.sets import EvalTask, bootstrap_mean_interval, evaluate_set
from rollouts.providers.scripted import ScriptedRequest
from rollouts.providers.scripted_models import CALL_LOG_ENV


def test_bootstrap_interval_of_a_bernoulli_mean_matches_the_normal_theory_interval() -> None:
    values = [1.0] * 300 + [0.0] * 700  # mean 0.3, standard error sqrt(0.3 * 0.7 / 1000)
    half = 1.959964 * math.sqrt(0.3 * 0.7 / 1000)  # 0.0284
    lo, hi = bootstrap_mean_interval(values, 0.95, resamples=4000, seed=1)  # type: ignore[misc]
    assert lo == pytest.approx(0.3 - half, abs=0.004) and hi == pytest.approx(0.3 + half, abs=0.004)
    assert bootstrap_mean_interval(values, 0.95, resamples=4000, seed=1) == (lo, hi)  # deterministic


def test_bootstrap_interval_of_a_normal_sample_and_edge_cases() -> None:
    rng = random.Random(7)
    values = [rng.gauss(10.0, 2.0) for _ in range(400)]
    mean = math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = 1.959964 * sd / math.sqrt(len(values))  # ~0.196
    lo, hi = bootstrap_mean_interval(values, 0.95, resamples=4000, seed=3)  # type: ignore[misc]
    assert lo == pytest.approx(mean - half, abs=0.025) and hi == pytest.approx(mean + half, abs=0.025)
    lo90, hi90 = bootstrap_mean_interval(values, 0.90, resamples=4000, seed=3)  # type: ignore[misc]
    assert lo < lo90 < hi90 < hi
    assert bootstrap_mean_interval([0.5] * 10) == (0.5, 0.5)
    assert bootstrap_mean_interval([]) is None
    with pytest.raises(ValueError):
        bootstrap_mean_interval([1.0], confidence=1.0)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time() -> None:
    rng = random.Random(11)
    covered = 0
    trials = 200
    for t in range(trials):
        draws = [float(rng.random() < 0.4) for _ in range(60)]
        lo, hi = bootstrap_mean_interval(draws, 0.95, resamples=400, seed=t)  # type: ignore[misc]
        covered += lo <= 0.4 <= hi
    assert 0.88 * trials <= covered <= 0.995 * trials


# ---- evaluate_set ----------------------------------------------------------------------------


def _score(sample: Sample) -> Score:
    return Score((Metric("correct", float(sample.response == str(sample.input["answer"])), 1.0),))


def _task(name: str, rows: list[dict[str, object]], **kw: object) -> EvalTask:
    config = EvalConfig(
        ScriptedModel(lambda r: "x", name=f"placeholder-{name}").endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        score_fn=_score,
        max_turns=1,
        **kw,  # type: ignore[arg-type]
    )
    return EvalTask(name, rows, config)


async def test_evaluate_set_runs_every_pair_into_one_directory_under_one_limit(tmp_path: Path) -> None:
    running = {"now": 0, "peak": 0}

    def model(name: str, right: bool) -> ScriptedModel:
        async def reply(request: ScriptedRequest) -> str:
            running["now"] += 1
            running["peak"] = max(running["peak"], running["now"])
            await trio.sleep(0.01)  # (overlap; the assertion is a bound, not a timing)
            running["now"] -= 1
            n = int(request.last_user_text.split()[-1])
            return str(2 * n if right else n)

        return ScriptedModel(reply, name=name)

    good, bad = model("set-good", True), model("set-bad", False)
    tasks = [
        _task("doubles", [{"id": f"d{i}", "q": f"double {i}", "answer": 2 * i} for i in range(5)]),
        _task("more", [{"q": f"double {i}", "answer": 2 * i} for i in range(1, 4)], epochs=2),
    ]
    result = await evaluate_set(tasks, [good.endpoint, bad.endpoint], tmp_path / "set", max_concurrent=3)
    assert 2 <= running["peak"] <= 3  # pairs ran side by side, never over the one limit
    assert {(p.task, p.model, p.status) for p in result.pairs} == {
        (t, m, "completed") for t in ("doubles", "more") for m in ("scripted/set-good", "scripted/set-bad")
    }
    index = json.loads((tmp_path / "set" / "index.json").read_text())
    assert index["kind"] == "rollouts.eval_set" and index["tasks"] == ["doubles", "more"]
    for pair in index["pairs"]:
        assert (tmp_path / "set" / pair["dir"] / "samples.jsonl").is_file()
    good_doubles = index["comparison"]["doubles"]["scripted/set-good"]
    bad_doubles = index["comparison"]["doubles"]["scripted/set-bad"]
    assert (good_doubles["n"], good_doubles["mean"], good_doubles["ci"]) == (5, 1.0, [1.0, 1.0])
    assert (bad_doubles["mean"], bad_doubles["metrics"]) == (0.2, {"correct": 0.2})  # only 0 doubles to 0
    assert bad_doubles["ci"][0] <= 0.2 <= bad_doubles["ci"][1]
    more = index["comparison"]["more"]["scripted/set-good"]
    assert more["n"] == 3 and more["samples"] == 6 and more["epochs"]["pass@2"] == 1.0  # rows, not samples
    assert "doubles" in result.format() and "95% CI" in result.format()


async def test_evaluate_set_refuses_a_one_shot_dataset_for_several_models(tmp_path: Path) -> None:
    a, b = ScriptedModel(lambda r: "1", name="set-a"), ScriptedModel(lambda r: "1", name="set-b")
    task = EvalTask("once", iter([{"q": "x", "answer": 1}]), EvalConfig(a.endpoint))
    with pytest.raises(ConfigurationError, match="iterator"):
        await evaluate_set([task], [a.endpoint, b.endpoint], tmp_path)
    with pytest.raises(ConfigurationError, match="name"):
        EvalTask("no/slash", [], EvalConfig(a.endpoint))


_SCRIPT = """
import sys, trio
from rollouts import EvalConfig, Message, Metric, Score, ScriptedModel
from rollouts.eval.sets import EvalTask, evaluate_set

HANG_AFTER = int(sys.argv[2])
calls = [0]

async def reply(request):
    calls[0] += 1
    if HANG_AFTER >= 0 and calls[0] > HANG_AFTER:
        print("hanging", flush=True)
        await trio.sleep_forever()
    return request.last_user_text.split()[-1]

models = [ScriptedModel(reply, name=f"m{i}") for i in range(2)]

def score(sample):
    return Score((Metric("correct", float(sample.response == str(sample.input["n"])), 1.0),))

def task(name, n):
    config = EvalConfig(models[0].endpoint, score_fn=score, max_turns=1,
                        prepare_messages=lambda row: [Message("user", "say %d" % row["n"])])
    return EvalTask(name, [{"n": i} for i in range(n)], config)

async def main():
    result = await evaluate_set([task("t1", 4), task("t2", 3)], [m.endpoint for m in models], sys.argv[1], max_concurrent=2)
    print("calls", calls[0], "reused", sum(p.report.reused for p in result.pairs), flush=True)
    print("statuses", sorted({p.status for p in result.pairs}), flush=True)

trio.run(main)
"""


def _written(out: Path) -> int:
    """Complete sample lines in every pair's samples.jsonl."""
    total = 0
    for path in out.glob("*/*/samples.jsonl"):
        total += sum(1 for line in path.read_text().split("\n")[:-1] if line.strip())
    return total


async def test_an_eval_set_killed_mid_run_resumes_running_only_what_is_missing(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    out = tmp_path / "set"
    async with trio.open_nursery() as nursery:
        command = [sys.executable, str(script), str(out), "6"]
        proc = await nursery.start(functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False))
        assert proc.stdout is not None
        seen = b""
        while b"hanging" not in seen:
            chunk = await proc.stdout.receive_some()
            assert chunk, seen
            seen += chunk
        proc.send_signal(signal.SIGKILL)
    written = _written(out)
    assert 0 < written <= 6  # (the samples in flight at the kill are lost)
    index = json.loads((out / "index.json").read_text())
    assert {p["status"] for p in index["pairs"]} <= {"pending", "completed"}
    done = await trio.run_process(
        [sys.executable, str(script), str(out), "-1"], capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    total = 2 * (4 + 3)
    text = done.stdout.decode()
    assert f"calls {total - written} reused {written}" in text  # only the missing samples ran
    assert "statuses ['completed']" in text
    index = json.loads((out / "index.json").read_text())
    assert all(p["status"] == "completed" for p in index["pairs"]) and _written(out) == total
    assert index["comparison"]["t1"]["scripted/m1"]["mean"] == 1.0


def test_cli_eval_set_compares_and_a_rerun_calls_no_model(tmp_path: Path) -> None:
    (tmp_path / "sums.jsonl").write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(3))
    )
    (tmp_path / "hello.jsonl").write_text(json.dumps({"question": "say hello", "answer": "hello"}) + "\n")
    log = tmp_path / "calls.jsonl"
    args = ["eval-set", "sums.jsonl", "hello.jsonl", "--models", "scripted/echo,scripted/calculator"]
    args += ["--score", "contains", "--output", "set", "--max-concurrent", "2"]
    env_extra = {CALL_LOG_ENV: str(log)}
    first = run_cli(*args, tmp=tmp_path, env=cli_env(tmp_path, **env_extra))
    assert first.returncode == 0, first.stderr
    for text in ("task sums", "task hello", "scripted/echo", "scripted/calculator", "95% CI"):
        assert text in first.stdout, first.stdout
    calls = len(log.read_text().splitlines())
    assert calls == 2 * (3 + 1)
    index = json.loads((tmp_path / "set" / "index.json").read_text())
    assert sorted(index["comparison"]) == ["hello", "sums"]
    again = run_cli(*args, tmp=tmp_path, env=cli_env(tmp_path, **env_extra))
    assert again.returncode == 0, again.stderr
    assert len(log.read_text().splitlines()) == calls  # everything was reused
    assert again.stdout.split("set: ")[0] == first.stdout.split("set: ")[0]


async def test_past_twenty_million_draws_the_interval_is_the_normal_one(tmp_path: Path) -> None:
    model = ScriptedModel(lambda r: "0" if int(r.last_user_text.split()[-1]) % 2 else "x", name="set-half")
    rows = [{"q": f"n {i}", "answer": "0"} for i in range(10)]  # half right: rewards 0, 1, 0, 1, ...
    small = await evaluate_set([_task("half", rows)], [model.endpoint], tmp_path / "a", bootstrap_samples=1000)
    big = await evaluate_set([_task("half", rows)], [model.endpoint], tmp_path / "b", bootstrap_samples=3_000_000)
    boot, normal = small.comparison["half"]["scripted/set-half"], big.comparison["half"]["scripted/set-half"]
    assert (boot["ci_method"], normal["ci_method"]) == ("bootstrap", "normal")
    half = 1.959964 * math.sqrt(0.25 * 10 / 9) / math.sqrt(10)  # z * s / sqrt(n), s the sample sd
    assert normal["ci"] == pytest.approx([0.5 - half, 0.5 + half])
    assert boot["ci"][0] == pytest.approx(normal["ci"][0], abs=0.08) and boot["mean"] == normal["mean"] == 0.5
