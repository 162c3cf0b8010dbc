"""GEPAConfig: how the GEPA engine searches (budget, selection, merge, speculation, stops)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollouts.errors import ConfigurationError
from rollouts.gepa.frontier import FRONT_TYPES
from rollouts.gepa.reflection import DEFAULT_REFLECTION_PROMPT, check_prompt_template
from rollouts.gepa.selectors import Acceptance, CandidateSelector, ComponentSelector, strict_improvement
from rollouts.gepa.stoppers import Stopper

__all__ = ["GEPAConfig"]


@dataclass(frozen=True)
class GEPAConfig:
    """How the engine searches.

    max_metric_calls: the budget, in evaluations of one instance (None: unlimited, then a
        stopper must end the run).
    reflection_minibatch_size: training instances per reflection (3).
    candidate_selection: "pareto" (default), "current_best", "epsilon_greedy" or a selector.
    component_selection: "round_robin" (default), "all" or a selector.
    acceptance: `(parent_scores, child_scores) -> bool` on the minibatch (default: strictly
        higher sum).
    skip_perfect_score / perfect_score: do not reflect when the parent already scores
        `perfect_score` on every minibatch instance.
    use_merge / max_merge_invocations / merge_subsample_size: merge frontier candidates
        (after an accepted mutation, at most this many times, screened on this many
        validation instances).
    speculative: when a child is accepted (and when the seed is evaluated), start the next
        iteration on it while it is evaluated on the validation set. The candidate selection
        still decides afterwards: if it picks another parent, the speculative iteration is
        dropped and its minibatch evaluation (reflection_minibatch_size calls) was spent for
        nothing. Saves most of a validation evaluation's time per accepted child.
    proposals_in_flight: iterations overlapping (1: one after another; more: each is planned
        without the results of the previous ones, which wastes budget on stale parents). The
        result stays deterministic and resumable for any value, but depends on it.
    seed: the random seed of every choice.
    reflection_prompt: the reflection template (see rollouts.gepa.reflection).
    max_reflection_failures: stop after this many failed reflections in a row.
    stoppers: extra stop conditions (see rollouts.gepa.stoppers).
    timeout_s: a hard deadline: iterations in flight are cancelled and the best so far returned.
    cache_evaluations: answer an evaluation of a (candidate, row) already evaluated from the
        evaluation cache (kept in run_dir/evaluations.jsonl) at no metric call (see
        rollouts.gepa.cache). False evaluates every time (with a model that is not deterministic,
        each repeat is a new sample).
    val_evaluation_policy: how an accepted child is scored on the validation set. "full"
        (default): on every row. "incremental": first on `val_first_stage` rows (a fixed seeded
        sample, the same for every candidate); on the rest only when it can still join the front
        (it beats the front's best on one of those rows, or its mean there is at least the best
        candidate's). A child stopped after the first stage stays in the pool with those scores
        (`complete=False`, `screened_out=True`): on no row's front, the Pareto selection never
        picks it as a parent, and it is never the best.
        Budget accounting is exact either way.
    val_first_stage: the incremental policy's first-stage size (default: a quarter of the
        validation set, at least 1).
    frontier_type: the fronts parents are sampled from (and the result's `pareto_front`):
        "instance" (default: per validation instance), "objective" (per objective: the best mean
        of each metric the score function returns), "hybrid" (both), "cartesian" (per instance
        and objective). All but "instance" need per-objective scores (RolloutsAdapter reports
        each Metric of the Score; another adapter returns `objective_scores`).
    max_idle_iterations: stop (reason "no_new_evaluations") after this many iterations in a row
        that made no metric call: every evaluation was answered by the cache, so repeating them
        cannot teach anything new (without this, a run whose candidates are perfect on every
        cached minibatch would never use up its budget).
    """

    max_metric_calls: int | None = None
    reflection_minibatch_size: int = 3
    candidate_selection: str | CandidateSelector = "pareto"
    component_selection: str | ComponentSelector = "round_robin"
    acceptance: Acceptance = strict_improvement
    skip_perfect_score: bool = True
    perfect_score: float = 1.0
    use_merge: bool = False
    max_merge_invocations: int = 5
    merge_subsample_size: int = 5
    speculative: bool = True
    proposals_in_flight: int = 1
    seed: int = 0
    reflection_prompt: str = DEFAULT_REFLECTION_PROMPT
    max_reflection_failures: int = 5
    stoppers: tuple[Stopper, ...] = ()
    timeout_s: float | None = None
    cache_evaluations: bool = True
    max_idle_iterations: int = 20
    val_evaluation_policy: str = "full"
    frontier_type: str = "instance"
    val_first_stage: int | None = None

    def __post_init__(self) -> None:
        if self.max_metric_calls is not None and self.max_metric_calls < 0:
            raise ConfigurationError(f"max_metric_calls must be >= 0, got {self.max_metric_calls}")
        if self.reflection_minibatch_size < 1:
            raise ConfigurationError(f"reflection_minibatch_size must be >= 1, got {self.reflection_minibatch_size}")
        if self.proposals_in_flight < 1:
            raise ConfigurationError(f"proposals_in_flight must be >= 1, got {self.proposals_in_flight}")
        if self.merge_subsample_size < 1 or self.max_merge_invocations < 0:
            raise ConfigurationError("merge_subsample_size must be >= 1 and max_merge_invocations >= 0")
        if self.max_reflection_failures < 1:
            raise ConfigurationError(f"max_reflection_failures must be >= 1, got {self.max_reflection_failures}")
        if self.val_evaluation_policy not in ("full", "incremental"):
            raise ConfigurationError(
                f"unknown val_evaluation_policy {self.val_evaluation_policy!r}; use 'full' or 'incremental'"
            )
        if self.frontier_type not in FRONT_TYPES:
            raise ConfigurationError(
                f"unknown frontier_type {self.frontier_type!r}; use one of {', '.join(FRONT_TYPES)}"
            )
        if self.val_first_stage is not None and self.val_first_stage < 1:
            raise ConfigurationError(f"val_first_stage must be >= 1, got {self.val_first_stage}")
        if self.max_idle_iterations < 1:
            raise ConfigurationError(f"max_idle_iterations must be >= 1, got {self.max_idle_iterations}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConfigurationError(f"timeout_s must be > 0, got {self.timeout_s}")
        check_prompt_template(self.reflection_prompt)

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resumed run must share (the budget and stoppers may change)."""
        return {
            "reflection_minibatch_size": self.reflection_minibatch_size,
            "candidate_selection": _name(self.candidate_selection),
            "component_selection": _name(self.component_selection),
            "acceptance": _name(self.acceptance),
            "skip_perfect_score": self.skip_perfect_score,
            "perfect_score": self.perfect_score,
            "use_merge": self.use_merge,
            "max_merge_invocations": self.max_merge_invocations,
            "merge_subsample_size": self.merge_subsample_size,
            "speculative": self.speculative,
            "proposals_in_flight": self.proposals_in_flight,
            "seed": self.seed,
            # (only when off: a run directory made before the cache existed resumes with it on)
            **({} if self.cache_evaluations else {"cache_evaluations": False}),
            **({} if self.frontier_type == "instance" else {"frontier_type": self.frontier_type}),
            **(
                {}
                if self.val_evaluation_policy == "full"
                else {"val_evaluation_policy": self.val_evaluation_policy, "val_first_stage": self.val_first_stage}
            ),
        }


def _name(x: Any) -> str:
    if isinstance(x, str):
        return x
    return getattr(x, "__qualname__", None) or type(x).__qualname__
