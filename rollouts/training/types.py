"""The original rollouts' import path for the sample type (`from rollouts.training.types import Sample`).

A thin re-export: `Sample` is the evaluated sample of `rollouts.eval.sample` (input row,
trajectory, score, status; `.response`, `.ground_truth`, `.reward`), the type score functions
receive; `TrainingSample` is the token-exact sample GRPO trains on (`rollouts.training.sample`).
"""

from __future__ import annotations

from rollouts.eval.sample import Metric, Sample, SampleStatus, Score
from rollouts.training.sample import TrainingSample

__all__ = ["Metric", "Sample", "SampleStatus", "Score", "TrainingSample"]
