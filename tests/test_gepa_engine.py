"""The GEPA engine end to end on the small "tags" task (tests/_gepa_task.py): the exact budget,
stoppers and cancellation, merge, determinism, speculation, custom adapters, results."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from _gepa_task import TagTask, rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollouts.errors import ConfigurationError
from rollouts.gepa import (
    EvaluationBatch,
    GEPAConfig,
    GEPAEvent,
    GEPAResult,
    ParetoCandidateSelector,
    ProgressPrinter,
    optimize,
)
from rollouts.gepa.state import GEPAState

TRAIN = rows("abcdabcdab")
VAL = rows("abcdabcd", "v")


async def _run(task: TagTask, **kw: Any) -> GEPAResult:
    kw.setdefault("max_metric_calls", 100)
    return await optimize(
        task.seed(),
        kw.pop("trainset", TRAIN),
        kw.pop("valset", VAL),
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        **kw,
    )


def _comparable(result: GEPAResult) -> dict[str, Any]:
    d = result.to_dict()
    d.pop("run_dir")
    return d


async def test_learns_every_tag_and_reports_lineage_and_diff() -> None:
    task = TagTask()
    result = await _run(task, max_metric_calls=120)
    assert result.best_score == 1.0
    assert result.seed_score == 0.0
    assert result.metric_calls == task.task_calls <= 120  # every metric call is one real rollout
    best = result.best_candidate["system_prompt"]
    assert all(f"[T:{t}]" in best for t in "abcd")
    lineage = result.lineage()
    assert lineage[0] == 0 and lineage[-1] == result.best_idx
    for child, parent in zip(lineage[1:], lineage, strict=False):
        assert result.candidates[child].parents == (parent,)
        assert result.candidates[child].origin == "mutation"
        assert result.candidates[child].changed == ("system_prompt",)
    diff = result.show_diff()
    assert diff.startswith("--- system_prompt (candidate 0)\n+++ system_prompt (candidate")
    assert "+Topic [T:a] is handled.\n" in diff
    assert GEPAResult.from_json(result.to_json()) == result
    accepted = [h for h in result.history if h.outcome == "accepted"]
    assert [h.new_candidate for h in accepted] == list(range(1, len(result.candidates)))
    assert all(sum(h.child_scores) > sum(h.parent_scores) for h in accepted)
    assert result.pareto_front == tuple((result.best_idx,) for _ in VAL) or all(
        result.best_idx in f for f in result.pareto_front
    )


async def test_same_seed_same_result_different_seed_different_choices() -> None:
    a = await _run(TagTask(), seed=3)
    b = await _run(TagTask(), seed=3)
    c = await _run(TagTask(), seed=4)
    assert _comparable(a) == _comparable(b)
    assert [h.instances for h in a.history] != [h.instances for h in c.history]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    budget=st.integers(min_value=0, max_value=90),
    seed=st.integers(min_value=0, max_value=5),
    max_tags=st.sampled_from([None, 1, 2]),
    minibatch=st.integers(min_value=1, max_value=4),
    merge=st.booleans(),
    speculative=st.booleans(),
)
def test_budget_is_never_exceeded(
    budget: int, seed: int, max_tags: int | None, minibatch: int, merge: bool, speculative: bool
) -> None:
    task = TagTask(max_tags=max_tags)

    async def main() -> GEPAResult:
        return await optimize(
            task.seed(),
            TRAIN,
            VAL,
            task=task.config(),
            reflection_endpoint=task.reflector.endpoint,
            max_metric_calls=budget,
            reflection_minibatch_size=minibatch,
            seed=seed,
            use_merge=merge,
            config=GEPAConfig(speculative=speculative),
        )

    result = trio.run(main)
    assert task.task_calls == result.metric_calls <= budget
    # (or every evaluation came from the evaluation cache for max_idle_iterations in a row)
    assert result.stop_reason in ("budget", "no_new_evaluations")
    seed_record = result.candidates[0]
    assert len(seed_record.val_scores) == min(budget, len(VAL))  # cut, not overrun
    if budget < len(VAL):
        assert not seed_record.complete and len(result.candidates) == 1
    assert result.history[-1].metric_calls <= budget if result.history else True


async def test_budget_smaller_than_the_valset_evaluates_a_prefix_of_it() -> None:
    task = TagTask()
    result = await _run(task, max_metric_calls=5)
    assert result.metric_calls == task.task_calls == 5
    assert sorted(result.candidates[0].val_scores) == [0, 1, 2, 3, 4]
    assert result.iterations == 0 and result.best_idx == 0


async def test_last_accepted_child_is_cut_to_the_budget_and_not_best() -> None:
    # Find a budget at which an accepted child's validation evaluation is cut.
    for budget in range(30, 70):
        task = TagTask()
        result = await _run(task, max_metric_calls=budget)
        partial = [c for c in result.candidates if not c.complete]
        if partial:
            assert result.metric_calls == budget == task.task_calls
            assert partial == [result.candidates[-1]]
            assert result.candidates[result.best_idx].complete
            assert "the budget ran out" in result.history[-1].message
            return
    pytest.fail("no budget produced a cut validation evaluation")


async def test_score_threshold_and_no_improvement_and_max_iterations_stop_early() -> None:
    task = TagTask()
    r = await _run(task, max_metric_calls=500, score_threshold=0.5)
    assert r.stop_reason == "score_threshold" and 0.5 <= r.best_score < 1.0
    r = await _run(TagTask(), max_metric_calls=None, no_improvement_iterations=3)
    assert r.stop_reason == "no_improvement" and r.best_score == 1.0
    tail = r.history[-3:]
    assert all(h.outcome != "accepted" for h in tail)
    r = await _run(TagTask(), max_metric_calls=500, max_iterations=2)
    assert r.stop_reason == "max_iterations" and r.iterations == 2


async def test_stop_file_stops_after_the_iteration_in_flight(tmp_path: Path) -> None:
    stop = tmp_path / "STOP"

    def touch_after_two(event: GEPAEvent) -> None:
        if event.kind == "iteration_end" and event.iteration == 2:
            stop.touch()

    r = await _run(TagTask(), max_metric_calls=500, stop_file=stop, callbacks=[touch_after_two])
    assert r.stop_reason == "stop_file"
    assert r.iterations in (2, 3)  # the iteration already started early may finish


async def test_cancellation_returns_the_best_so_far() -> None:
    scope = trio.CancelScope()
    seen: list[GEPAEvent] = []

    def cancel_at_second_accept(event: GEPAEvent) -> None:
        seen.append(event)
        if event.kind == "new_best" and event.best_idx == 2:
            scope.cancel()

    task = TagTask(latency_s=0.001)
    r = await _run(task, max_metric_calls=500, cancel_scope=scope, callbacks=[cancel_at_second_accept])
    assert r.stop_reason == "cancelled"
    assert r.best_idx == 2 and 0 < r.best_score < 1.0
    assert r.metric_calls == task.task_calls  # the calls of the interrupted iteration are counted


async def test_cancel_before_the_seed_is_evaluated_returns_the_seed() -> None:
    scope = trio.CancelScope()
    scope.cancel()
    r = await _run(TagTask(), cancel_scope=scope)
    assert r.stop_reason == "cancelled" and r.best_idx == 0 and r.candidates[0].val_scores == {}


async def test_timeout_returns_best_so_far() -> None:
    task = TagTask(latency_s=0.02)
    r = await _run(task, max_metric_calls=500, timeout_s=0.15)
    assert r.stop_reason == "timeout"
    assert r.metric_calls <= task.task_calls


async def test_outside_cancellation_propagates() -> None:
    with trio.move_on_after(0.05) as cs:
        await _run(TagTask(latency_s=0.02), max_metric_calls=500)
    assert cs.cancelled_caught


async def test_evaluations_run_concurrently_and_speculation_overlaps_iterations(autojump_clock: Any) -> None:
    # Virtual time: `wall` is the critical path of the model latencies, not the machine's load.
    task = TagTask(latency_s=0.02, reflect_latency_s=0.04)
    t0 = trio.current_time()
    r = await _run(task, max_metric_calls=120)
    wall = trio.current_time() - t0
    total = task.task_calls * 0.02 + task.reflect_calls * 0.04
    assert r.best_score == 1.0
    assert wall < total / 2.5, (wall, total)  # one call after another would take `total`


async def test_merge_combines_components_from_two_parents() -> None:
    task = TagTask(two_components=True)

    class SeedTwiceThenPareto:
        """Mutates the seed twice (its system prompt, then its hint), then samples the front."""

        def select(self, state: GEPAState, rng: random.Random) -> int:
            return 0 if len(state.candidates) < 3 else ParetoCandidateSelector().select(state, rng)

    train = rows("abab")
    val = rows("aabb", "v")
    r = await optimize(
        task.seed(),
        train,
        val,
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=60,
        reflection_minibatch_size=4,
        candidate_selection=SeedTwiceThenPareto(),
        use_merge=True,
    )
    one, two = r.candidates[1], r.candidates[2]
    assert one.changed == ("system_prompt",) and two.changed == ("hint",)
    merges = [c for c in r.candidates if c.origin == "merge"]
    assert len(merges) == 1
    merged = merges[0]
    assert merged.parents == (1, 2)
    assert merged.components == {"system_prompt": one.components["system_prompt"], "hint": two.components["hint"]}
    assert merged.val_score == 1.0 and r.best_idx == merged.idx
    record = next(h for h in r.history if h.kind == "merge")
    assert record.parents == (1, 2, 0) and record.outcome == "accepted"
    assert len(record.instances) == 4  # screened where the parents differ, then the rest reused
    assert r.metric_calls == task.task_calls <= 60


async def test_round_robin_and_all_components_on_two_components() -> None:
    rr = await _run(TagTask(two_components=True), max_metric_calls=150, candidate_selection="current_best")
    assert {h.components for h in rr.history if h.kind == "mutation"} == {("system_prompt",), ("hint",)}
    task = TagTask(two_components=True)
    both = await _run(task, max_metric_calls=150, component_selection="all")
    assert all(h.components == ("system_prompt", "hint") for h in both.history)
    assert both.best_score == 1.0
    assert task.reflect_calls >= 2 * sum(1 for h in both.history if h.outcome in ("accepted", "rejected"))


async def test_reflection_without_fence_is_recorded_and_ends_the_run_after_repeats() -> None:
    task = TagTask(reflection=lambda req: "I think the assistant should try harder.")
    r = await _run(task, max_metric_calls=200)
    assert r.stop_reason == "reflection_failed"
    failed = [h for h in r.history if h.outcome == "reflection_failed"]
    assert len(failed) == 5
    assert "no ``` fenced block" in failed[0].message and "try harder" in failed[0].message
    assert len(r.candidates) == 1


async def test_proposals_in_flight_stays_deterministic() -> None:
    a = await _run(TagTask(latency_s=0.001), proposals_in_flight=3, seed=1)
    b = await _run(TagTask(latency_s=0.003), proposals_in_flight=3, seed=1)  # other timings
    assert _comparable(a) == _comparable(b)
    assert a.metric_calls <= 100


class DictAdapter:
    """A custom adapter without rollouts: the score is the share of required words in the text."""

    def __init__(self) -> None:
        self.calls = 0

    async def evaluate(
        self,
        batch: Sequence[Mapping[str, Any]],
        candidate: dict[str, str],
        capture_traces: bool = False,
        *,
        eval_id: str | None = None,
    ) -> EvaluationBatch:
        self.calls += len(batch)
        text = candidate["prompt"]
        scores = [1.0 if row["word"] in text else 0.0 for row in batch]
        feedback = [f"add the word {row['word']}" for row in batch]
        return EvaluationBatch(
            outputs=[text] * len(batch),
            scores=scores,
            trajectories=list(batch) if capture_traces else None,
            feedback=feedback,
        )

    def make_reflective_dataset(
        self, candidate: dict[str, str], eval_batch: EvaluationBatch, components_to_update: Sequence[str]
    ) -> dict[str, list[dict[str, Any]]]:
        assert eval_batch.feedback is not None
        recs = [{"Feedback": f} for f, s in zip(eval_batch.feedback, eval_batch.scores, strict=True) if s < 1]
        return {c: recs for c in components_to_update}

    async def propose_new_texts(
        self, candidate: dict[str, str], dataset: Mapping[str, Any], components: Sequence[str]
    ) -> dict[str, str]:
        words = [r["Feedback"].split()[-1] for r in dataset["prompt"]]
        return {"prompt": candidate["prompt"] + " " + words[0]}


async def test_custom_adapter_with_its_own_proposer() -> None:
    adapter = DictAdapter()
    data = [{"word": w} for w in ["alpha", "beta", "gamma", "delta", "eps"]]
    r = await optimize({"prompt": "Say:"}, data, adapter=adapter, max_metric_calls=100)
    assert r.best_score == 1.0
    assert r.metric_calls == adapter.calls <= 100
    assert all(w in r.best_candidate["prompt"] for w in ["alpha", "beta", "gamma", "delta", "eps"])


async def test_adapter_returning_the_wrong_number_of_scores_is_named() -> None:
    class Broken(DictAdapter):
        async def evaluate(self, batch, candidate, capture_traces=False, *, eval_id=None):  # type: ignore[no-untyped-def]
            out = await super().evaluate(batch, candidate, capture_traces, eval_id=eval_id)
            return EvaluationBatch(outputs=out.outputs[:-1], scores=out.scores[:-1])

    with pytest.raises(ValueError, match=r"Broken\.evaluate returned 2 scores"):
        await optimize(
            {"prompt": "x"}, [{"word": "a"}, {"word": "b"}, {"word": "c"}], adapter=Broken(), max_metric_calls=9
        )


async def test_user_errors_are_clear() -> None:
    task = TagTask()
    with pytest.raises(ConfigurationError, match="either task="):
        await optimize("x", TRAIN, task=task.config(), adapter=DictAdapter(), max_metric_calls=5)
    with pytest.raises(ConfigurationError, match="reflection"):
        await optimize("x", TRAIN, task=task.config(), max_metric_calls=5)
    with pytest.raises(ConfigurationError, match="never stops"):
        await optimize("x", TRAIN, task=task.config(), reflection_endpoint=task.reflector.endpoint)
    with pytest.raises(ConfigurationError, match="training set is empty"):
        await optimize("x", [], task=task.config(), reflection_endpoint=task.reflector.endpoint, max_metric_calls=5)
    with pytest.raises(ConfigurationError, match=r"\{\{tone\}\}"):
        await optimize(
            {"system_prompt": "x", "tone": "calm"},
            TRAIN,
            task=task.config(),
            reflection_endpoint=task.reflector.endpoint,
            max_metric_calls=5,
        )


async def test_events_and_progress(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[GEPAEvent] = []

    async def collect(event: GEPAEvent) -> None:
        events.append(event)

    r = await _run(TagTask(), max_metric_calls=60, callbacks=[collect], show_progress=True)
    kinds = [e.kind for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("iteration_end") == r.iterations
    assert "seed_evaluated" in kinds and "reflection" in kinds and "new_best" in kinds
    ends = [e for e in events if e.kind == "iteration_end"]
    assert [e.iteration for e in ends] == list(range(1, r.iterations + 1))
    assert all(e.metric_calls <= 60 for e in events)
    err = capsys.readouterr().err
    assert "[gepa] it   1" in err and "seed valset 0.000" in err and "[gepa] done:" in err
    assert isinstance(ProgressPrinter(), ProgressPrinter)


async def test_dropped_speculation_is_counted_and_changes_nothing_else() -> None:
    # With one tag per prompt, candidates trade off and the selection often picks an older one.
    task = TagTask(max_tags=1)
    r = await _run(task, max_metric_calls=100, seed=0, cache_evaluations=False)
    dropped = [h for h in r.history if "was dropped (the selection chose" in h.message]
    assert dropped and r.speculation_calls == 3 * len(dropped)
    cached = await _run(TagTask(max_tags=1), max_metric_calls=100, seed=0)  # (its parent evaluations may be free)
    assert 0 < cached.speculation_calls <= 3 * sum("was dropped (the selection" in h.message for h in cached.history)
    assert r.metric_calls == task.task_calls <= 100
    assert GEPAResult.from_json(r.to_json()).speculation_calls == r.speculation_calls
    plain = TagTask(max_tags=1)
    r2 = await _run(plain, max_metric_calls=100, seed=0, config=GEPAConfig(speculative=False))
    assert r2.speculation_calls == 0 and r2.metric_calls == plain.task_calls
