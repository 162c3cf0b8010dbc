"""Issue 30 item 1: epochs and reducers.

pass@k against values computed by hand (n = k, c = 0, c = n included), majority vote with ties,
an evaluation with epochs (ids, reducers, report.json, epochs.jsonl, the CLI table), and a run
with epochs killed mid-epoch (SIGKILL, in a subprocess) and resumed: only the missing epochs run.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from cli_support import run_cli

from rollouts import Endpoint, EvalConfig, Message, Metric, Sample, Score, ScriptedModel, evaluate
from rollouts.dtypes import Trajectory
from rollouts.errors import ConfigurationError
from rollouts.eval.epochs import EpochReducer, majority_vote, pass_at_k, split_epoch_id, tag_answer
from rollouts.providers.scripted import ScriptedRequest


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # pass@1 is c/n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 2, 4, 1.0),  # n - c < k: some pick always holds a correct one
        (10, 3, 3, 1 - 35 / 120),  # 1 - C(7,3)/C(10,3)
        (10, 1, 5, 1 - 126 / 252),  # 1 - C(9,5)/C(10,5) = 0.5
        (3, 1, 3, 1.0),  # n = k with a correct sample
        (3, 0, 3, 0.0),  # n = k, c = 0
        (4, 0, 1, 0.0),  # c = 0
        (4, 4, 1, 1.0),  # c = n
        (4, 4, 4, 1.0),  # c = n = k
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_majority_vote_ties_go_to_the_answer_given_first() -> None:
    assert majority_vote(["a", "b", "b", "a"]) == 0  # a and b tie: a came first
    assert majority_vote(["b", "a", "a", "b", "c"]) == 0
    assert majority_vote(["x", "y", "y"]) == 1
    assert majority_vote([None, "x", "y", "y", None]) == 2  # no answer does not vote
    assert majority_vote([None, None]) is None
    assert majority_vote([]) is None


def _sample(sid: str, reward: float | None, response: str = "", status: str = "completed") -> Sample:
    score = Score((Metric("correct", reward, 1.0),)) if reward is not None else None
    traj = Trajectory((Message("user", "q"), Message("assistant", response)))
    return Sample(sid, trajectory=traj, score=score, status=status)  # type: ignore[arg-type]


def test_reducers_per_row_with_failures_provider_errors_and_ties() -> None:
    red = EpochReducer(epochs=4, pass_at=(1, 2, 4), answer_fn=tag_answer("answer"))
    # row a: answers 7, 8, 8, 7 (a tie: 7 was first) with rewards 1, 0, 0, 1
    for e, (ans, r) in enumerate([("7", 1.0), ("8", 0.0), ("8", 0.0), ("7", 1.0)], start=1):
        red.add(_sample(f"a#{e}", r, f"so <answer>{ans}</answer>"))
    # row b: one failed epoch (an attempt: incorrect, no vote), one provider error (not an attempt)
    red.add(_sample("b#1", 0.5, "<answer>1</answer>"))
    red.add(_sample("b#2", None, status="failed"))
    red.add(_sample("b#3", None, status="provider_error"))
    red.add(_sample("b#4", 1.0, "no tag"))
    a, b = red.row_result("a"), red.row_result("b")
    assert (a["n"], a["correct"], a["majority_answer"], a["majority"]) == (4, 2, "7", 1.0)
    assert (a["mean"], a["max"]) == (0.5, 1.0)
    assert a["pass@1"] == 0.5 and a["pass@2"] == pytest.approx(1 - 1 / 6) and a["pass@4"] == 1.0
    assert (b["n"], b["correct"], b["majority_answer"], b["majority"]) == (3, 1, "1", 0.5)
    assert b["mean"] == pytest.approx(0.5) and "pass@4" not in b  # only 3 attempts
    assert b["pass@2"] == pytest.approx(1 - 1 / 3)
    # a provider error later rerun and completed replaces the record
    red.add(_sample("b#3", 1.0, "<answer>1</answer>"))
    assert red.row_result("b")["n"] == 4 and red.row_result("b")["majority"] == 0.5
    summary = red.result()
    assert summary["reducers"]["pass@4"] == pytest.approx((1.0 + red.row_result("b")["pass@4"]) / 2)
    assert summary["complete_rows"] == 2 and summary["rows_per_reducer"]["pass@4"] == 2
    assert split_epoch_id("row#with#hash#12") == ("row#with#hash", 12)


def test_epochs_config_is_checked() -> None:
    ep = Endpoint("scripted", "x")
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ConfigurationError, match="epochs"):
            EvalConfig(ep, epochs=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="pass_at"):
        EvalConfig(ep, epochs=3, pass_at=(1, 4))
    assert EvalConfig(ep, epochs=5).pass_at_k == (1, 5)
    assert EvalConfig(ep, epochs=5, pass_at=[3, 1, 3]).pass_at_k == (1, 3)  # type: ignore[arg-type]


def _numbered_model(name: str) -> ScriptedModel:
    """Says the row's number, except on every third call (call index 1, 4, ...): one more."""

    def reply(request: ScriptedRequest) -> str:
        n = int(request.last_user_text.split()[-1])
        return f"<answer>{n if request.call_index % 3 != 1 else n + 1}</answer>"

    return ScriptedModel(reply, name=name)


def _score(sample: Sample) -> Score:
    got = tag_answer("answer")(sample)
    return Score((Metric("correct", float(got == str(sample.input["n"])), 1.0),))


async def test_evaluate_with_epochs_runs_each_row_k_times_and_reduces(tmp_path: Path) -> None:
    model = _numbered_model("epochs-numbered")
    config = EvalConfig(
        model.endpoint,
        prepare_messages=lambda row: [Message("user", f"say {row['n']}")],
        score_fn=_score,
        epochs=3,
        pass_at=(1, 2, 3),
        answer_fn=tag_answer("answer"),
        max_concurrent=1,  # (the call index decides the answers: one at a time)
        output_dir=tmp_path,
        show_progress=False,
        max_samples=2,
    )
    report = await evaluate([{"id": "a", "n": 1}, {"n": 2}, {"n": 3}], config)
    assert list(report.ids) == ["a#1", "a#2", "a#3", "1#1", "1#2", "1#3"]
    assert [s.input for s in report.samples] == [{"id": "a", "n": 1}] * 3 + [{"n": 2}] * 3
    # calls 0..5: right, wrong, right, right, wrong, right -> each row 2 of 3 correct
    ep = report.summary["epochs"]
    assert ep["reducers"] == pytest.approx(
        {"mean": 2 / 3, "max": 1.0, "majority": 1.0, "pass@1": 2 / 3, "pass@2": 1.0, "pass@3": 1.0}
    )
    assert (ep["rows"], ep["complete_rows"], ep["epochs"], ep["pass_at"]) == (2, 2, 3, [1, 2, 3])
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["summary"]["epochs"] == json.loads(json.dumps(ep))
    assert on_disk["config"]["epochs"] == 3 and on_disk["config"]["pass_at"] == [1, 2, 3]
    lines = [json.loads(x) for x in (tmp_path / "epochs.jsonl").read_text().splitlines()]
    assert [x["row"] for x in lines] == ["a", "1"]
    assert lines[0]["answers"] == {"1": "1", "2": "2", "3": "1"} and lines[0]["majority_answer"] == "1"


# ---- killed mid-epoch, resumed -------------------------------------------------------------

_SCRIPT = """
import sys, trio
from rollouts import EvalConfig, Message, Metric, Score, ScriptedModel, evaluate

HANG_AFTER = int(sys.argv[2])

async def reply(request):
    if HANG_AFTER >= 0 and request.call_index >= HANG_AFTER:
        print("hanging", flush=True)  # (every sample before this one is written by now)
        await trio.sleep_forever()  # the process is killed here, mid-epoch
    return "<answer>%s</answer>" % request.last_user_text.split()[-1]

model = ScriptedModel(reply, name="resumable")

def score(sample):
    return Score((Metric("correct", 1.0, 1.0),))

def recorded(sample):
    print("recorded", sample.id, flush=True)

async def main():
    config = EvalConfig(
        model.endpoint, score_fn=score, epochs=int(sys.argv[3]), max_concurrent=1, output_dir=sys.argv[1],
        prepare_messages=lambda row: [Message("user", "say %d" % row["n"])], show_progress=False,
        on_sample_end=recorded, eval_name="resumable",
    )
    report = await evaluate([{"n": i} for i in range(3)], config)
    print("reused", report.reused, flush=True)
    print("summary", report.summary["counts"]["completed"], report.summary["epochs"]["complete_rows"], flush=True)

trio.run(main)
"""


async def _run_until_killed(script: Path, out: Path, hang_after: int, epochs: int) -> list[str]:
    """Start the script; SIGKILL it once its model hangs (it says so on stdout); the sample ids
    it recorded before."""
    seen: list[str] = []
    async with trio.open_nursery() as nursery:
        command = [sys.executable, str(script), str(out), str(hang_after), str(epochs)]
        proc = await nursery.start(functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False))
        buffer = b""
        assert proc.stdout is not None
        while b"hanging\n" not in buffer:
            chunk = await proc.stdout.receive_some()
            assert chunk, f"the script ended early: {buffer!r}"
            buffer += chunk
        seen = [ln.split()[1] for ln in buffer.decode().splitlines() if ln.startswith("recorded")]
        proc.send_signal(signal.SIGKILL)
    return seen


async def _run_to_end(script: Path, out: Path, epochs: int) -> str:
    proc = await trio.run_process(
        [sys.executable, str(script), str(out), "-1", str(epochs)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


async def test_epochs_killed_mid_epoch_resume_running_only_the_missing_ones(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    out = tmp_path / "out"
    # 3 rows x 3 epochs, one at a time: killed while row 1's second epoch is in flight
    seen = await _run_until_killed(script, out, hang_after=4, epochs=3)
    assert seen == ["0#1", "0#2", "0#3", "1#1"]
    text = await _run_to_end(script, out, epochs=3)
    ran = [ln.split()[1] for ln in text.splitlines() if ln.startswith("recorded")]
    assert ran == ["1#2", "1#3", "2#1", "2#2", "2#3"]  # only the missing epochs ran
    assert "reused 4" in text and "summary 9 3" in text
    # more epochs later: the first three of every row are reused, only the fourth runs
    text = await _run_to_end(script, out, epochs=4)
    assert [ln.split()[1] for ln in text.splitlines() if ln.startswith("recorded")] == ["0#4", "1#4", "2#4"]
    assert "reused 9" in text and "summary 12 3" in text
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["epochs"]["reducers"]["pass@4"] == 1.0


def test_cli_eval_epochs_prints_the_reducers_and_writes_them(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["eval", "data.jsonl", "-m", "scripted/echo", "--score", "contains", "--no-progress"]
    r = run_cli(*args, "--epochs", "3", "--pass-at", "1,3", "--output", "out", tmp=tmp_path)
    assert r.returncode in (0, 1), r.stderr
    assert "epochs: 3 per row (3 rows, 3 with every epoch)" in r.stdout, r.stdout
    for name in ("mean", "max", "majority", "pass@1", "pass@3"):
        assert any(line.split()[:1] == [name] for line in r.stdout.splitlines()), (name, r.stdout)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(report["summary"]["epochs"]["reducers"]) == {"mean", "max", "majority", "pass@1", "pass@3"}
    assert len(report["sample_ids"]) == 9 and report["sample_ids"][:3] == ["q0#1", "q0#2", "q0#3"]
    bad = run_cli(*args, "--epochs", "2", "--pass-at", "3", "--output", "out2", tmp=tmp_path)
    assert bad.returncode == 2 and "pass_at" in bad.stderr


async def test_gepa_on_a_task_with_epochs_scores_one_rollout_per_instance() -> None:
    """A task config with epochs (for evaluate()) used by GEPA: each instance is one rollout."""
    from _gepa_task import TagTask, rows

    from rollouts.gepa import optimize

    task = TagTask()
    config = replace(task.config(), epochs=3, pass_at=(1, 3))
    result = await optimize(
        task.seed(),
        rows("ab"),
        rows("ab", "v"),
        task=config,
        reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=12,
    )
    assert result.metric_calls == task.task_calls <= 12
