"""Issue 33 item 8: the CLI could not take your own environment. `run`, `eval` and `gepa`
accepted only the built-in `--env` names and `rollouts.toml` refused `module:Class`, while the
service accepted it. Now `module:Class` is accepted wherever an environment is named, and
`--help` says the module must be importable."""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import run_cli

# A calculator that starts at 10 and notes every instance made in made.log: "what is 7 + 5?"
# then answers 22 with it (17 + 5), 12 with the built-in calculator.
MY_ENV = """
from rollouts import CalculatorEnvironment

class TenCalculator(CalculatorEnvironment):
    def __init__(self, current_value: float = 10.0) -> None:
        super().__init__(current_value)
        with open("made.log", "a") as f:
            f.write("made\\n")
"""


def _setup(tmp: Path) -> None:
    (tmp / "my_env.py").write_text(MY_ENV)


def test_cli_own_environment_module_class_in_run(tmp_path: Path) -> None:
    _setup(tmp_path)
    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "my_env:TenCalculator", "-p", "what is 7 + 5?",
        "--no-session", tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "The answer is 22." in r.stdout


def test_cli_own_environment_module_class_in_rollouts_toml(tmp_path: Path) -> None:
    _setup(tmp_path)
    (tmp_path / "rollouts.toml").write_text('[defaults]\nenv = "my_env:TenCalculator"\n')
    r = run_cli("run", "-m", "scripted/calculator", "-p", "what is 7 + 5?", "--no-session", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "The answer is 22." in r.stdout


def test_cli_own_environment_module_class_in_eval(tmp_path: Path) -> None:
    _setup(tmp_path)
    rows = [{"id": "a", "question": "what is 7 + 5?", "answer": "22"}, {"id": "b", "question": "what is 1 + 1?"}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli(
        "eval", "rows.jsonl", "-m", "scripted/calculator", "--env", "my_env:TenCalculator", "--output", "out",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    answers = {s["id"]: s["trajectory"]["messages"][-2]["content"][0]["text"] for s in samples}
    assert answers == {"a": "The answer is 22.", "b": "The answer is 12."}
    assert (tmp_path / "made.log").read_text().count("made") >= 2  # one environment per sample


def test_cli_own_environment_module_class_in_gepa(tmp_path: Path) -> None:
    _setup(tmp_path)
    rows = [{"id": f"r{i}", "question": "what is 7 + 5?", "answer": "22"} for i in range(3)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli(
        "gepa", "rows.jsonl", "-m", "scripted/calculator", "--reflection-model", "scripted/echo",
        "--env", "my_env:TenCalculator", "--score", "contains", "--system-prompt", "Use the tools.", "--budget", "6", "--output", "run", "--json",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "made.log").read_text().count("made") >= 3


def test_cli_own_environment_errors_and_help(tmp_path: Path) -> None:
    _setup(tmp_path)
    for command in ("run", "eval", "gepa"):
        h = run_cli(command, "--help", tmp=tmp_path)
        assert h.returncode == 0 and "module:Class" in h.stdout and "importable" in h.stdout, command
    bad = run_cli("run", "-m", "scripted/echo", "--env", "nope", "-p", "x", "--no-session", tmp=tmp_path)
    assert bad.returncode == 2 and "module:Class" in bad.stderr and "calculator" in bad.stderr
    missing = run_cli(
        "run", "-m", "scripted/echo", "--env", "no_such_module:Env", "-p", "x", "--no-session", tmp=tmp_path
    )
    assert missing.returncode == 2 and "cannot import module 'no_such_module'" in missing.stderr
    assert "PYTHONPATH" in missing.stderr
    attr = run_cli("run", "-m", "scripted/echo", "--env", "my_env:Nope", "-p", "x", "--no-session", tmp=tmp_path)
    assert attr.returncode == 2 and "has no 'Nope'" in attr.stderr
