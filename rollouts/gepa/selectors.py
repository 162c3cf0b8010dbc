"""How the engine chooses: which candidate to improve, which components to rewrite, which
training instances to reflect on, and whether a child is better than its parent.

Every choice draws from the engine's one seeded `random.Random`, which is saved with each
checkpoint, so a resumed run chooses exactly as an uninterrupted one would.

    CandidateSelector   select(state, rng) -> candidate index
        ParetoCandidateSelector (default), CurrentBestCandidateSelector, EpsilonGreedyCandidateSelector
    ComponentSelector   select(state, candidate_idx, components) -> component names
        RoundRobinComponentSelector (default), AllComponentSelector
    EpochShuffledBatchSampler  reflection minibatches, reshuffled every epoch
    Acceptance          (parent_scores, child_scores) -> bool; default `strict_improvement`
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeAlias

from rollouts.errors import ConfigurationError
from rollouts.gepa.frontier import front_frequencies, remove_dominated
from rollouts.gepa.state import GEPAState

__all__ = [
    "Acceptance",
    "AllComponentSelector",
    "CandidateSelector",
    "ComponentSelector",
    "CurrentBestCandidateSelector",
    "EpochShuffledBatchSampler",
    "EpsilonGreedyCandidateSelector",
    "ParetoCandidateSelector",
    "RoundRobinComponentSelector",
    "candidate_selector",
    "component_selector",
    "strict_improvement",
]

Acceptance: TypeAlias = Callable[[Sequence[float], Sequence[float]], bool]


def strict_improvement(parent_scores: Sequence[float], child_scores: Sequence[float]) -> bool:
    """Accept a child when its minibatch sum is strictly higher than its parent's."""
    return sum(child_scores) > sum(parent_scores)


# --------------------------------------------------------------------------------------------
# candidates
# --------------------------------------------------------------------------------------------


class CandidateSelector(Protocol):
    def select(self, state: GEPAState, rng: random.Random) -> int: ...


class ParetoCandidateSelector:
    """Sample a parent from the Pareto fronts (GEPAConfig.frontier_type: per validation instance
    by default): drop dominated candidates, then pick one with probability proportional to the
    number of fronts it is on."""

    def select(self, state: GEPAState, rng: random.Random) -> int:
        fronts = remove_dominated(state.fronts(), state.scores())
        freq = front_frequencies(fronts)
        if not freq:
            return state.best_idx
        pool = [idx for idx, n in freq.items() for _ in range(n)]
        return rng.choice(pool)


class CurrentBestCandidateSelector:
    """Always improve the candidate with the best mean validation score."""

    def select(self, state: GEPAState, rng: random.Random) -> int:
        return state.best_idx


class EpsilonGreedyCandidateSelector:
    """The best candidate, except with probability `epsilon` a uniformly random one."""

    def __init__(self, epsilon: float = 0.1) -> None:
        if not 0 <= epsilon <= 1:
            raise ConfigurationError(f"epsilon must be between 0 and 1, got {epsilon}")
        self.epsilon = epsilon

    def select(self, state: GEPAState, rng: random.Random) -> int:
        if rng.random() < self.epsilon:
            return rng.randrange(len(state.candidates))
        return state.best_idx


_CANDIDATE_SELECTORS: dict[str, Callable[[], CandidateSelector]] = {
    "pareto": ParetoCandidateSelector,
    "current_best": CurrentBestCandidateSelector,
    "epsilon_greedy": EpsilonGreedyCandidateSelector,
}


def candidate_selector(spec: str | CandidateSelector) -> CandidateSelector:
    """A selector from its name ("pareto", "current_best", "epsilon_greedy") or itself."""
    if not isinstance(spec, str):
        return spec
    factory = _CANDIDATE_SELECTORS.get(spec)
    if factory is None:
        raise ConfigurationError(
            f"unknown candidate selection {spec!r}; use one of {', '.join(_CANDIDATE_SELECTORS)} "
            "or pass an object with select(state, rng)"
        )
    return factory()


# --------------------------------------------------------------------------------------------
# components
# --------------------------------------------------------------------------------------------


class ComponentSelector(Protocol):
    def select(self, state: GEPAState, candidate_idx: int, components: Sequence[str]) -> list[str]: ...


class RoundRobinComponentSelector:
    """One component per iteration, cycling per candidate (a child continues where its parent
    was), so every component gets its turn."""

    def select(self, state: GEPAState, candidate_idx: int, components: Sequence[str]) -> list[str]:
        pos = state.component_cursor[candidate_idx] % len(components)
        state.component_cursor[candidate_idx] = (pos + 1) % len(components)
        return [components[pos]]


class AllComponentSelector:
    """Every component, every iteration."""

    def select(self, state: GEPAState, candidate_idx: int, components: Sequence[str]) -> list[str]:
        return list(components)


_COMPONENT_SELECTORS: dict[str, Callable[[], ComponentSelector]] = {
    "round_robin": RoundRobinComponentSelector,
    "all": AllComponentSelector,
}


def component_selector(spec: str | ComponentSelector) -> ComponentSelector:
    """A selector from its name ("round_robin", "all") or itself."""
    if not isinstance(spec, str):
        return spec
    factory = _COMPONENT_SELECTORS.get(spec)
    if factory is None:
        raise ConfigurationError(
            f"unknown component selection {spec!r}; use one of {', '.join(_COMPONENT_SELECTORS)} "
            "or pass an object with select(state, candidate_idx, components)"
        )
    return factory()


# --------------------------------------------------------------------------------------------
# minibatches
# --------------------------------------------------------------------------------------------


class EpochShuffledBatchSampler:
    """Reflection minibatches: the training set is shuffled once per epoch and cut into
    consecutive batches. When its size is not a multiple of the batch size, the last batch
    of an epoch is topped up with instances from the start of that epoch's order (so no
    batch repeats an instance). Its state lives in `state.sampler`."""

    def __init__(self, minibatch_size: int) -> None:
        if minibatch_size < 1:
            raise ConfigurationError(f"reflection_minibatch_size must be >= 1, got {minibatch_size}")
        self.minibatch_size = minibatch_size

    def batch_size(self, n_train: int) -> int:
        return min(self.minibatch_size, n_train)

    def next(self, state: GEPAState, n_train: int) -> list[int]:
        assert n_train > 0
        size = self.batch_size(n_train)
        s: dict[str, Any] = state.sampler
        order: list[int] = s.get("order", [])
        pos: int = s.get("pos", 0)
        if not order or pos >= len(order):
            order = list(range(n_train))
            state.rng.shuffle(order)
            pad = (-n_train) % size
            order += order[:pad]
            s["order"], s["epoch"], pos = order, s.get("epoch", 0) + 1, 0
        s["pos"] = pos + size
        return order[pos : pos + size]
