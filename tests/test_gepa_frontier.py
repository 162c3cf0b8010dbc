"""GEPA bookkeeping against hand-computed cases: the per-instance Pareto front, dominated
candidates, parent sampling, minibatches, merge planning and the state's JSON round trip."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from rollouts.errors import ConfigurationError
from rollouts.gepa.frontier import ParetoFront, front_frequencies, remove_dominated
from rollouts.gepa.proposers import merge_subsample, plan_merge
from rollouts.gepa.result import CandidateRecord, best_index
from rollouts.gepa.selectors import (
    CurrentBestCandidateSelector,
    EpochShuffledBatchSampler,
    EpsilonGreedyCandidateSelector,
    ParetoCandidateSelector,
    RoundRobinComponentSelector,
    candidate_selector,
    component_selector,
    strict_improvement,
)
from rollouts.gepa.state import GEPAState, ProposalSpec


def _state(scores: list[list[float]], components: list[dict[str, str]] | None = None, parents=None) -> GEPAState:
    """A state whose candidate k has validation scores scores[k] (all instances)."""
    n = len(scores[0])
    state = GEPAState(valset_size=n, rng=random.Random(0))
    for k, row in enumerate(scores):
        state.add_candidate(
            CandidateRecord(
                idx=k,
                components=(components[k] if components else {"p": f"text {k}"}),
                parents=(parents[k] if parents else (() if k == 0 else (0,))),
                val_scores=dict(enumerate(row)),
                valset_size=n,
            )
        )
    return state


def test_front_keeps_best_score_and_all_candidates_reaching_it() -> None:
    front = ParetoFront(4)
    assert front.add(0, {0: 0.0, 1: 0.5, 2: 1.0, 3: 0.0}) == [0, 1, 2, 3]
    assert front.add(1, {0: 1.0, 1: 0.5, 2: 0.0, 3: 0.0}) == [0]
    assert front.add(2, {0: 1.0, 1: 0.75, 2: 1.0, 3: 0.0}) == [1]
    assert front.best == [1.0, 0.75, 1.0, 0.0]
    assert front.to_lists() == [[1, 2], [2], [0, 2], [0, 1, 2]]


def test_front_with_partial_scores_leaves_other_instances_alone() -> None:
    front = ParetoFront(3)
    front.add(0, {0: 0.5, 1: 0.5, 2: 0.5})
    front.add(1, {0: 0.9})  # evaluated on one instance only (budget ran out)
    assert front.to_lists() == [[1], [0], [0]]
    assert front.best == [0.9, 0.5, 0.5]


def test_remove_dominated_hand_computed() -> None:
    # instance fronts: {0,1}, {1}, {0,1,2}, {2}
    fronts = [frozenset({0, 1}), frozenset({1}), frozenset({0, 1, 2}), frozenset({2})]
    scores = {0: 0.4, 1: 0.6, 2: 0.5}
    # 0 is in fronts 0 and 2, both also hold 1: dominated. 1 is alone in front 1, 2 alone in front 3.
    assert remove_dominated(fronts, scores) == [frozenset({1}), frozenset({1}), frozenset({1, 2}), frozenset({2})]
    assert front_frequencies(remove_dominated(fronts, scores)) == {1: 3, 2: 2}


def test_remove_dominated_identical_fronts_keeps_the_better_then_the_older() -> None:
    fronts = [frozenset({0, 1}), frozenset({0, 1})]
    assert remove_dominated(fronts, {0: 0.5, 1: 0.7}) == [frozenset({1}), frozenset({1})]
    assert remove_dominated(fronts, {0: 0.5, 1: 0.5}) == [frozenset({0}), frozenset({0})]


def test_remove_dominated_chain() -> None:
    # 2 dominates 1 dominates 0 on every instance they share: only 2 stays.
    fronts = [frozenset({0, 1, 2}), frozenset({1, 2}), frozenset({2})]
    assert remove_dominated(fronts, {0: 0.1, 1: 0.2, 2: 0.3}) == [frozenset({2})] * 3


def test_pareto_selector_samples_by_front_frequency() -> None:
    # candidate 1 best on instances 0,1,2; candidate 2 best on instance 3; 0 dominated everywhere
    state = _state([[0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]])
    assert front_frequencies(remove_dominated(state.front.fronts(), state.scores())) == {1: 3, 2: 1}
    rng = random.Random(1)
    picks = Counter(ParetoCandidateSelector().select(state, rng) for _ in range(4000))
    assert set(picks) == {1, 2}
    assert 2.6 < picks[1] / picks[2] < 3.4  # 3:1


def test_current_best_and_epsilon_greedy() -> None:
    state = _state([[0, 0], [1, 0], [1, 1]])
    assert CurrentBestCandidateSelector().select(state, random.Random(0)) == 2
    greedy = EpsilonGreedyCandidateSelector(0.0)
    assert {greedy.select(state, random.Random(s)) for s in range(20)} == {2}
    explore = EpsilonGreedyCandidateSelector(1.0)
    assert {explore.select(state, random.Random(s)) for s in range(50)} == {0, 1, 2}
    with pytest.raises(ConfigurationError):
        EpsilonGreedyCandidateSelector(1.5)
    with pytest.raises(ConfigurationError, match="pareto"):
        candidate_selector("best")
    with pytest.raises(ConfigurationError, match="round_robin"):
        component_selector("each")


def test_best_index_prefers_complete_candidates() -> None:
    full = CandidateRecord(0, {"p": "a"}, val_scores={0: 0.5, 1: 0.5}, valset_size=2)
    partial = CandidateRecord(1, {"p": "b"}, val_scores={0: 1.0}, valset_size=2)
    tie = CandidateRecord(2, {"p": "c"}, val_scores={0: 0.0, 1: 1.0}, valset_size=2)
    assert best_index([full, partial]) == 0
    assert best_index([full, partial, tie]) == 0  # ties go to the older candidate
    assert best_index([partial]) == 1


def test_round_robin_components_continue_in_children() -> None:
    state = _state([[0.0]])
    sel = RoundRobinComponentSelector()
    names = ["a", "b", "c"]
    assert [sel.select(state, 0, names) for _ in range(4)] == [["a"], ["b"], ["c"], ["a"]]
    state.add_candidate(CandidateRecord(1, {"p": "x"}, parents=(0,), val_scores={0: 1.0}, valset_size=1))
    assert sel.select(state, 1, names) == ["b"]  # where its parent had got to


def test_epoch_sampler_covers_every_instance_each_epoch_without_repeats_in_a_batch() -> None:
    state = GEPAState(valset_size=1, rng=random.Random(3))
    sampler = EpochShuffledBatchSampler(3)
    batches = [sampler.next(state, 10) for _ in range(8)]  # 10 -> 12 per epoch: 4 batches
    assert all(len(b) == 3 and len(set(b)) == 3 for b in batches)
    for epoch in (batches[:4], batches[4:]):
        seen = Counter(i for b in epoch for i in b)
        assert set(seen) == set(range(10)) and sum(seen.values()) == 12
    assert state.sampler["epoch"] == 2
    assert EpochShuffledBatchSampler(5).next(GEPAState(1, rng=random.Random(0)), 2) in ([0, 1], [1, 0])
    with pytest.raises(ConfigurationError):
        EpochShuffledBatchSampler(0)


def test_strict_improvement() -> None:
    assert strict_improvement([0, 1, 0], [1, 1, 0])
    assert not strict_improvement([0, 1, 0], [1, 0, 0])


def test_merge_planning_takes_each_parents_own_change() -> None:
    seed = {"a": "A0", "b": "B0"}
    c1 = {"a": "A1", "b": "B0"}  # changed a
    c2 = {"a": "A0", "b": "B1"}  # changed b
    state = _state([[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1]], [seed, c1, c2], [(), (0,), (0,)])
    planned = plan_merge(state, random.Random(0))
    assert planned is not None
    (i, j, ancestor), merged = planned
    assert (i, j, ancestor) == (1, 2, 0)
    assert merged == {"a": "A1", "b": "B1"}
    assert (1, 2, 0) in state.merge_triples
    assert plan_merge(state, random.Random(0)) is None  # the same triple is not tried twice
    sub = merge_subsample(state, 1, 2, 3, random.Random(0))
    assert len(sub) == 3 and {0, 1} & set(sub) and {2, 3} & set(sub)


def test_no_merge_between_ancestor_and_descendant() -> None:
    seed, c1 = {"a": "A0", "b": "B0"}, {"a": "A1", "b": "B0"}
    c2 = {"a": "A1", "b": "B1"}  # a child of c1
    state = _state([[0, 0], [1, 0], [0, 1]], [seed, c1, c2], [(), (0,), (1,)])
    assert plan_merge(state, random.Random(0)) is None


def test_state_round_trips_through_json_with_rng() -> None:
    state = _state([[0, 1], [1, 0]])
    state.rng.random()
    state.pending.append(ProposalSpec(3, "mutation", (1,), (0, 2), ("p",), known=2, reserved=6))
    state.merge_triples.add((1, 2, 0))
    back = GEPAState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back.to_dict() == state.to_dict()
    assert back.rng.random() == state.rng.random()
    assert back.front.to_lists() == state.front.to_lists()
