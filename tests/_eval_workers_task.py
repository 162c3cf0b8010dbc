"""Module-level callables for tests/test_evaluate_workers.py: worker processes import them by
reference (`module:qualname`), so they cannot be lambdas or test-local functions."""

from __future__ import annotations

from rollouts.dtypes import Message
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.providers.scripted import ScriptedModel, ScriptedRequest

# A scripted model every process that imports this module has: it answers the number it is
# asked about, except for multiples of 5, which it gets wrong.


def _answer(request: ScriptedRequest) -> str:
    n = int(request.last_user_text.removeprefix("q"))
    return f"<answer>{n + 1 if n % 5 == 0 else n}</answer>"


MODEL = ScriptedModel(_answer, name="eval-workers-test")


def prepare(row: dict) -> list[Message]:
    return [Message("user", f"q{row['q']}")]


def score(sample: Sample) -> Score:
    """1 when the reply names the row's number; raises for rows marked `bad_score`."""
    if sample.input.get("bad_score"):
        raise ValueError("this row's score function fails")
    text = sample.trajectory.messages[-1].content if sample.trajectory is not None else ""
    ok = f"<answer>{sample.input['q']}</answer>" in str(text)
    return Score((Metric("correct", 1.0 if ok else 0.0, weight=1.0),))


def broken_config() -> None:
    """A worker_config that fails in the worker (the parent only pickles it)."""
    raise ValueError("this worker cannot build its config: no such dataset split 'dev'")


def score_len(sample: Sample) -> Score:
    """Another score function (for --rescore): 1 for any reply."""
    return Score((Metric("replied", 1.0, weight=1.0),))
