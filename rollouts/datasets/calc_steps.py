"""calc-steps: multi-step tool use with the CalculatorEnvironment, scored on finishing right.

Each task is a chain of two to four arithmetic steps on a value that starts at 0 ("add 7, then
multiply by 3, then subtract 4"). The agent must drive the calculator one operation per call and
finish with `complete_task`; a sample scores 1 when the run ended by `complete_task` and the
reported result equals the expected value. The tasks are generated from a fixed seed, so the set
is the same everywhere.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping
from typing import Any

from rollouts.dtypes import Message
from rollouts.eval.sample import Metric, Sample, Score

SYSTEM_PROMPT = (
    "You operate a calculator whose current value starts at 0. Use one tool call per step, in the "
    "order the user gives: add, subtract, multiply or divide the current value. Read the current value "
    "in each tool result. When every step is done, call complete_task with the final value."
)

_OPS: tuple[tuple[str, str, Callable[[int, int], int]], ...] = (
    ("add", "add {n}", lambda v, n: v + n),
    ("subtract", "subtract {n}", lambda v, n: v - n),
    ("multiply", "multiply by {n}", lambda v, n: v * n),
)


def load_calc_steps(count: int = 20, seed: int = 20261124) -> list[dict[str, Any]]:
    """`count` tasks `{id, question, answer, steps}` (the first step always adds a number)."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        steps = 2 + i % 3
        first = rng.randint(2, 20)
        value = first
        words = [f"add {first}"]
        for _ in range(steps - 1):
            _name, text, apply = _OPS[rng.randrange(len(_OPS))]
            n = rng.randint(2, 9)
            value = apply(value, n)
            words.append(text.format(n=n))
        question = "Start from 0: " + ", then ".join(words) + ". What is the result?"
        rows.append({"id": f"calc-{i + 1:02d}", "question": question, "answer": value, "steps": steps})
    return rows


def prepare_messages(row: Mapping[str, Any]) -> list[Message]:
    """The system prompt, then the task."""
    return [Message("system", SYSTEM_PROMPT), Message("user", row["question"])]


_RESULT = re.compile(r"Final result:\s*(.+)$", re.S)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reported_result(sample: Sample) -> str | None:
    """What the agent passed to `complete_task` (from its tool result), or None."""
    if sample.trajectory is None:
        return None
    for m in reversed(sample.trajectory.messages):
        if m.role == "tool":
            found = _RESULT.search(m.text)
            if found:
                return found.group(1).strip()
    return None


def finished_right(sample: Sample) -> Score:
    """Metric `finished_right` (weight 1): the run ended by `complete_task` with the expected value."""
    expected = float(sample.input["answer"])
    reported = reported_result(sample)
    number = _NUMBER.search(reported or "")
    if sample.stop_reason != "task_completed" or reported is None:
        ok, feedback = False, f"did not finish with complete_task (stop: {sample.stop_reason}); expected {expected:g}"
    elif number is None or float(number.group()) != expected:
        ok, feedback = False, f"reported {reported!r}, expected {expected:g}"
    else:
        ok, feedback = True, f"finished with {expected:g}"
    return Score((Metric("finished_right", 1.0 if ok else 0.0, weight=1.0, metadata={"feedback": feedback}),))
