"""`rollouts demo --scripted`: the calculator agent streamed on a scripted model, instantly.
(The demo on the embedded model is run by the local_model tier in test_local_model.py.)"""

from __future__ import annotations

from pathlib import Path

from cli_support import run_cli


def test_scripted_demo_streams_the_turns_and_the_final_answer(tmp_path: Path) -> None:
    r = run_cli("demo", "--scripted", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for line in ("First I add 7 and 5.", "add(value=7)", "Added 5 to 7. Current value: 12", "divide(value=4)"):
        assert line in out, out
    assert "final answer: 9 (stop: task_completed, turns: 4)" in out
