"""GEPA: reflective prompt evolution over `evaluate()`, with an exact budget, concurrent
evaluations and exact resume. Start with `optimize()`; see rollouts.gepa.engine for how it runs.

    from rollouts import optimize
    result = await optimize("You are ...", trainset, valset, task=eval_config,
                            reflection_endpoint=endpoint, max_metric_calls=300, run_dir="runs/gepa")
"""

from rollouts.gepa.adapter import Candidate, EvaluationBatch, GEPAAdapter, ReflectiveDataset
from rollouts.gepa.config import GEPAConfig
from rollouts.gepa.engine import GEPAEngine
from rollouts.gepa.events import GEPACallback, GEPAEvent, ProgressPrinter
from rollouts.gepa.frontier import Front, FrontType, ParetoFront, front_frequencies, objective_fronts, remove_dominated
from rollouts.gepa.optimize import optimize, optimize_sync
from rollouts.gepa.reflection import (
    DEFAULT_REFLECTION_PROMPT,
    ReflectionParseError,
    build_reflection_prompt,
    extract_new_text,
)
from rollouts.gepa.result import CandidateRecord, GEPAResult, IterationRecord
from rollouts.gepa.rollouts_adapter import RolloutsAdapter, render_trajectory
from rollouts.gepa.selectors import (
    AllComponentSelector,
    CurrentBestCandidateSelector,
    EpochShuffledBatchSampler,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    RoundRobinComponentSelector,
    strict_improvement,
)
from rollouts.gepa.state import GEPAState
from rollouts.gepa.stoppers import (
    FileStopper,
    MaxIterationsStopper,
    NoImprovementStopper,
    ScoreThresholdStopper,
    StopperState,
    TimeoutStopper,
)

__all__ = [
    "DEFAULT_REFLECTION_PROMPT",
    "AllComponentSelector",
    "Candidate",
    "CandidateRecord",
    "CurrentBestCandidateSelector",
    "EpochShuffledBatchSampler",
    "EpsilonGreedyCandidateSelector",
    "EvaluationBatch",
    "FileStopper",
    "Front",
    "FrontType",
    "GEPAAdapter",
    "GEPACallback",
    "GEPAConfig",
    "GEPAEngine",
    "GEPAEvent",
    "GEPAResult",
    "GEPAState",
    "IterationRecord",
    "MaxIterationsStopper",
    "NoImprovementStopper",
    "ParetoCandidateSelector",
    "ParetoFront",
    "ProgressPrinter",
    "ReflectionParseError",
    "ReflectiveDataset",
    "RolloutsAdapter",
    "RoundRobinComponentSelector",
    "ScoreThresholdStopper",
    "StopperState",
    "TimeoutStopper",
    "build_reflection_prompt",
    "extract_new_text",
    "front_frequencies",
    "objective_fronts",
    "optimize",
    "optimize_sync",
    "remove_dominated",
    "render_trajectory",
    "strict_improvement",
]
