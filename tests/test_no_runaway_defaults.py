"""Issue 33 item 9: a silent 13-minute evaluate(). `Endpoint.max_tokens` defaulted to 4096, the
embedded models' whole context, so a looping 0.5B model generated for minutes; and progress
showed only on a terminal. The embedded models' default cannot run away, and off a terminal a
progress line is written at intervals."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

from rollouts import Endpoint
from rollouts.eval.progress import ProgressBar
from rollouts.eval.sample import Sample
from rollouts.local_model import LOCAL_MODELS
from rollouts.providers.local import served_max_tokens

ROOT = Path(__file__).resolve().parent.parent


def test_local_model_max_tokens_default_cannot_run_away() -> None:
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        default = served_max_tokens(Endpoint("local", name))
        assert default == LOCAL_MODELS[name].default_max_tokens <= 1024  # not the whole context
        assert served_max_tokens(Endpoint("local", name, max_tokens=300)) == 300  # given: used as given
        assert served_max_tokens(Endpoint("local", name, max_tokens=2048)) == 2048


def test_progress_line_at_intervals_when_not_on_a_terminal() -> None:
    pipe = io.StringIO()
    bar = ProgressBar(3, stream=pipe, log_interval_s=0.0, label="calc")
    assert bar.enabled and not bar.live
    bar.update(Sample("1", status="completed"))
    bar.redraw()
    bar.close()
    lines = pipe.getvalue().splitlines()
    assert lines and all(line.startswith("calc") and "\r" not in line for line in lines)
    assert "1/3" in lines[0] and lines[-1].count("/3") == 1
    quiet = io.StringIO()
    short = ProgressBar(3, stream=quiet)  # a run shorter than the interval writes nothing
    short.update(Sample("1", status="completed"))
    short.close()
    assert quiet.getvalue() == ""


def test_progress_line_at_intervals_from_a_silent_evaluate() -> None:
    """A real evaluate() with stderr on a pipe and a model that takes its time: lines appear."""
    script = textwrap.dedent(
        """
        import trio
        from rollouts import EvalConfig, Message, ScriptedModel, evaluate

        async def main():
            model = ScriptedModel(lambda req: "ok", latency_s=0.5)
            cfg = EvalConfig(endpoint=model.endpoint, prepare_messages=lambda r: [Message("user", "x")])
            await evaluate([{"q": 1}, {"q": 2}], cfg)

        trio.run(main)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "ROLLOUTS_PROGRESS_INTERVAL": "0.2"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "/2" in line]
    assert len(lines) >= 2 and "\r" not in proc.stderr  # lines at intervals, the last one final
    assert "2/2" in lines[-1] and all(line.startswith("eval") for line in lines)
