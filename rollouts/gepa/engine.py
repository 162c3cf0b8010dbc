"""The GEPA engine: evaluate the seed, then plan, run and commit iterations until a stopper or
the budget ends the run.

Order and determinism. Every decision (parent, components, minibatch, merge pair, budget
reservations, acceptance) is taken by one coordinator in a fixed order: iteration k is *planned*
from the state left by committing iteration k - w (w = `proposals_in_flight`, 1 by default:
strictly one after another) and *committed* after iteration k - 1. Proposals in flight only
evaluate and reflect; they change nothing. So the result depends on the seed and the data,
never on timing, and the state saved after each commit (with the planned proposals) restarts
exactly.

Budget. `max_metric_calls` is never exceeded: an iteration is planned only when the budget left
(after what is reserved for iterations in flight) covers its minibatch evaluations, and a
validation evaluation that would cross the limit is cut to the instances the budget still covers
(the candidate is then `complete=False`, and the run ends).

Concurrency. Every evaluation runs all its instances at once through the adapter (under the
task's limits), and the components of one proposal are reflected on concurrently. Speculation
(on by default) overlaps consecutive iterations without giving up the selection rule: when a
child is accepted (or the seed evaluated), the next iteration is planned on it and started
(parent minibatch evaluation, reflection) while it is evaluated on the validation set; then the
candidate selector decides as always. If it picks the new candidate the iteration goes on (its
child evaluation waits for that decision); otherwise it is dropped, its minibatch evaluation is
counted as spent, and the chosen parent gets the same minibatch. With `proposals_in_flight > 1`
several iterations overlap instead, each planned without the results of the previous ones.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from rollouts import tracing as _tracing
from rollouts._dirlock import DirectoryLock
from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError
from rollouts.gepa.adapter import Candidate, GEPAAdapter
from rollouts.gepa.budget import Budget
from rollouts.gepa.cache import CACHE_FILE, CachedEvaluation, EvaluationCache
from rollouts.gepa.checkpoint import REFLECTIONS_FILE, load_state, save_state
from rollouts.gepa.config import GEPAConfig
from rollouts.gepa.events import GEPACallback, GEPAEvent, emit_event
from rollouts.gepa.proposers import (
    ProposalOutcome,
    Proposer,
    ReflectionJournal,
    merge_subsample,
    parent_eval_id,
    plan_merge,
)
from rollouts.gepa.result import CandidateRecord, GEPAResult, IterationRecord
from rollouts.gepa.selectors import EpochShuffledBatchSampler, candidate_selector, component_selector
from rollouts.gepa.state import Carry, GEPAState, ProposalSpec
from rollouts.gepa.stoppers import StopperState, stop_reason_of

__all__ = ["GEPAEngine"]


@dataclass
class _Slot:
    """An iteration in flight. `gate` holds a speculative one back before its child evaluation."""

    done: trio.Event = field(default_factory=trio.Event)
    parent_done: trio.Event = field(default_factory=trio.Event)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    gate: trio.Event | None = None
    outcome: ProposalOutcome | None = None


class GEPAEngine:
    """Runs GEPA over an adapter. Most users call `optimize()`, which builds one."""

    def __init__(
        self,
        adapter: GEPAAdapter,
        seed_candidate: Mapping[str, str],
        trainset: Sequence[Mapping[str, Any]],
        valset: Sequence[Mapping[str, Any]],
        config: GEPAConfig,
        *,
        reflection_endpoint: Endpoint | None = None,
        run_dir: str | Path | None = None,
        callbacks: Sequence[GEPACallback] = (),
        data_fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        if not seed_candidate or not all(isinstance(v, str) for v in seed_candidate.values()):
            raise ConfigurationError("the seed candidate must map at least one component name to its text")
        if not trainset:
            raise ConfigurationError("the training set is empty: GEPA needs instances to reflect on")
        if not valset:
            raise ConfigurationError("the validation set is empty")
        if reflection_endpoint is None and getattr(adapter, "propose_new_texts", None) is None:
            raise ConfigurationError(
                "GEPA needs a reflection model: pass reflection_endpoint (any Endpoint), or an adapter with propose_new_texts"
            )
        if config.max_metric_calls is None and not config.stoppers and config.timeout_s is None:
            raise ConfigurationError(
                "give max_metric_calls (the budget), a stopper or timeout_s: otherwise GEPA never stops"
            )
        self.adapter = adapter
        self.seed_candidate: Candidate = dict(seed_candidate)
        self.components = list(self.seed_candidate)
        self.trainset = list(trainset)
        self.valset = list(valset)
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._lock: DirectoryLock | None = None  # held on run_dir while run() runs
        self.callbacks = tuple(callbacks)
        self.candidate_selector = candidate_selector(config.candidate_selection)
        self.component_selector = component_selector(config.component_selection)
        self.sampler = EpochShuffledBatchSampler(config.reflection_minibatch_size)
        self._first_stage = first_stage(len(valset), config)
        self.fingerprint = {**config.fingerprint(), **(data_fingerprint or {}), "seed_candidate": self.seed_candidate}
        self.journal = ReflectionJournal(self.run_dir / REFLECTIONS_FILE if self.run_dir else None)
        self.cache = EvaluationCache(
            self.run_dir / CACHE_FILE if self.run_dir else None,
            scoring=_scoring_fingerprint(adapter, data_fingerprint or {}),
            window=config.proposals_in_flight,
            enabled=config.cache_evaluations,
            encode=getattr(adapter, "encode_trajectory", None),
            decode=getattr(adapter, "decode_trajectory", None),
        )
        self._eval_counts: dict[str, tuple[int, int]] = {}
        self._held: dict[int, list[GEPAEvent]] = {}  # a speculative iteration's events, until it is resolved
        self._release: tuple[int, GEPAEvent | None] | None = None
        self.proposer = Proposer(
            adapter,
            self.trainset,
            self.valset,
            reflection_endpoint=reflection_endpoint,
            reflection_prompt=config.reflection_prompt,
            journal=self.journal,
            cache=self.cache,
            skip_perfect_score=config.skip_perfect_score,
            perfect_score=config.perfect_score,
            on_evaluation=self._on_evaluation,
            on_reflection=self._on_reflection,
        )
        self.state = GEPAState(valset_size=len(self.valset), seed=config.seed, budget=Budget(config.max_metric_calls))
        self._inflight: deque[tuple[ProposalSpec, _Slot]] = deque()
        self._nursery: trio.Nursery | None = None
        self._saves = 0
        self._save_lock = trio.Lock()
        self._started = time.monotonic()

    # ---- events -------------------------------------------------------------------------------

    def _event(self, kind: Any, message: str, iteration: int | None, data: dict[str, Any]) -> GEPAEvent:
        s = self.state
        has = bool(s.candidates)
        return GEPAEvent(
            kind=kind,
            iteration=s.iteration if iteration is None else iteration,
            metric_calls=s.budget.shown,
            max_metric_calls=self.config.max_metric_calls,
            best_score=s.best_score if has else 0.0,
            best_idx=s.best_idx if has else 0,
            candidates=len(s.candidates),
            message=message,
            data=data,
        )

    async def _emit(self, kind: Any, message: str = "", *, iteration: int | None = None, **data: Any) -> None:
        if not self.callbacks:
            return
        event = self._event(kind, message, iteration, data)
        held = self._held.get(event.iteration)
        if held is not None and kind in ("evaluation", "reflection"):
            held.append(event)  # (a speculative iteration's: told once the iteration it overlaps has ended)
            return
        await emit_event(self.callbacks, event)

    async def _release_held(self) -> None:
        """Tell the events of the speculative iteration just resolved: its start, what it did so
        far and, when it was dropped, that it was. Called right after the event of what it
        overlapped (`seed_evaluated`, `iteration_end`), so no two iterations are ever open at once
        in the events (with proposals_in_flight=1) and each event falls between its own
        iteration's start and end."""
        if self._release is None:
            return
        iteration, closing = self._release
        self._release = None
        held = self._held.get(iteration, [])
        while held:
            await emit_event(self.callbacks, held.pop(0))
        self._held.pop(iteration, None)  # (no await since the list was found empty: nothing is lost)
        if closing is not None:
            await emit_event(self.callbacks, closing)

    async def _on_evaluation(self, eval_id: str, iteration: int, result: CachedEvaluation) -> None:
        self.state.budget.finished(result.calls)
        self._eval_counts[eval_id] = (result.calls, result.saved)
        await self._emit(
            "evaluation",
            eval_id,
            iteration=iteration,
            eval_id=eval_id,
            n=len(result.batch.scores),
            calls=result.calls,
            saved=result.saved,
            scores=list(result.batch.scores),
        )

    async def _on_reflection(self, iteration: int, component: str, old: str, new: str) -> None:
        await self._emit(
            "reflection", f"it {iteration}: new {component}", iteration=iteration, component=component, old=old, new=new
        )

    # ---- state --------------------------------------------------------------------------------

    def _load(self) -> None:
        if self.run_dir is None:
            self._init_state()
            return
        self._lock = DirectoryLock.acquire(self.run_dir, "GEPA run_dir")  # one writer (released by run())
        self.journal.open()
        self.cache.open()
        saved = load_state(self.run_dir)
        if saved is None:
            self._init_state()
            return
        if saved.fingerprint != self.fingerprint:
            diff = sorted(k for k in set(saved.fingerprint) | set(self.fingerprint)
                          if saved.fingerprint.get(k) != self.fingerprint.get(k))  # fmt: skip
            raise ConfigurationError(
                f"run_dir {str(self.run_dir)!r} holds a GEPA run with different settings ({', '.join(diff)}): "
                "resume it with the same arguments, or use another run_dir"
            )
        saved.budget.limit = self.config.max_metric_calls  # (the budget may change on resume)
        if saved.budget.below_spent():
            raise ConfigurationError(
                f"run_dir {str(self.run_dir)!r} holds a GEPA run that has already spent {saved.budget.spent} "
                f"metric calls, more than the budget of {self.config.max_metric_calls} given now: there is "
                f"nothing left to run. To continue it, give a budget above {saved.budget.spent} "
                "(max_metric_calls, --budget); its result so far is in result.json"
            )
        self.state = saved
        self.state.front_type = self.config.frontier_type
        self.cache.set_horizon(saved.cache_records)

    def _release_lock(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def _init_state(self) -> None:
        self.state = GEPAState(
            valset_size=len(self.valset),
            seed=self.config.seed,
            rng=random.Random(self.config.seed),
            budget=Budget(self.config.max_metric_calls),
        )
        self.state.fingerprint = dict(self.fingerprint)
        self.state.front_type = self.config.frontier_type

    def _checkpoint(self) -> None:
        """Save the state as it is now, in the background: the run goes on while the file is
        written, writes happen in order, and one overtaken by a newer state is skipped. (A crash
        before the latest write resumes from an earlier checkpoint; the logs make that exact.)"""
        if self.run_dir is None:
            return
        self._saves += 1
        assert self._nursery is not None
        self.state.cache_records = self.cache.count
        self._nursery.start_soon(self._save, self._saves, self.state.to_dict())

    async def _save(self, number: int, data: dict[str, Any]) -> None:
        assert self.run_dir is not None
        async with self._save_lock:
            if number < self._saves:
                return  # a newer state is waiting to be written
            with trio.CancelScope(shield=True):  # a checkpoint is written whole or not at all
                await save_state(self.run_dir, data)
        await self._emit("checkpoint", str(self.run_dir / "state.json"), iteration=data["iteration"])

    # ---- validation evaluations ---------------------------------------------------------------

    async def _evaluate_val(
        self,
        candidate: Candidate,
        eval_id: str,
        iteration: int,
        known: Mapping[int, float],
        known_obj: Mapping[int, Any],
        meanwhile: Callable[[], trio.Event | None] | None = None,
        only: Sequence[int] | None = None,
    ) -> tuple[dict[int, float], dict[int, dict[str, float]]]:
        """Scores on the validation instances not in `known`, cut to the budget left (instances
        the cache answers cost nothing and are never cut). The calls are reserved first; then
        `meanwhile()` may start work that runs alongside (and return an event to wait for before
        this evaluation starts). `only`: these validation instances, not all of them."""
        s = self.state
        left = s.budget.cut(len(self.valset))
        todo: list[int] = []
        costing = 0
        for k in range(len(self.valset)) if only is None else sorted(only):
            if k in known:
                continue
            if self.cache.would_cost(candidate, self.valset[k], eval_id=eval_id, iteration=iteration):
                if costing >= left:
                    continue
                costing += 1
            todo.append(k)
        s.budget.reserve(costing)
        first = meanwhile() if meanwhile is not None else None
        if first is not None:
            # The iteration started early evaluates its parent on the minibatch first (a few
            # rollouts that gate its reflection), then this evaluation runs alongside that
            # reflection: the minibatch gets the model-call slots at once instead of queueing
            # behind a whole validation set.
            await first.wait()
        scores, objectives = dict(known), {k: dict(v) for k, v in known_obj.items()}
        used = 0
        if todo:
            evaluated = await self.proposer.evaluate(
                [self.valset[k] for k in todo], candidate, capture=False, eval_id=eval_id, iteration=iteration
            )
            batch = evaluated.batch
            scores.update((k, float(x)) for k, x in zip(todo, batch.scores, strict=True))
            if batch.objective_scores is not None:
                objectives.update((k, dict(o)) for k, o in zip(todo, batch.objective_scores, strict=True))
            used = evaluated.calls
            s.calls_saved += evaluated.saved
        s.budget.settle(reserved=costing, used=used)
        return scores, objectives

    async def _evaluate_seed(self) -> str:
        speculation: tuple[ProposalSpec, _Slot] | None = None

        def meanwhile() -> trio.Event | None:
            nonlocal speculation
            speculation = self._speculate(0, self.seed_candidate, ())
            return speculation[1].parent_done if speculation is not None else None

        scores, objectives = await self._evaluate_val(self.seed_candidate, "seed-val", 0, {}, {}, meanwhile)
        record = CandidateRecord(
            idx=0,
            components=dict(self.seed_candidate),
            val_scores=scores,
            val_objectives=objectives,
            valset_size=len(self.valset),
        )
        if self.config.frontier_type != "instance" and scores and not any(objectives.values()):
            raise ConfigurationError(
                f"frontier_type {self.config.frontier_type!r} needs per-objective scores, but the adapter "
                f"returned none for the seed: use frontier_type 'instance', or return objective_scores "
                "(RolloutsAdapter reports each Metric of the score function's Score)"
            )
        self.state.add_candidate(record)
        await self._emit("seed_evaluated", iteration=0, score=record.val_score, complete=record.complete)
        note = await self._resolve(speculation, 0)
        await self._release_held()
        return note

    # ---- planning -----------------------------------------------------------------------------

    def _stopper_state(self) -> StopperState:
        s = self.state
        return StopperState(
            iteration=s.iteration,
            metric_calls=s.metric_calls,
            max_metric_calls=self.config.max_metric_calls,
            best_score=s.best_score,
            best_idx=s.best_idx if s.candidates else 0,
            candidates=len(s.candidates),
            iterations_since_improvement=s.iteration - s.last_improvement,
            elapsed_s=time.monotonic() - self._started,
        )

    def _should_stop(self) -> str | None:
        if self.state.reflection_failures >= self.config.max_reflection_failures:
            return "reflection_failed"
        if self.state.idle_iterations >= self.config.max_idle_iterations:
            return "no_new_evaluations"
        snapshot = self._stopper_state()
        for stopper in self.config.stoppers:
            if stopper(snapshot):
                return stop_reason_of(stopper)
        return None

    def _minibatch_need(self) -> int:
        return 2 * self.sampler.batch_size(len(self.trainset))

    def _plan(self) -> ProposalSpec | None:
        """The next iteration, or None when the budget left cannot pay for one."""
        s, cfg = self.state, self.config
        it = s.iteration + 1
        if cfg.use_merge and s.merges_due > 0 and s.last_found_new and s.carry is None:
            s.last_found_new = False
            merge = plan_merge(s, s.rng)
            if merge is not None:
                (i, j, a), merged = merge
                instances = merge_subsample(s, i, j, cfg.merge_subsample_size, s.rng)
                if instances and s.budget.covers(len(instances)):
                    s.merges_due -= 1
                    s.merges_tried += 1
                    s.iteration = it
                    s.budget.reserve(len(instances))
                    return ProposalSpec(
                        it, "merge", (i, j, a), tuple(instances), merged=merged, known=len(s.candidates),
                        reserved=len(instances),
                    )  # fmt: skip
        need = self._minibatch_need()
        if not s.budget.covers(need):
            return None
        carry, s.carry = s.carry, None
        parent = carry.parent if carry is not None else None
        if parent is None:
            parent = self.candidate_selector.select(s, s.rng)
        assert 0 <= parent < len(s.candidates), f"candidate selector returned {parent}"
        components = self._components(parent)
        if carry is not None:
            minibatch = carry.minibatch
        else:
            minibatch = tuple(self.sampler.next(s, len(self.trainset)))
        s.iteration = it
        s.budget.reserve(need)
        return ProposalSpec(it, "mutation", (parent,), minibatch, components, known=len(s.candidates), reserved=need)

    def _components(self, parent: int) -> tuple[str, ...]:
        components = tuple(self.component_selector.select(self.state, parent, self.components))
        unknown = [c for c in components if c not in self.seed_candidate]
        assert components and not unknown, f"component selector returned {components}"
        return components

    # ---- speculation --------------------------------------------------------------------------

    def _speculate(self, new_idx: int, texts: Candidate, parents: tuple[int, ...]) -> tuple[ProposalSpec, _Slot] | None:
        """Start the next iteration on candidate `new_idx` (about to join the pool) before the
        selection can confirm it; None when that is not possible or not wanted."""
        s, cfg = self.state, self.config
        if not cfg.speculative or cfg.proposals_in_flight > 1 or self._inflight or s.carry is not None:
            return None
        if cfg.use_merge and s.merges_due > 0 and s.last_found_new:
            return None  # the next iteration is a merge
        need = self._minibatch_need()
        if not s.budget.covers(need) or self._should_stop() is not None:
            return None
        if len(s.component_cursor) == new_idx:
            s.component_cursor.append(s.initial_cursor(parents))
        components = self._components(new_idx)
        minibatch = tuple(self.sampler.next(s, len(self.trainset)))
        spec = ProposalSpec(
            s.iteration + 1,
            "mutation",
            (new_idx,),
            minibatch,
            components,
            known=new_idx,
            reserved=need,
            texts=dict(texts),
        )
        s.budget.reserve(need)
        if self.callbacks:
            start = self._event(
                "iteration_start",
                f"mutation of [{new_idx}] (started early: #{new_idx} is not confirmed as parent yet)",
                spec.iteration,
                {"spec": spec.to_dict(), "speculative": True},
            )
            self._held[spec.iteration] = [start]
        slot = _Slot(gate=trio.Event())
        assert self._nursery is not None
        self._nursery.start_soon(self._run_slot, spec, slot)
        return spec, slot

    async def _resolve(self, speculation: tuple[ProposalSpec, _Slot] | None, new_idx: int) -> str:
        """Now that candidate `new_idx` is in the pool: keep the speculative iteration if the
        selection picks it as parent, else drop it (its minibatch evaluation is spent)."""
        if speculation is None:
            return ""
        spec, slot = speculation
        s = self.state
        stop = self._should_stop()
        parent = None if stop is not None else self.candidate_selector.select(s, s.rng)
        if parent == new_idx:
            s.iteration = spec.iteration
            s.pending.append(spec)
            self._inflight.append((spec, slot))
            assert slot.gate is not None
            slot.gate.set()
            self._release = (spec.iteration, None)
            return ""
        await slot.parent_done.wait()
        slot.scope.cancel()
        await slot.done.wait()
        n, saved = self._eval_counts.pop(parent_eval_id(spec.iteration, new_idx), (len(spec.instances), 0))
        s.budget.settle(reserved=spec.reserved, used=n)
        s.speculation_calls += n
        s.calls_saved += saved
        s.carry = Carry(parent, spec.instances)
        why = f"stopping ({stop})" if stop is not None else f"the selection chose #{parent}"
        if self.callbacks:
            dropped = self._event(
                "iteration_dropped",
                f"iteration {spec.iteration} started early on #{new_idx} was dropped ({why}: {n} calls spent)",
                spec.iteration,
                {"spec": spec.to_dict(), "reason": why, "calls": n, "chosen_parent": parent},
            )
            self._release = (spec.iteration, dropped)
        return f"; the iteration started early on #{new_idx} was dropped ({why}: {n} calls spent)"

    async def _run_slot(self, spec: ProposalSpec, slot: _Slot) -> None:
        with slot.scope, _tracing.gepa_iteration(spec.iteration, spec.kind):
            slot.outcome = await self.proposer.run(self.state, spec, gate=slot.gate, parent_done=slot.parent_done)
        slot.parent_done.set()
        slot.done.set()

    def _start(self, spec: ProposalSpec) -> None:
        slot = _Slot()
        self._inflight.append((spec, slot))
        assert self._nursery is not None
        self._nursery.start_soon(self._run_slot, spec, slot)

    # ---- committing ---------------------------------------------------------------------------

    async def _commit(self, spec: ProposalSpec, out: ProposalOutcome) -> None:
        s, cfg = self.state, self.config
        spent_before = s.metric_calls
        s.budget.settle(reserved=spec.reserved, used=out.calls)
        s.calls_saved += out.saved
        status, message, new_idx = out.status, out.message, None
        proposed: dict[str, str] = {}
        if status == "evaluated":
            assert out.child is not None
            accepted = (
                sum(out.child_scores) >= sum(out.parent_scores)
                if spec.kind == "merge"
                else cfg.acceptance(out.parent_scores, out.child_scores)
            )
            duplicate = s.known_index(out.child)
            what = "merge" if spec.kind == "merge" else f"#{spec.parents[0]}"
            score_text = f"{_mean(out.parent_scores):.2f} -> {_mean(out.child_scores):.2f}"
            if not accepted:
                status, message = "rejected", f"{what} on {len(spec.instances)}: {score_text} rejected"
                base = s.candidates[spec.parents[0]].components
                proposed = {n: t for n, t in out.child.items() if t != base.get(n)}
            elif duplicate is not None:
                status, message = "unchanged", f"{what}: the child equals candidate #{duplicate}"
            else:
                status = "accepted"
                new_idx = len(s.candidates)
                message = await self._accept(spec, out, new_idx, f"{what} on {len(spec.instances)}: {score_text}")
        s.reflection_failures = s.reflection_failures + 1 if status == "reflection_failed" else 0
        s.idle_iterations = s.idle_iterations + 1 if s.metric_calls == spent_before else 0
        record = IterationRecord(
            iteration=spec.iteration,
            kind="merge" if spec.kind == "merge" else "mutation",
            outcome=status,  # type: ignore[arg-type]
            parents=spec.parents,
            instances=spec.instances,
            components=spec.components,
            parent_scores=out.parent_scores,
            child_scores=out.child_scores,
            new_candidate=new_idx,
            metric_calls=s.metric_calls,
            message=message,
            proposed=proposed,
        )
        s.history.append(record)
        s.pending = [p for p in s.pending if p.iteration != spec.iteration]
        await self._emit("iteration_end", message, iteration=spec.iteration, record=record)
        await self._release_held()

    async def _accept(self, spec: ProposalSpec, out: ProposalOutcome, new_idx: int, what: str) -> str:
        """Evaluate an accepted child on the validation set, add it, and say so."""
        s, cfg = self.state, self.config
        assert out.child is not None
        child = out.child
        known: dict[int, float] = {}
        known_obj: dict[int, Any] = {}
        if spec.kind == "merge":  # the screening scores are validation scores already
            known = dict(zip(spec.instances, out.child_scores, strict=True))
            known_obj = dict(zip(spec.instances, out.child_objectives, strict=False))
        else:
            s.last_found_new = True
            if cfg.use_merge and s.merges_tried + s.merges_due < cfg.max_merge_invocations:
                s.merges_due += 1
        parents = spec.parents[:2]
        speculation: tuple[ProposalSpec, _Slot] | None = None

        def meanwhile() -> trio.Event | None:
            nonlocal speculation
            speculation = self._speculate(new_idx, child, parents)
            return speculation[1].parent_done if speculation is not None else None

        eval_id = f"it{spec.iteration:04d}-val-c{new_idx}"
        stopped, skip_rest = "", False
        if cfg.val_evaluation_policy == "incremental" and spec.kind == "mutation":
            # First the first-stage rows; the rest only when the child can still join the front.
            known, known_obj = await self._evaluate_val(
                child, f"{eval_id}-first", spec.iteration, known, known_obj, only=self._first_stage
            )
            skip_rest = len(known) < len(self._first_stage)  # (the budget ran out)
            if not skip_rest and not self._can_join(known):  # (and no speculation on it)
                stopped, skip_rest = f" (scored on {len(known)}/{len(self.valset)}: it cannot join the front)", True
        if skip_rest:
            scores, objectives = known, known_obj
        else:
            scores, objectives = await self._evaluate_val(child, eval_id, spec.iteration, known, known_obj, meanwhile)
        base = s.candidates[parents[0]].components
        previous_best = s.best_score
        s.add_candidate(
            CandidateRecord(
                idx=new_idx,
                components=child,
                parents=parents,
                origin="merge" if spec.kind == "merge" else "mutation",
                iteration=spec.iteration,
                changed=tuple(n for n in self.components if child.get(n) != base.get(n)),
                val_scores=scores,
                val_objectives=objectives,
                valset_size=len(self.valset),
                screened_out=bool(stopped),
            )
        )
        record = s.candidates[new_idx]
        if s.best_idx == new_idx and record.val_score > previous_best:
            s.last_improvement = spec.iteration
            await self._emit(
                "new_best", f"#{new_idx} {record.val_score:.3f}", iteration=spec.iteration, candidate=new_idx
            )
        cut = stopped or ("" if record.complete else f" (on {len(scores)}/{len(self.valset)}: the budget ran out)")
        note = await self._resolve(speculation, new_idx)
        return f"{what} accepted as #{new_idx}, valset {record.val_score:.3f}{cut}{note}"

    def _can_join(self, scores: Mapping[int, float]) -> bool:
        """Whether a child scored on the first-stage rows can still join the front: it beats the
        front's best score on one of them (a new record there), or its mean there is at least the
        best candidate's (it could become the best). A tie alone does not count: everyone ties
        where nobody scores."""
        s = self.state
        best = s.front.best
        if any(best[k] is None or x > best[k] for k, x in scores.items()):  # type: ignore[operator]
            return True
        leader = s.candidates[s.best_idx].val_scores
        mine = [x for k, x in scores.items() if k in leader]
        return bool(mine) and sum(mine) >= sum(leader[k] for k in scores if k in leader)

    # ---- the run ------------------------------------------------------------------------------

    async def _loop(self) -> str:
        s, w = self.state, self.config.proposals_in_flight
        stop: str | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if not s.candidates:
                await self._evaluate_seed()
                self._checkpoint()
            else:
                for spec in s.pending:  # planned before the checkpoint we resumed from
                    self._start(spec)
            while True:
                while stop is None and len(self._inflight) < w:
                    stop = self._should_stop()
                    if stop is not None:
                        break
                    planned = self._plan()
                    if planned is None:
                        stop = "budget"
                        break
                    s.pending.append(planned)
                    await self._emit(
                        "iteration_start", f"{planned.kind} of {list(planned.parents)}", spec=planned.to_dict()
                    )
                    self._start(planned)
                if not self._inflight:
                    break
                spec, slot = self._inflight.popleft()
                await slot.done.wait()
                assert slot.outcome is not None
                await self._commit(spec, slot.outcome)
                self._checkpoint()
            self._nursery = None
        assert stop is not None
        return stop

    async def run(self, cancel_scope: trio.CancelScope | None = None) -> GEPAResult:
        """Run (or resume) to the end. Cancelling `cancel_scope`, or reaching `timeout_s`,
        ends the run at once with the best candidate so far; outside cancellation propagates
        (the last checkpoint stays)."""
        try:
            self._load()
        except BaseException:
            self._release_lock()
            raise
        self._started = time.monotonic()
        scope = cancel_scope if cancel_scope is not None else trio.CancelScope()
        if self.config.timeout_s is not None:
            scope.deadline = min(scope.deadline, trio.current_time() + self.config.timeout_s)
        notes = [note for note in (_clear_stale(stopper) for stopper in self.config.stoppers) if note]
        await self._emit(
            "run_start",
            f"{'resuming' if self.state.candidates else 'starting'}: {len(self.trainset)} train, "
            f"{len(self.valset)} val, budget {self.config.max_metric_calls}"
            + (f", run dir {self.run_dir}" if self.run_dir else "")
            + "".join(f"; {note}" for note in notes),
            notes=notes,
        )
        stop = "cancelled"
        try:
            with scope:
                stop = await self._loop()
            if scope.cancelled_caught:
                stop = "timeout" if trio.current_time() >= scope.deadline else "cancelled"
        finally:
            self.journal.close()
            self.cache.close()
            self._release_lock()
        if not self.state.candidates:  # cancelled before the seed was evaluated
            self.state.add_candidate(CandidateRecord(0, dict(self.seed_candidate), valset_size=len(self.valset)))
        result = self.state.to_result(stop, self.config.max_metric_calls, str(self.run_dir) if self.run_dir else None)
        if self.state.budget.live:  # evaluations of iterations cancelled in flight were spent too
            result = replace(result, metric_calls=self.state.budget.shown)
        await self._emit("run_end", result.summary().replace("\n", "; "), result=result)
        return result


def _clear_stale(stopper: Any) -> str | None:
    """A stopper's `clear_stale()` (FileStopper: remove a stop file an earlier run left), if any."""
    clear = getattr(stopper, "clear_stale", None)
    return clear() if callable(clear) else None


def first_stage(n_val: int, config: GEPAConfig) -> tuple[int, ...]:
    """The validation rows the incremental policy scores a new candidate on first: a fixed
    seeded sample (the same for every candidate of the run), in index order."""
    if config.val_evaluation_policy != "incremental" or n_val == 0:
        return ()
    k = config.val_first_stage if config.val_first_stage is not None else max(1, -(-n_val // 4))
    return tuple(sorted(random.Random(f"first-stage-{config.seed}").sample(range(n_val), min(k, n_val))))


def _scoring_fingerprint(adapter: Any, data_fingerprint: Mapping[str, Any]) -> str:
    """What decides a score besides the candidate and the row: the task's fingerprint (endpoint,
    environment, max_turns, score function) for a RolloutsAdapter, an adapter's own
    `scoring_fingerprint` when it has one, and the adapter's type."""
    parts = {k: v for k, v in data_fingerprint.items() if k.startswith("task.")}
    parts["adapter"] = f"{type(adapter).__module__}.{type(adapter).__qualname__}"
    own = getattr(adapter, "scoring_fingerprint", None)
    if own is not None:
        parts["own"] = own() if callable(own) else own
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
