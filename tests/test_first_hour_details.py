"""Issue 33 item 15: evaluate()'s default run name "eval" made runs indistinguishable in the
viewer (now by task, model and time, and kept on resume); `rollouts doctor` listed only the
0.5B model (now both packaged models); CLI answers end with a newline (stderr never runs onto
them); `cancel_gepa` answered `running` (it returns the job once it has ended: see
tests/test_service_e2e.py's cancel test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli_support import run_cli

from rollouts import EvalConfig, Message, ScriptedModel, evaluate
from rollouts.local_model import QWEN25_CODER_05B, QWEN25_CODER_15B


def _config(out: Path | None, **kw: object) -> EvalConfig:
    model = ScriptedModel(lambda req: "ok", name="namer")
    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", "x")],
        output_dir=out,
        show_progress=False,
        **kw,  # type: ignore[arg-type]
    )


async def test_run_name_by_task_model_and_time_kept_on_resume(tmp_path: Path) -> None:
    first = await evaluate([{"q": 1}], _config(tmp_path / "gsm8k"))
    assert re.fullmatch(r"gsm8k-namer-\d{8}-\d{6}", first.eval_name)
    again = await evaluate([{"q": 1}, {"q": 2}], _config(tmp_path / "gsm8k"))
    assert again.eval_name == first.eval_name and again.reused == 1  # the directory's name, resumed
    free = await evaluate([{"q": 1}], _config(None))
    assert re.fullmatch(r"eval-namer-\d{8}-\d{6}", free.eval_name)
    named = await evaluate([{"q": 1}], _config(None, eval_name="mine"))
    assert named.eval_name == "mine"


def test_doctor_lists_both_packaged_models(tmp_path: Path) -> None:
    r = run_cli("doctor", "--no-verify", "--json", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [m["model"] for m in report["local_models"]] == [QWEN25_CODER_05B.name, QWEN25_CODER_15B.name]
    text = run_cli("doctor", "--no-verify", tmp=tmp_path).stdout
    assert f"local model: {QWEN25_CODER_05B.name}" in text and f"local model: {QWEN25_CODER_15B.name}" in text


def test_cli_answers_end_with_a_newline(tmp_path: Path) -> None:
    for args in (
        ("run", "-m", "scripted/echo", "-p", "hello", "--no-session"),
        ("run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--no-session"),
        ("run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--no-session",
         "--max-turns", "1"),
        ("doctor", "--no-verify"),
    ):  # fmt: skip
        r = run_cli(*args, tmp=tmp_path)
        assert r.stdout.endswith("\n") and (not r.stderr or r.stderr.endswith("\n")), args
