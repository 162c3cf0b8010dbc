"""`rollouts gepa` through the real command, with scripted task and reflection models defined in
the score module: progress, the files written, usage errors, and a run killed with SIGKILL and
resumed to the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import trio
from cli_support import CLI, cli_env, run_cli

from rollouts.testing import FakeTurn, open_fake_server

# The score module also defines the scripted models (`-m scripted/tags-task`): a model answers
# "OK <topic>" when its system prompt holds [T:<topic>]; the reflection model adds the first tag
# the feedback asks for. TAGS_LATENCY slows every call down; TAGS_HOLD="<state.json>:<n>" makes task
# calls hang once n iterations are checkpointed there, so a signal always lands mid-run (kill tests).
TASK_MODULE = """
import json, os, re
import trio
from rollouts import Metric, Score, ScriptedModel

LATENCY = float(os.environ.get("TAGS_LATENCY", "0"))
HOLD = os.environ.get("TAGS_HOLD", "")

def _held():
    path, _, n = HOLD.rpartition(":")
    try:
        return bool(HOLD) and len(json.load(open(path))["history"]) >= int(n)
    except (OSError, ValueError, KeyError):
        return False

async def _task(req):
    if _held():
        await trio.sleep_forever()
    topic = req.last_user_text.split("topic:")[-1].strip()
    return f"OK {topic}" if f"[T:{topic}]" in req.system else "NO"

def _reflect(req):
    parts = req.last_user_text.split("```")
    current = parts[1].strip("\\n")
    for topic in re.findall(r"needs \\[T:([a-z]+)\\]", "```".join(parts[2:])):
        if f"[T:{topic}]" not in current:
            return "Better:\\n```\\n" + current + f"\\nTopic [T:{topic}] is handled.\\n```"
    return "```\\n" + current + "\\n```"

ScriptedModel(_task, name="tags-task", latency_s=LATENCY)
ScriptedModel(_reflect, name="tags-reflect", latency_s=LATENCY)

def score(sample):
    topic = sample.input["topic"]
    ok = sample.response == f"OK {topic}"
    feedback = "Correct." if ok else f"Wrong: needs [T:{topic}] in the instructions."
    return Score((Metric("correct", float(ok), 1.0, {"feedback": feedback}),))
"""

ARGS = (
    "gepa", "train.jsonl", "--val", "val.jsonl", "-m", "scripted/tags-task",
    "--reflection-model", "scripted/tags-reflect", "--score", "tags_task:score",
    "--system-prompt", "Answer about topics.", "--budget", "70",
)  # fmt: skip


def _setup(tmp: Path) -> None:
    (tmp / "tags_task.py").write_text(TASK_MODULE)
    for name, topics in (("train", "abcdabcd"), ("val", "abcdabce")):
        rows = [{"id": f"{name}{i}", "question": f"topic: {t}", "topic": t} for i, t in enumerate(topics)]
        (tmp / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _result(run: Path) -> dict[str, object]:
    data = json.loads((run / "result.json").read_text())
    data.pop("run_dir")
    return data


def test_gepa_command_evolves_the_prompt_and_writes_the_run(tmp_path: Path) -> None:
    _setup(tmp_path)
    r = run_cli(*ARGS, "--output", "run", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "[gepa] starting: 8 train, 8 val, budget 70" in r.stderr
    assert "seed valset 0.000" in r.stderr and "accepted as #1" in r.stderr
    assert "seed score 0.0000 -> best 0.8750" in r.stdout  # topic e is never in the training rows
    assert "--- best system_prompt ---" in r.stdout
    run = tmp_path / "run"
    best = (run / "best_system_prompt.txt").read_text()
    assert all(f"[T:{t}]" in best for t in "abcd")
    result = json.loads((run / "result.json").read_text())
    assert result["metric_calls"] <= 70 and result["best_score"] == 0.875
    assert json.loads((run / "best_candidate.json").read_text()) == {"system_prompt": best.rstrip("\n")}
    assert len((run / "rollouts.jsonl").read_text().splitlines()) == result["metric_calls"]

    again = run_cli(*ARGS, "--output", "run", "--json", tmp=tmp_path)  # finished: resumes to the same result
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["candidates"] == result["candidates"]


def test_gepa_usage_errors(tmp_path: Path) -> None:
    _setup(tmp_path)
    no_reflection = [a for a in ARGS if a not in ("--reflection-model", "scripted/tags-reflect")]
    r = run_cli(*no_reflection, tmp=tmp_path)
    assert r.returncode == 2 and "--reflection-model" in r.stderr
    r = run_cli(*ARGS[:-2], tmp=tmp_path)  # no budget
    assert r.returncode == 2 and "--budget" in r.stderr
    r = run_cli(*ARGS, "--candidate", "nope.json", tmp=tmp_path)
    assert r.returncode == 2 and "not both" in r.stderr
    r = run_cli("gepa", "--help", tmp=tmp_path)
    assert r.returncode == 0 and "--reflection-model" in r.stdout and "resumes" in r.stdout


def test_gepa_killed_with_sigkill_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    _setup(tmp_path)
    whole = run_cli(*ARGS, "--output", "whole", "--no-progress", tmp=tmp_path)
    assert whole.returncode == 0, whole.stderr

    env = cli_env(tmp_path, TAGS_LATENCY="0.03")
    proc = subprocess.Popen(
        [*CLI, *ARGS, "--output", "killed"],
        cwd=tmp_path,
        env={**env, "TAGS_HOLD": "killed/state.json:2"},  # it cannot finish before the kill
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    state = tmp_path / "killed" / "state.json"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:  # kill once two iterations are checkpointed
            if state.exists():
                try:
                    if len(json.loads(state.read_text())["history"]) >= 2:
                        break
                except (ValueError, KeyError):
                    pass
            time.sleep(0.02)
        else:
            raise AssertionError("the run never checkpointed two iterations")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "killed" / "result.json").exists()

    resumed = run_cli(*ARGS, "--output", "killed", tmp=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming in killed" in resumed.stderr
    assert _result(tmp_path / "killed") == _result(tmp_path / "whole")


def test_gepa_ctrl_c_keeps_the_best_so_far_and_resumes(tmp_path: Path) -> None:
    _setup(tmp_path)
    env = cli_env(tmp_path, TAGS_LATENCY="0.03")
    proc = subprocess.Popen(
        [*CLI, *ARGS, "--output", "run"],
        cwd=tmp_path,
        env={**env, "TAGS_HOLD": "run/state.json:0"},  # it cannot finish before the Ctrl-C
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    state = tmp_path / "run" / "state.json"
    deadline = time.monotonic() + 60
    while not state.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "^C stopping" in err and "stopped: cancelled" in out
    assert json.loads((tmp_path / "run" / "result.json").read_text())["stop_reason"] == "cancelled"
    resumed = run_cli(*ARGS, "--output", "run", "--no-progress", tmp=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr
    whole = run_cli(*ARGS, "--output", "whole", "--no-progress", tmp=tmp_path)
    assert whole.returncode == 0, whole.stderr
    assert _result(tmp_path / "run") == _result(tmp_path / "whole")


async def test_gepa_reflection_key_from_its_own_variable_is_never_shown(tmp_path: Path) -> None:
    _setup(tmp_path)
    key = "refl-FAKEKEY-0123456789"
    env = cli_env(tmp_path, REFL_KEY=key)
    turns = [FakeTurn(status=401, error_message=f"Incorrect API key provided: {key}", error_code="invalid_api_key")]
    async with open_fake_server(turns) as srv:
        args = [a if a != "scripted/tags-reflect" else "openai-compatible/reflector" for a in ARGS]
        proc = await trio.run_process(
            [*CLI, *args, "--reflection-api-base", srv.base_url, "--reflection-api-key-env", "REFL_KEY",
             "--output", "run", "--max-iterations", "1"],
            cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True, check=False, stdin=b"",
        )  # fmt: skip
        auth = srv.last_request.headers["authorization"]
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert auth == f"Bearer {key}"  # the reflection model got its key...
    assert proc.returncode == 0, err
    assert "Incorrect API key provided: ***" in err  # ...the failed reflection is reported...
    assert key not in out + err  # ...and the key never shown
