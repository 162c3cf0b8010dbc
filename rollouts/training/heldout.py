"""Held-out evaluation during `grpo_train`: how the policy does on rows it never trains on.

    heldout = HeldOut(rows=heldout_rows, score_fn=strict_score, every=5)
    await grpo_train(config, train_rows, shaped_score, backend=backend, inference=policy, heldout=heldout)

Every `every` steps (after steps every-1, 2*every-1, ..., and always after the last step) the
policy, with the weights of that step's update, answers each held-out row once, greedily
(temperature 0), through the same `evaluate()` path as the rollouts (token-exact, a fresh
environment per row); the mean of `score_fn` over the rows goes into that step's line of
`log.jsonl` as `heldout_reward`, with `heldout_failed` (rollouts that failed, counted as reward 0)
and `heldout_seconds`. The score may differ from the training reward: train on a shaped reward,
report the strict one. The evaluation draws nothing from the training's random state (greedy
decoding; each row's sampling seed is set in its own task) and its time is not in the step's
`seconds`, so a run gives the same weights with it or without it.

With `at_start` (the default) a fresh run also evaluates the rows once before its first update;
step 0's line then has that figure as `heldout_reward_start` (and `heldout_failed_start`,
`heldout_seconds_start`): the run's "before" next to every `heldout_reward` "after". A resumed
run does not evaluate it again (its step 0 line has it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.errors import ConfigurationError
from rollouts.eval.config import EnvironmentFactory, EvalConfig, PrepareMessages, ScoreFn
from rollouts.eval.run import evaluate
from rollouts.eval.sample import Sample
from rollouts.providers.tito import set_sampling_seed
from rollouts.run_config import RunConfig
from rollouts.training.backends import InferenceBackend
from rollouts.training.config import GRPOConfig


@dataclass(frozen=True)
class HeldOut:
    """Rows to evaluate the policy on during training, never trained on (module docstring).

    rows: the held-out dataset rows (dicts, as `grpo_train`'s prompts).
    score_fn: the held-out measure (any `evaluate()` score function).
    every: evaluate after every `every`-th step (and after the last step).
    at_start: also evaluate before the first update of a fresh run (`heldout_reward_start`).
    environment_factory / prepare_messages / max_tokens / max_turns: as in training when None.
    """

    rows: Sequence[Mapping[str, Any]]
    score_fn: ScoreFn
    every: int = 1
    at_start: bool = True
    environment_factory: EnvironmentFactory | None = None
    prepare_messages: PrepareMessages | None = None
    max_tokens: int | None = None
    max_turns: int | None = None

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigurationError("HeldOut: no rows; give at least one held-out row, or pass heldout=None")
        for i, row in enumerate(self.rows):
            if not isinstance(row, Mapping):
                raise ConfigurationError(f"HeldOut: row {i} is a {type(row).__name__}; every row must be a dict")
        if self.every < 1:
            raise ConfigurationError(f"HeldOut.every must be >= 1 (steps between evaluations), got {self.every}")

    def due(self, step: int, num_steps: int) -> bool:
        """Whether the held-out rows are evaluated after `step` (0-based) of a `num_steps` run."""
        return (step + 1) % self.every == 0 or step == num_steps - 1


@dataclass(frozen=True)
class HeldOutResult:
    """One held-out evaluation: the mean reward (failed rollouts count 0) and its samples."""

    reward: float
    failed: int
    seconds: float
    samples: tuple[Sample, ...]

    def metrics(self) -> dict[str, float]:
        """The keys `grpo_train` adds to the step's log line."""
        return {"heldout_reward": self.reward, "heldout_failed": float(self.failed), "heldout_seconds": self.seconds}


async def evaluate_heldout(
    heldout: HeldOut,
    inference: InferenceBackend,
    config: GRPOConfig,
    environment_factory: EnvironmentFactory | None = None,
    *,
    name: str = "heldout",
) -> HeldOutResult:
    """Evaluate the policy `inference` serves now on `heldout`'s rows, greedily; settings not
    given by `heldout` are `config`'s (and `environment_factory`, the training's). Usable
    before training too, for the starting figure."""
    turns = heldout.max_turns or config.max_turns
    rows = [{**row, "id": str(row.get("id", f"heldout-{i}"))} for i, row in enumerate(heldout.rows)]
    eval_config = EvalConfig(
        endpoint=inference.endpoint(max_tokens=heldout.max_tokens or config.max_tokens, temperature=0.0),
        score_fn=heldout.score_fn,
        prepare_messages=heldout.prepare_messages or config.prepare_messages,
        environment_factory=heldout.environment_factory or environment_factory,
        run_config=RunConfig(use_tito=True, max_turns=turns),
        max_turns=turns,
        max_concurrent=len(rows),
        sample_timeout_s=config.sample_timeout_s,
        provider_error_retries=0,
        show_progress=False,
        eval_name=name,
        # greedy decoding needs no seed; a fixed one keeps any sampling it does reproducible
        on_sample_start=lambda sample_id, row: set_sampling_seed(0),
    )
    t0 = time.perf_counter()
    report = await evaluate(rows, eval_config)
    seconds = time.perf_counter() - t0
    samples = tuple(report.samples)
    failed = sum(1 for s in samples if s.status != "completed")
    rewards = [s.reward if s.status == "completed" else 0.0 for s in samples]
    return HeldOutResult(sum(rewards) / len(rewards), failed, seconds, samples)


async def heldout_metrics(
    heldout: HeldOut | None,
    step: int,
    inference: InferenceBackend,
    config: GRPOConfig,
    environment_factory: EnvironmentFactory | None,
) -> dict[str, float]:
    """The held-out keys for `step`'s log line: empty unless an evaluation is due after it."""
    if heldout is None or not heldout.due(step, config.num_steps):
        return {}
    result = await evaluate_heldout(heldout, inference, config, environment_factory, name=f"grpo-heldout-{step}")
    return result.metrics()


async def heldout_start_metrics(
    heldout: HeldOut | None,
    inference: InferenceBackend,
    config: GRPOConfig,
    environment_factory: EnvironmentFactory | None,
) -> dict[str, float]:
    """The held-out keys, suffixed `_start`, of the policy before any update (for step 0's log
    line): empty without `heldout` or with `heldout.at_start` off."""
    if heldout is None or not heldout.at_start:
        return {}
    result = await evaluate_heldout(heldout, inference, config, environment_factory, name="grpo-heldout-start")
    return {f"{key}_start": value for key, value in result.metrics().items()}
