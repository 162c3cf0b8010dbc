"""Scores: named metrics with weights, and the Sample an evaluation produces."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rollouts.dtypes import Trajectory


@dataclass(frozen=True)
class Metric:
    """One measured quantity. `weight > 0` makes it count towards the reward; `weight == 0`
    tracks it only. `metadata` may carry `feedback` text (GEPA reads it)."""

    name: str
    value: float
    weight: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"Metric {self.name!r}: weight must be >= 0, got {self.weight}")
        if not isinstance(self.value, int | float) or not math.isfinite(self.value):
            # NaN and infinities are refused here (the sample fails, naming the metric) rather
            # than turning the reward into NaN and samples.jsonl into invalid JSON.
            raise ValueError(f"Metric {self.name!r}: value must be a finite number, got {self.value!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "value": self.value, "weight": self.weight, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metric:
        return cls(data["name"], data["value"], data.get("weight", 0.0), data.get("metadata", {}))


@dataclass(frozen=True)
class Score:
    """A set of metrics. `reward` is the weighted mean of the metrics with weight > 0 (0.0 if none)."""

    metrics: tuple[Metric, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.metrics, list):
            object.__setattr__(self, "metrics", tuple(self.metrics))
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"Score has duplicate metric names: {names}")

    @property
    def reward(self) -> float:
        """The weighted mean of the metrics with weight > 0 (0.0 when there are none)."""
        weighted = [(m.value, m.weight) for m in self.metrics if m.weight > 0]
        total = sum(w for _, w in weighted)
        if total == 0:
            return 0.0
        return sum(v * w for v, w in weighted) / total

    def get(self, name: str) -> Metric | None:
        """The metric called `name`, or None."""
        for m in self.metrics:
            if m.name == name:
                return m
        return None

    @property
    def feedback(self) -> str:
        """All metrics' `metadata['feedback']` texts joined, for reflection."""
        return "\n".join(str(m.metadata["feedback"]) for m in self.metrics if m.metadata.get("feedback"))

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": [m.to_dict() for m in self.metrics], "reward": self.reward}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Score:
        return cls(tuple(Metric.from_dict(m) for m in data.get("metrics", ())))


SampleStatus = Literal["pending", "completed", "failed", "provider_error"]


@dataclass(frozen=True)
class Sample:
    """One dataset row run through an agent: its input, trajectory, score and outcome. A score
    function receives it (`score_fn(sample) -> Score`) once the agent's run is over:

    * `id`: the row's `id` field, else its index in the dataset (as a string);
    * `input`: the dataset row as given (`ground_truth` reads its `ground_truth` or `answer`);
    * `trajectory`: every message of the run (`trajectory.messages`: the prepared ones, then
      the model's replies and the tool results), with usage per model call; `response` is the
      text of the last assistant message;
    * `environment_state`: the environment's state when the run ended, as its `serialize()`
      gives it (None without an environment), e.g. a calculator's `{"current_value": 36.0}`:
      what the agent's tools did, for a score that checks the outcome rather than the words;
    * `stop_reason`: why the run ended (`task_completed`, `no_tool_called`, `max_turns`, ...);
    * `status`: "completed" when scored (a failed or provider-error sample is never scored);
    * `metadata`: `turns`, `usage`, `duration_s`, `attempts`, and `unfinished` (the stop reason)
      when the run ended before its task; `score`, `error`, `fingerprint`: set by evaluate().

        def score(sample: Sample) -> Score:
            right = (sample.environment_state or {}).get("current_value") == sample.input["answer"]
            said = str(sample.ground_truth) in sample.response
            return Score((Metric("right", float(right), weight=1.0), Metric("said_it", float(said))))
    """

    id: str
    input: Mapping[str, Any] = field(default_factory=dict)
    trajectory: Trajectory | None = None
    score: Score | None = None
    status: SampleStatus = "pending"
    error: str | None = None
    stop_reason: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    fingerprint: Mapping[str, Any] | None = None  # what produced it (rollouts.eval.fingerprint)
    environment_state: Mapping[str, Any] | None = None  # the environment's serialize() at the end

    @property
    def ground_truth(self) -> Any:
        """The row's `ground_truth` (or `answer`) field, if any."""
        return self.input.get("ground_truth", self.input.get("answer"))

    @property
    def response(self) -> str:
        """The text of the last assistant message ('' if none)."""
        if self.trajectory is None:
            return ""
        for m in reversed(self.trajectory.messages):
            if m.role == "assistant":
                return m.text
        return ""

    @property
    def reward(self) -> float:
        """The score's reward (0.0 when the sample has no score)."""
        return self.score.reward if self.score is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "input": dict(self.input),
            "trajectory": self.trajectory.to_dict() if self.trajectory is not None else None,
            "score": self.score.to_dict() if self.score is not None else None,
            "status": self.status,
            "error": self.error,
            "stop_reason": self.stop_reason,
            "metadata": dict(self.metadata),
            "fingerprint": dict(self.fingerprint) if self.fingerprint is not None else None,
            "environment_state": dict(self.environment_state) if self.environment_state is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        traj = data.get("trajectory")
        score = data.get("score")
        return cls(
            id=data["id"],
            input=data.get("input", {}),
            trajectory=Trajectory.from_dict(traj) if traj is not None else None,
            score=Score.from_dict(score) if score is not None else None,
            status=data.get("status", "pending"),
            error=data.get("error"),
            stop_reason=data.get("stop_reason"),
            metadata=data.get("metadata", {}),
            fingerprint=data.get("fingerprint"),
            environment_state=data.get("environment_state"),
        )
