"""`evaluate_sync()`: `evaluate()` for code that is not async (a script, a notebook without
`await`). Inside a running event loop it refuses with a message saying to `await evaluate()`.

    report = evaluate_sync(rows, EvalConfig(endpoint=..., score_fn=score))
"""

from __future__ import annotations

from typing import Any

from rollouts._sync import run_sync
from rollouts.eval.config import Dataset, EvalConfig
from rollouts.eval.report import EvalReport
from rollouts.eval.run import evaluate

__all__ = ["evaluate_sync"]


def evaluate_sync(dataset: Dataset, config: EvalConfig, **kwargs: Any) -> EvalReport:
    """Run `evaluate(dataset, config, **kwargs)` in its own trio event loop and return its report.
    Raises ConfigurationError when called inside a running event loop (trio or asyncio): there,
    `await evaluate(...)`."""
    return run_sync("evaluate_sync", evaluate, dataset, config, **kwargs)
