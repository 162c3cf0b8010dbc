"""Proposals: a reflective mutation of one candidate, or a merge of two.

Mutation: evaluate the parent on the minibatch with traces; if it is already perfect there,
stop; otherwise build the reflective dataset, ask for new texts of the chosen components, and
evaluate the child on the same minibatch. The engine then decides (in a fixed order) whether to
accept it and evaluate it on the validation set.

Merge: two candidates of the Pareto front that descend from a common ancestor and each changed
different components; the merged candidate takes from each parent what it changed. It is
screened on a few validation instances where the parents differ, and accepted when it scores at
least as well there as the better parent.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from rollouts import tracing as _tracing
from rollouts.dtypes import Endpoint
from rollouts.errors import ProviderError
from rollouts.gepa.adapter import Candidate, GEPAAdapter, ReflectiveDataset
from rollouts.gepa.cache import CachedEvaluation, EvaluationCache
from rollouts.gepa.checkpoint import JsonlLog
from rollouts.gepa.frontier import front_frequencies, remove_dominated
from rollouts.gepa.reflection import (
    ReflectionParseError,
    build_reflection_prompt,
    call_reflection_model,
    extract_new_text,
)
from rollouts.gepa.rollouts_adapter import candidate_hash
from rollouts.gepa.state import GEPAState, ProposalSpec

__all__ = ["ProposalOutcome", "Proposer", "ReflectionJournal", "merge_subsample", "parent_eval_id", "plan_merge"]


def parent_eval_id(iteration: int, parent: int) -> str:
    """The id of a mutation's parent evaluation on its minibatch."""
    return f"it{iteration:04d}-parent-c{parent}"


@dataclass
class ProposalOutcome:
    """What running a proposal found. status "evaluated": the child was evaluated on the
    instances (minibatch or screening subsample) and awaits the acceptance decision."""

    status: str
    parent_scores: tuple[float, ...] = ()
    child_scores: tuple[float, ...] = ()
    child: Candidate | None = None
    child_objectives: tuple[Mapping[str, float], ...] = ()
    calls: int = 0
    saved: int = 0
    message: str = ""


class ReflectionJournal:
    """Every reflection (prompt, answer, new text) in reflections.jsonl; a resumed run reuses
    the answer recorded for the same iteration, component and current text."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._log: JsonlLog | None = None
        self._answers: dict[str, str] = {}

    def open(self) -> None:
        """Read the answers already recorded and open the file for appending (once the run
        directory's lock is held: opening drops a torn last line)."""
        if self._path is not None and self._log is None:
            self._log = JsonlLog(self._path)
            for rec in self._log:
                self._answers[rec["key"]] = rec["answer"]

    @staticmethod
    def key(iteration: int, component: str, current: str) -> str:
        return f"{iteration}:{component}:{candidate_hash({component: current})}"

    def answer(self, key: str) -> str | None:
        self.open()
        return self._answers.get(key)

    def record(self, key: str, **data: Any) -> None:
        self.open()
        if self._log is not None:
            self._log.append({"key": key, **data})

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


# --------------------------------------------------------------------------------------------
# merge planning (no model calls: it runs while the engine plans an iteration)
# --------------------------------------------------------------------------------------------


def _desirable(state: GEPAState, i: int, j: int, a: int) -> bool:
    """Whether each of i and j brings a change the other lacks (some component equals the
    ancestor's in one parent and differs in the other)."""
    ci, cj, ca = (state.candidates[k].components for k in (i, j, a))
    return any((ca.get(n) == ci.get(n)) != (ca.get(n) == cj.get(n)) for n in set(ca) | set(ci) | set(cj)) and ci != cj


def _merge_texts(state: GEPAState, i: int, j: int, a: int, rng: random.Random) -> Candidate:
    ci, cj, ca = (state.candidates[k].components for k in (i, j, a))
    si, sj = state.candidates[i].val_score, state.candidates[j].val_score
    merged: Candidate = {}
    for name in sorted(set(ca) | set(ci) | set(cj)):
        ti, tj, ta = ci.get(name, ""), cj.get(name, ""), ca.get(name, "")
        if ti == tj or ta == tj:
            merged[name] = ti
        elif ta == ti:
            merged[name] = tj
        else:  # both changed it: the better parent's version
            merged[name] = ti if si > sj else tj if sj > si else rng.choice([ti, tj])
    return merged


def plan_merge(
    state: GEPAState, rng: random.Random, max_attempts: int = 10
) -> tuple[tuple[int, int, int], Candidate] | None:
    """Two non-dominated candidates, a common ancestor no better than either, and their merge;
    None when no such pair turns up in `max_attempts` draws."""
    scores = state.scores()
    fronts = remove_dominated(state.fronts(), scores)
    pool = [c for c in front_frequencies(fronts) if state.candidates[c].complete]
    if len(pool) < 2:
        return None
    for _ in range(max_attempts):
        i, j = sorted(rng.sample(pool, 2))
        anc_i, anc_j = state.ancestors(i), state.ancestors(j)
        if i in anc_j or j in anc_i:
            continue
        options = [
            a
            for a in sorted(anc_i & anc_j)
            if (i, j, a) not in state.merge_triples
            and scores[a] <= min(scores[i], scores[j])
            and _desirable(state, i, j, a)
        ]
        if not options:
            continue
        weights = [scores[a] for a in options]
        a = rng.choices(options, weights=weights)[0] if sum(weights) > 0 else rng.choice(options)
        state.merge_triples.add((i, j, a))
        merged = _merge_texts(state, i, j, a, rng)
        if state.known_index(merged) is None:
            return (i, j, a), merged
    return None


def merge_subsample(state: GEPAState, i: int, j: int, size: int, rng: random.Random) -> list[int]:
    """Up to `size` validation instances, drawn in turn from where i is better, where j is
    better, and where they tie."""
    si, sj = state.candidates[i].val_scores, state.candidates[j].val_scores
    common = sorted(set(si) & set(sj))
    groups = [
        [k for k in common if si[k] > sj[k]],
        [k for k in common if sj[k] > si[k]],
        [k for k in common if si[k] == sj[k]],
    ]
    for g in groups:
        rng.shuffle(g)
    out: list[int] = []
    while len(out) < size and any(groups):
        for g in groups:
            if g and len(out) < size:
                out.append(g.pop())
    return sorted(out)


# --------------------------------------------------------------------------------------------
# running proposals
# --------------------------------------------------------------------------------------------


class Proposer:
    """Runs planned proposals: evaluations through the adapter, reflection through the endpoint
    (or the adapter's own `propose_new_texts`)."""

    def __init__(
        self,
        adapter: GEPAAdapter,
        trainset: Sequence[Mapping[str, Any]],
        valset: Sequence[Mapping[str, Any]],
        *,
        reflection_endpoint: Endpoint | None,
        reflection_prompt: str,
        journal: ReflectionJournal,
        cache: EvaluationCache,
        skip_perfect_score: bool,
        perfect_score: float,
        on_evaluation: Any,
        on_reflection: Any,
    ) -> None:
        self.adapter = adapter
        self.trainset = trainset
        self.valset = valset
        self.reflection_endpoint = reflection_endpoint
        self.reflection_prompt = reflection_prompt
        self.journal = journal
        self.cache = cache
        self.skip_perfect_score = skip_perfect_score
        self.perfect_score = perfect_score
        self._on_evaluation = on_evaluation
        self._on_reflection = on_reflection

    async def evaluate(
        self, rows: Sequence[Mapping[str, Any]], candidate: Candidate, *, capture: bool, eval_id: str, iteration: int
    ) -> CachedEvaluation:
        """Evaluate through the cache: only what it cannot answer reaches the adapter."""

        async def run(todo: Sequence[Mapping[str, Any]]) -> Any:
            batch = await self.adapter.evaluate(todo, dict(candidate), capture, eval_id=eval_id)
            batch.check(len(todo), capture, self.adapter)
            return batch

        result = await self.cache.evaluate(run, rows, candidate, capture=capture, eval_id=eval_id, iteration=iteration)
        await self._on_evaluation(eval_id, iteration, result)
        return result

    async def run(
        self,
        state: GEPAState,
        spec: ProposalSpec,
        *,
        gate: trio.Event | None = None,
        parent_done: trio.Event | None = None,
    ) -> ProposalOutcome:
        """Run `spec`. With `gate`, a mutation evaluates its child only once the gate is set (a
        speculative iteration waits to be confirmed before spending more); `parent_done` is set
        once the parent's minibatch evaluation is over."""
        if spec.kind == "merge":
            return await self._merge(state, spec)
        return await self._mutation(state, spec, gate, parent_done)

    async def _mutation(
        self, state: GEPAState, spec: ProposalSpec, gate: trio.Event | None, parent_done: trio.Event | None
    ) -> ProposalOutcome:
        p = spec.parents[0]
        parent = dict(spec.texts) if spec.texts is not None else dict(state.candidates[p].components)
        rows = [self.trainset[i] for i in spec.instances]
        it = spec.iteration
        evaluated = await self.evaluate(rows, parent, capture=True, eval_id=parent_eval_id(it, p), iteration=it)
        if parent_done is not None:
            parent_done.set()
        before = evaluated.batch
        parent_scores = tuple(float(s) for s in before.scores)
        out = ProposalOutcome(
            "skipped_perfect", parent_scores=parent_scores, calls=evaluated.calls, saved=evaluated.saved
        )
        if self.skip_perfect_score and all(s >= self.perfect_score for s in parent_scores):
            out.message = f"#{p} is already perfect on minibatch {list(spec.instances)}"
            return out
        dataset = self.adapter.make_reflective_dataset(parent, before, spec.components)
        try:
            texts = await self._new_texts(it, parent, dataset, spec.components)
        except (ProviderError, ReflectionParseError) as e:
            out.status, out.message = "reflection_failed", f"reflection failed: {e}"
            return out
        child = {**parent, **texts}
        if child == parent or state.known_index(child, limit=spec.known) is not None:
            out.status = "unchanged"
            out.message = "the proposal equals " + (
                f"its parent #{p}" if child == parent else f"candidate #{state.known_index(child, limit=spec.known)}"
            )
            return out
        if gate is not None:
            await gate.wait()
        after = await self.evaluate(
            rows, child, capture=False, eval_id=f"it{it:04d}-child-{candidate_hash(child)}", iteration=it
        )
        out.status, out.child = "evaluated", child
        out.calls, out.saved = out.calls + after.calls, out.saved + after.saved
        out.child_scores = tuple(float(s) for s in after.batch.scores)
        return out

    async def _merge(self, state: GEPAState, spec: ProposalSpec) -> ProposalOutcome:
        assert spec.merged is not None
        rows = [self.valset[k] for k in spec.instances]
        i, j, _ = spec.parents
        evaluated = await self.evaluate(
            rows, spec.merged, capture=False, eval_id=f"it{spec.iteration:04d}-merge", iteration=spec.iteration
        )
        batch = evaluated.batch
        si, sj = state.candidates[i].val_scores, state.candidates[j].val_scores
        parent_best = max((tuple(si[k] for k in spec.instances), tuple(sj[k] for k in spec.instances)), key=sum)
        return ProposalOutcome(
            "evaluated",
            parent_scores=parent_best,
            child_scores=tuple(float(s) for s in batch.scores),
            child=dict(spec.merged),
            child_objectives=tuple(batch.objective_scores or ()),
            calls=evaluated.calls,
            saved=evaluated.saved,
        )

    async def _new_texts(
        self, iteration: int, parent: Candidate, dataset: ReflectiveDataset, components: Sequence[str]
    ) -> dict[str, str]:
        own = getattr(self.adapter, "propose_new_texts", None)
        if own is not None:
            out = own(parent, dataset, list(components))
            if inspect.isawaitable(out):
                out = await out
            texts = {k: v for k, v in dict(out).items() if k in components}
            for name, text in texts.items():
                await self._on_reflection(iteration, name, parent[name], text)
            return texts
        results: dict[str, str] = {}
        errors: dict[str, Exception] = {}

        async def one(name: str) -> None:
            try:
                results[name] = await self._reflect(iteration, name, parent[name], dataset.get(name, ()))
            except (ProviderError, ReflectionParseError) as e:
                errors[name] = e

        async with trio.open_nursery() as nursery:
            for name in components:
                nursery.start_soon(one, name)
        for name in components:  # the first failure in component order, whatever finished first
            if name in errors:
                raise errors[name]
        return {name: results[name] for name in components}

    async def _reflect(self, iteration: int, component: str, current: str, records: Sequence[Mapping[str, Any]]) -> str:
        assert self.reflection_endpoint is not None, "no reflection endpoint and no adapter.propose_new_texts"
        prompt = build_reflection_prompt(current, records, component=component, template=self.reflection_prompt)
        key = self.journal.key(iteration, component, current)
        answer = self.journal.answer(key)
        if answer is None:
            with _tracing.gepa_reflection(iteration, component):
                answer = await call_reflection_model(self.reflection_endpoint, prompt)
            try:
                new_text = extract_new_text(answer, component)
            finally:
                self.journal.record(key, iteration=iteration, component=component, prompt=prompt, answer=answer)
        else:
            new_text = extract_new_text(answer, component)
        await self._on_reflection(iteration, component, current, new_text)
        return new_text
