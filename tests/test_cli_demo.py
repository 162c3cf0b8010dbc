"""`rollouts demo --scripted`: the calculator agent streamed on a scripted model, instantly.
(The demo on the embedded model is run by the local_model tier in test_local_model.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from cli_support import run_cli


def test_scripted_demo_streams_the_turns_and_the_final_answer(tmp_path: Path) -> None:
    r = run_cli("demo", "--scripted", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for line in ("First I add 7 and 5.", "add(value=7)", "Added 5 to 7. Current value: 12", "divide(value=4)"):
        assert line in out, out
    assert "final answer: 9 (stop: task_completed, turns: 4)" in out


def test_scripted_demo_runs_both_halves_and_writes_the_results_under_output(tmp_path: Path) -> None:
    """Issue 30 item 4: `--scripted` runs the eval half too (on a scripted model) and honours --output."""
    out = tmp_path / "chosen"
    r = run_cli("demo", "--scripted", "--output", str(out), tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "final answer: 9 (stop: task_completed, turns: 4)" in r.stdout
    for name in ("terse", "worked-example"):
        report = json.loads((out / name / "report.json").read_text())
        assert (report["status"], report["summary"]["counts"]["completed"]) == ("completed", 6)
        assert len((out / name / "samples.jsonl").read_text().splitlines()) == 6
        assert f"results: {out / name}  (samples.jsonl, report.json)" in r.stdout
    assert "moved the strict score from 0.00 to 1.00" in r.stdout
    assert not (tmp_path / "results").exists()
