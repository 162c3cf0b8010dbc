"""Does an embedded model finish a user-written tool task? calc-steps with its own `submit_answer`.

The same 20 arithmetic chains as calc-steps ("Start from 0: add 7, then multiply by 3, ..."),
but the environment is written the way a user writes one (`ToolEnvironment` with `@tool`
methods, as in docs/environments.md) and the last step is a `submit_answer` tool of its own,
not the calculator's `complete_task`. A run *finishes* when it ends by `submit_answer`; it is
*right* when the submitted value is the expected one.

Run: python benchmarks/submit_answer_task.py [--model qwen2.5-coder-1.5b] [--n 20] [--out DIR]
Needs: pip install -e '.[local]'. `--out` keeps samples.jsonl (the transcripts). Last line: one
JSON object {model, n, finish_rate, right_rate, stop_reasons, wall_s, load_avg}.

It uses only APIs that predate issue 33, so the same file measures an older checkout too (the
"before" of docs/local-models.md's text tool-call row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import trio

from rollouts import (
    Endpoint,
    EvalConfig,
    Message,
    Metric,
    Sample,
    Score,
    StopReason,
    ToolEnvironment,
    ToolResult,
    evaluate,
    tool,
)
from rollouts.datasets.calc_steps import load_calc_steps

SYSTEM_PROMPT = (
    "You operate a calculator whose current value starts at 0. Use one tool call per step, in the "
    "order the user gives: add, subtract or multiply the current value. Read the current value in "
    "each tool result. When every step is done, call submit_answer with the final value."
)


class StepsCalculator(ToolEnvironment):
    """A calculator written as a user would write one, ending with its own submit_answer tool."""

    def __init__(self, value: float = 0.0, submitted: float | None = None) -> None:
        self.value = float(value)
        self.submitted = submitted

    def _now(self, what: str) -> str:
        return f"{what}. Current value: {self.value:g}"

    @tool
    async def add(self, value: Annotated[float, "The number to add."]) -> str:
        """Add a number to the current value."""
        self.value += value
        return self._now(f"Added {value:g}")

    @tool
    async def subtract(self, value: Annotated[float, "The number to subtract."]) -> str:
        """Subtract a number from the current value."""
        self.value -= value
        return self._now(f"Subtracted {value:g}")

    @tool
    async def multiply(self, value: Annotated[float, "The factor."]) -> str:
        """Multiply the current value by a number."""
        self.value *= value
        return self._now(f"Multiplied by {value:g}")

    @tool
    async def submit_answer(self, answer: Annotated[float, "The final value."]) -> ToolResult:
        """Submit the final answer. Call it once, when every step is done."""
        self.submitted = answer
        return ToolResult("", f"Submitted {answer:g}.", stop_reason=StopReason.TASK_COMPLETED)

    async def serialize(self) -> dict[str, Any]:
        return {"value": self.value, "submitted": self.submitted}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> StepsCalculator:
        return cls(data["value"], data.get("submitted"))


def _submitted(sample: Sample) -> float | None:
    if sample.trajectory is None:
        return None
    for m in reversed(sample.trajectory.messages):
        if m.role == "tool" and m.text.startswith("Submitted "):
            try:
                return float(m.text.removeprefix("Submitted ").rstrip("."))
            except ValueError:
                return None
    return None


def score(sample: Sample) -> Score:
    """`finished` (ended by submit_answer) and `right` (weight 1: the expected value submitted)."""
    finished = sample.stop_reason == "task_completed" and _submitted(sample) is not None
    right = finished and _submitted(sample) == float(sample.input["answer"])
    return Score((Metric("finished", float(finished)), Metric("right", float(right), weight=1.0)))


def _prepare(row: dict[str, Any]) -> list[Message]:
    return [Message("system", SYSTEM_PROMPT), Message("user", row["question"])]


async def run(model: str, n: int, out: Path) -> dict[str, Any]:
    rows = load_calc_steps()[:n]
    config = EvalConfig(
        endpoint=Endpoint("local", model, temperature=0.0, max_tokens=256),
        prepare_messages=_prepare,
        environment_factory=StepsCalculator,
        score_fn=score,
        max_turns=8,
        max_concurrent=4,
        output_dir=str(out),
        show_progress=False,
        eval_name="submit-answer-steps",
    )
    started = time.perf_counter()
    report = await evaluate(rows, config)
    samples = list(report.samples)
    finished = sum(s.score.get("finished").value for s in samples if s.score is not None)  # type: ignore[union-attr]
    right = sum(s.reward for s in samples)
    return {
        "model": model,
        "n": len(samples),
        "finish_rate": round(finished / len(samples), 3),
        "right_rate": round(right / len(samples), 3),
        "stop_reasons": dict(Counter(str(s.stop_reason) for s in samples)),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--out", type=Path, help="keep the results (samples.jsonl) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = trio.run(run, args.model, args.n, args.out or Path(tmp) / "run")
    print(json.dumps(result), file=sys.stdout, flush=True)


if __name__ == "__main__":
    main()
