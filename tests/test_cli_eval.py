"""`rollouts eval` through the real command: scoring, resume without model calls, exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pexpect
from cli_support import CLI, FAKE_KEYS, cli_env, files_containing, run_cli

ROWS = [
    {"id": "a", "question": "what is 2 + 3?", "answer": "5"},
    {"id": "b", "question": "what is 7 * 6?", "answer": "42"},
    {"id": "c", "question": "what is 10 / 4?", "answer": "2.5"},
    {"id": "d", "question": "what is 1 - 1?", "answer": "7"},  # the model says 0: scored wrong
]

SCORER = """
from rollouts.eval.sample import Metric, Score

def score(sample):
    ok = str(sample.ground_truth) in sample.response
    return Score((Metric("correct", float(ok), weight=1.0),))
"""


def _dataset(tmp: Path) -> Path:
    path = tmp / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp / "my_scores.py").write_text(SCORER)
    return path


def _calls(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_eval_twice_second_run_resumes_without_model_calls(tmp_path: Path) -> None:
    _dataset(tmp_path)
    log = tmp_path / "calls.log"
    env = cli_env(tmp_path, ROLLOUTS_SCRIPTED_CALL_LOG=str(log))
    args = ("eval", "math.jsonl", "-m", "scripted/calculator", "--env", "calculator", "--score", "my_scores:score",
            "--output", "out")  # fmt: skip
    first = run_cli(*args, tmp=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    calls_after_first = _calls(log)
    assert calls_after_first == 8  # two model turns per sample
    assert "4 samples [completed]" in first.stdout and "reused 0" in first.stdout
    table = first.stdout.splitlines()
    assert any(line.split()[:2] == ["correct", "0.7500"] for line in table), first.stdout
    assert any(line.split()[:2] == ["reward", "0.7500"] for line in table)

    second = run_cli(*args, tmp=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert _calls(log) == calls_after_first  # nothing ran again
    assert "reused 4" in second.stdout
    assert "resuming in out" in second.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["counts"]["completed"] == 4
    assert report["sample_ids"] == ["a", "b", "c", "d"]


def test_eval_resume_runs_only_missing_rows(tmp_path: Path) -> None:
    _dataset(tmp_path)
    log = tmp_path / "calls.log"
    env = cli_env(tmp_path, ROLLOUTS_SCRIPTED_CALL_LOG=str(log))
    base = ("eval", "math.jsonl", "-m", "scripted/echo", "--score", "contains", "--output", "out")
    r1 = run_cli(*base, "--max-samples", "2", tmp=tmp_path, env=env)
    assert r1.returncode == 0, r1.stderr
    assert _calls(log) == 2
    r2 = run_cli(*base, tmp=tmp_path, env=env)
    assert r2.returncode == 0, r2.stderr
    assert _calls(log) == 4
    assert "reused 2" in r2.stdout
    users = [json.loads(line)["user"] for line in log.read_text().splitlines()]
    assert sorted(users[:2]) == ["what is 2 + 3?", "what is 7 * 6?"]
    assert sorted(users[2:]) == ["what is 1 - 1?", "what is 10 / 4?"]


def test_eval_csv_with_builtin_scorer_and_json_report(tmp_path: Path) -> None:
    (tmp_path / "qa.csv").write_text("question,answer\nwhat is 2 + 2?,4\nwhat is 3 * 3?,9\n")
    r = run_cli(
        "eval", "qa.csv", "-m", "scripted/calculator", "--score", "numeric_match", "--json", "--no-progress",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["summary"]["metrics"]["numeric_match"]["mean"] == 1.0
    assert report["status"] == "completed"
    # default output: $ROLLOUTS_RESULTS_DIR/<dataset>-<provider>-<model>-<setting hash>
    (made,) = (tmp_path / "results").glob("qa-scripted-calculator-*")
    assert len(made.name) == len("qa-scripted-calculator-") + 8 and (made / "samples.jsonl").is_file()


def test_eval_failures_make_the_exit_code_non_zero(tmp_path: Path) -> None:
    _dataset(tmp_path)
    r = run_cli("eval", "math.jsonl", "-m", "scripted/fail", "--provider-retries", "0", "--output", "out", tmp=tmp_path)
    assert r.returncode == 1
    assert "provider errors 4" in r.stdout
    assert "a: provider_error" in r.stdout


def test_eval_user_errors(tmp_path: Path) -> None:
    _dataset(tmp_path)
    r = run_cli("eval", "nope.jsonl", "-m", "scripted/echo", tmp=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_cli("eval", "math.jsonl", "-m", "scripted/echo", "--score", "no_such_scorer", tmp=tmp_path)
    assert r.returncode == 2 and "built-in scorers: " in r.stderr and "exact_match" in r.stderr
    r = run_cli("eval", "math.jsonl", "-m", "scripted/echo", "--score", "my_scores:nothing", tmp=tmp_path)
    assert r.returncode == 2 and "has no function 'nothing'" in r.stderr


def test_eval_writes_no_key(tmp_path: Path) -> None:
    _dataset(tmp_path)
    env = cli_env(tmp_path, **FAKE_KEYS)
    r = run_cli("eval", "math.jsonl", "-m", "scripted/echo", "--score", "contains", "--output", "out", tmp=tmp_path,
                env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for key in FAKE_KEYS.values():
        assert key not in r.stdout + r.stderr
    assert (tmp_path / "out" / "report.json").is_file()
    assert files_containing(tmp_path, list(FAKE_KEYS.values())) == []


# A score module that also defines a scripted model, `-m scripted/probe`: each call logs what it
# was sent and how many calls were in flight at once, then takes 0.3 s.
PROBE = """
import json, os
import trio
from rollouts import Message, Metric, Score, ScriptedModel

IN_FLIGHT = 0
STARTED = 0
CHANGED = None
# PROBE_BARRIER=k: a call waits until k calls are in flight, or every call has started (of
# PROBE_TOTAL): the peak concurrency is then what the limiter allows, whatever the machine's speed.
# PROBE_HOLD_AFTER=n: calls after the n-th never return (until cancelled).
BARRIER = int(os.environ.get("PROBE_BARRIER", "0"))
TOTAL = int(os.environ.get("PROBE_TOTAL", "0"))
HOLD_AFTER = int(os.environ.get("PROBE_HOLD_AFTER", "0"))

async def _probe(req):
    global IN_FLIGHT, STARTED, CHANGED
    IN_FLIGHT += 1
    STARTED += 1
    with open(os.environ["PROBE_LOG"], "a") as f:
        f.write(json.dumps({"in_flight": IN_FLIGHT, "system": req.system, "user": req.last_user_text}) + "\\n")
    if HOLD_AFTER and STARTED > HOLD_AFTER:
        await trio.sleep_forever()
    if CHANGED is not None:
        CHANGED.set()
    with trio.fail_after(60):
        while IN_FLIGHT < BARRIER and STARTED < TOTAL:
            CHANGED = CHANGED if CHANGED is not None and not CHANGED.is_set() else trio.Event()
            await CHANGED.wait()
    await trio.sleep(0.3)  # long enough for the progress bar to redraw between samples
    IN_FLIGHT -= 1
    return "ok " + req.last_user_text

ScriptedModel(_probe, name="probe")

async def prepare(row):
    return [Message("user", "topic: " + row["topic"])]

def score(sample):
    return Score((Metric("ok", float(sample.response == "ok topic: " + sample.input["topic"]), weight=1.0),))
"""


def _probe_setup(tmp: Path, n: int) -> tuple[Path, dict[str, str]]:
    (tmp / "probe_task.py").write_text(PROBE)
    (tmp / "topics.jsonl").write_text("".join(json.dumps({"id": f"t{i}", "topic": f"t{i}"}) + "\n" for i in range(n)))
    log = tmp / "probe.log"
    return log, cli_env(tmp, PROBE_LOG=str(log))


def _probe_calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_eval_prepare_system_prompt_and_max_concurrent(tmp_path: Path) -> None:
    log, env = _probe_setup(tmp_path, 6)
    args = ("eval", "topics.jsonl", "-m", "scripted/probe", "--prepare", "probe_task:prepare", "--score",
            "probe_task:score", "--system-prompt", "Be brief.")  # fmt: skip
    env.update(PROBE_BARRIER="2", PROBE_TOTAL="6")
    r = run_cli(*args, "--max-concurrent", "2", "--output", "two", tmp=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    calls = _probe_calls(log)
    assert sorted(c["user"] for c in calls) == [f"topic: t{i}" for i in range(6)]  # --prepare built them
    assert {c["system"] for c in calls} == {"Be brief."}  # --system-prompt went first
    assert max(c["in_flight"] for c in calls) == 2  # --max-concurrent 2
    assert any(line.split()[:2] == ["ok", "1.0000"] for line in r.stdout.splitlines()), r.stdout

    log.unlink()
    env.update(PROBE_BARRIER="6")
    r = run_cli(*args, "--max-concurrent", "6", "--output", "six", tmp=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert max(c["in_flight"] for c in _probe_calls(log)) == 6


def test_eval_shows_a_live_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    _, env = _probe_setup(tmp_path, 4)
    args = [*CLI[1:], "eval", "topics.jsonl", "-m", "scripted/probe", "--prepare", "probe_task:prepare",
            "--score", "probe_task:score", "--max-concurrent", "1"]  # fmt: skip
    child = pexpect.spawn(CLI[0], [*args, "--output", "a"], cwd=str(tmp_path), env=env, encoding="utf-8", timeout=30)
    child.expect(r"\[#####-+\]  1/4   25%")  # redrawn as samples finish, before the end
    child.expect(r"\[#{20}\]  4/4  100%  .*reward 1\.000")
    child.expect_exact("4 samples [completed]")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0

    child = pexpect.spawn(CLI[0], [*args, "--output", "b", "--no-progress"], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=30)  # fmt: skip
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "4 samples [completed]" in child.before and "4/4" not in child.before


def test_eval_missing_key_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    _dataset(tmp_path)
    r = run_cli("eval", "math.jsonl", "-m", "anthropic/claude-sonnet-4-5", "--score", "contains", tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ANTHROPIC_API_KEY is not set" in lines[0], r.stderr
    assert not (tmp_path / "results").exists()  # nothing started


def test_dataset_files_are_counted_for_the_progress_total(tmp_path: Path) -> None:
    from rollouts.cli.tasks import load_dataset

    (tmp_path / "a.csv").write_text('question,answer\n"two\nlines",1\n\nq2,2\n')
    (tmp_path / "a.jsonl").write_text('{"q": 1}\n\n{"q": 2}\n{"q": 3}')
    for name, n in (("a.csv", 2), ("a.jsonl", 3)):
        rows = load_dataset(str(tmp_path / name))
        assert len(rows) == n and len(list(rows)) == n
    assert next(iter(load_dataset(str(tmp_path / "a.csv")))) == {"question": "two\nlines", "answer": "1"}


def test_summary_token_counts_add_up_to_the_total() -> None:
    from types import SimpleNamespace

    from rollouts.cli.eval import summary_text

    stats = {"mean": 0.5, "min": 0.0, "max": 1.0, "std": 0.5}
    counts = {"total": 2, "completed": 2, "failed": 0, "provider_error": 0}
    tokens = {"input": 127, "output": 16, "cache_read": 18, "cache_write": 0, "reasoning": 0, "total": 161}
    summary = {"counts": counts, "reward": stats, "metrics": {"ok": stats}, "tokens": tokens, "cost_usd": 0.0,
               "turns": {"mean": 1.0}}  # fmt: skip
    report = SimpleNamespace(eval_name="e", status="completed", duration_s=1.0, reused=0, rescored=0, samples=[],
                             output_dir=None,
                             summary=summary)  # fmt: skip
    assert "tokens 161 (in 127, cache read 18, out 16), cost $0.0000, turns/sample 1.00" in summary_text(report)


def test_eval_ctrl_c_keeps_finished_samples_and_exits_130(tmp_path: Path) -> None:
    log, env = _probe_setup(tmp_path, 8)
    args = ("eval", "topics.jsonl", "-m", "scripted/probe", "--prepare", "probe_task:prepare", "--score",
            "probe_task:score", "--max-concurrent", "1", "--output", "out")  # fmt: skip
    held = {**env, "PROBE_HOLD_AFTER": "2"}  # the third call hangs until Ctrl-C cancels it
    proc = subprocess.Popen([*CLI, *args], cwd=tmp_path, env=held, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    samples = tmp_path / "out" / "samples.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (samples.exists() and len(samples.read_text().splitlines()) >= 2):
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "^C stopping; finished samples are kept" in err
    assert "[cancelled]" in out, out
    kept = len(samples.read_text().splitlines())
    assert kept == 2
    calls_before = len(_probe_calls(log))

    again = run_cli(*args, tmp=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert f"reused {kept}" in again.stdout and "8 samples [completed]" in again.stdout
    assert len(_probe_calls(log)) - calls_before == 8 - kept  # only the missing ones ran


def test_eval_record_raw_keeps_each_calls_request_and_response(tmp_path: Path) -> None:
    _dataset(tmp_path)
    base = ("eval", "math.jsonl", "-m", "scripted/echo", "--score", "contains", "--no-progress")
    r = run_cli(*base, "--output", "plain", tmp=tmp_path, env=cli_env(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "raw_request" not in (tmp_path / "plain" / "samples.jsonl").read_text()
    r = run_cli(*base, "--output", "raw", "--record-raw", tmp=tmp_path, env=cli_env(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in (tmp_path / "raw" / "samples.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for line in lines:
        (c,) = line["trajectory"]["completions"]
        assert c["raw_request"] and c["raw_response"]
        assert line["input"]["question"] in c["raw_request"]  # the request holds the prompt
