"""When to stop, besides the metric-call budget (which the engine enforces exactly itself).

A stopper is any callable `StopperState -> bool`, checked before every iteration is planned;
when one returns True the engine plans nothing more, finishes what is in flight and returns.
Its `reason` attribute (if any) becomes `GEPAResult.stop_reason`.

    optimize(..., stoppers=[ScoreThresholdStopper(0.95), NoImprovementStopper(10)])

Cancellation is not a stopper: cancel `optimize(cancel_scope=...)` to stop at once with the best
candidate so far (a timeout does the same at its deadline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from rollouts.errors import ConfigurationError

__all__ = [
    "FileStopper",
    "MaxIterationsStopper",
    "NoImprovementStopper",
    "ScoreThresholdStopper",
    "Stopper",
    "StopperState",
    "TimeoutStopper",
    "stop_reason_of",
]


@dataclass(frozen=True)
class StopperState:
    """A snapshot of the run for stoppers.

    iteration: iterations planned so far. metric_calls / max_metric_calls: budget used / limit.
    best_score / best_idx: the best candidate. candidates: how many there are.
    iterations_since_improvement: iterations since the best score last rose.
    elapsed_s: seconds since this process started (or resumed) the run."""

    iteration: int
    metric_calls: int
    max_metric_calls: int | None
    best_score: float
    best_idx: int
    candidates: int
    iterations_since_improvement: int
    elapsed_s: float


Stopper: TypeAlias = Callable[[StopperState], bool]


def stop_reason_of(stopper: Stopper) -> str:
    return str(getattr(stopper, "reason", None) or getattr(stopper, "__name__", None) or type(stopper).__name__)


class ScoreThresholdStopper:
    """Stop once the best mean validation score reaches `threshold`."""

    reason = "score_threshold"

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def __call__(self, state: StopperState) -> bool:
        return state.best_score >= self.threshold


class NoImprovementStopper:
    """Stop after `iterations` iterations in a row without a better best score."""

    reason = "no_improvement"

    def __init__(self, iterations: int) -> None:
        if iterations < 1:
            raise ConfigurationError(f"NoImprovementStopper needs iterations >= 1, got {iterations}")
        self.iterations = iterations

    def __call__(self, state: StopperState) -> bool:
        return state.iterations_since_improvement >= self.iterations


class MaxIterationsStopper:
    """Stop after `iterations` iterations."""

    reason = "max_iterations"

    def __init__(self, iterations: int) -> None:
        if iterations < 0:
            raise ConfigurationError(f"MaxIterationsStopper needs iterations >= 0, got {iterations}")
        self.iterations = iterations

    def __call__(self, state: StopperState) -> bool:
        return state.iteration >= self.iterations


class FileStopper:
    """Stop (after the iterations in flight) when `path` exists: `touch STOP` ends a run cleanly
    from another terminal. A file already there when a run starts was left by an earlier run
    (it stopped that one): the engine removes it then, through `clear_stale()`, and says so in
    its run_start event, instead of stopping the new run before its first iteration."""

    reason = "stop_file"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __call__(self, state: StopperState) -> bool:
        return self.path.exists()

    def clear_stale(self) -> str | None:
        """Remove a stop file left by an earlier run; a message saying so, or None."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise ConfigurationError(
                f"the stop file {str(self.path)!r} exists (left by an earlier run) and cannot be removed "
                f"({e.strerror}): remove it, or the run stops at once"
            ) from None
        return f"removed the stop file {self.path} left by an earlier run (it would have stopped this one at once)"


class TimeoutStopper:
    """Stop planning iterations once `seconds` have passed since the run (re)started. For a hard
    deadline that also cuts iterations in flight, use `optimize(timeout_s=...)`."""

    reason = "timeout"

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ConfigurationError(f"TimeoutStopper needs seconds > 0, got {seconds}")
        self.seconds = seconds

    def __call__(self, state: StopperState) -> bool:
        return state.elapsed_s >= self.seconds
