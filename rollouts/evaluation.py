"""The original rollouts' import path for evaluation (`from rollouts.evaluation import evaluate`).

A thin re-export: the evaluation lives in `rollouts.eval` (`run.py`, `config.py`, `report.py`,
`summary.py`); every name here is the same object as there and as at the package root.
`compute_summary_metrics(samples)` is the original's flat summary (`mean_reward`,
`<metric>_mean`/`_min`/`_max`/`_std`, counts, tokens), the same as `EvalReport.summary_metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable

from rollouts.eval.config import EvalConfig
from rollouts.eval.report import EvalReport, load_report
from rollouts.eval.run import evaluate, evaluate_sample
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.eval.summary import flat_summary, summarize

__all__ = [
    "EvalConfig",
    "EvalReport",
    "Metric",
    "Sample",
    "Score",
    "compute_summary_metrics",
    "evaluate",
    "evaluate_sample",
    "load_report",
]


def compute_summary_metrics(results: Iterable[Sample]) -> dict[str, float]:
    """Aggregate statistics of `results` as one flat `name -> number` dict: `mean_reward`,
    `min_reward`, `max_reward`, `std_reward`, `<metric>_mean`/`_min`/`_max`/`_std`, `n_<status>`
    counts, `total_tokens`, `cost_usd`, `mean_turns` (see rollouts.eval.summary)."""
    return flat_summary(summarize(results))
