"""GEPA on the deterministic "arithmetic rules" task, through the real agent loop and evaluate().

The task model, scorer and reflection model are the pure functions of `arith_rules.py` (kept
outside this repository, in ../shared/bench/ by default: `--rules-file PATH` or the environment
variable GEPA_ARITH_RULES point elsewhere), wired as scripted models, so every metric call is a
real rollout (messages, streaming events, scoring) and every reflection a real model call.

It checks and prints:
* the standard configuration (train = make_dataset(20, 1000), val = make_dataset(20, 2000), the
  seed instruction, 200 metric calls, minibatch 3, seed 0): best valset score, metric calls
  used, candidates, iterations, wall time and engine overhead per metric call (a run without
  simulated latency: everything that is not the models, divided by the metric calls);
* the same with max_rules=3 (trade-offs between candidates): its best score;
* the budget: metric calls used never exceed the limit, over several seeds and budgets
  (including budgets smaller than the validation set), with and without max_rules;
* concurrency: with 5 ms per task call and 20 ms per reflection call, the wall time against
  the sum of all simulated latencies of the run.

Run: python benchmarks/gepa_arith.py [--rules-file PATH] [--proposals-in-flight N] [--quick]
The last line is one JSON object: best_val, best_val_max_rules_3, metric_calls, calls_saved_by_cache, budget,
candidates, wall_s, sum_latency_s, overhead_us_per_call (and more).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import trio

import rollouts.gepa.proposers as proposers
from rollouts import EvalConfig, Metric, Sample, Score, ScriptedModel
from rollouts.gepa import GEPAResult, RolloutsAdapter, optimize
from rollouts.providers.scripted import ScriptedRequest

RULES_ENV = "GEPA_ARITH_RULES"
DEFAULT_RULES = Path(__file__).resolve().parent.parent / ".." / "shared" / "bench" / "arith_rules.py"
_QUESTION = re.compile(r"What is (-?\d+) (\+|-|\*|/|mod|\^) (-?\d+)\?")
_names = itertools.count()


def load_rules(path: str | None) -> ModuleType:
    chosen = Path(path or os.environ.get(RULES_ENV) or DEFAULT_RULES).resolve()
    if not chosen.is_file():
        sys.exit(
            f"gepa_arith: the benchmark task {chosen} does not exist; pass --rules-file PATH or set "
            f"{RULES_ENV}=PATH to arith_rules.py"
        )
    spec = importlib.util.spec_from_file_location("arith_rules", chosen)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Busy:
    """Time during which at least one model-side operation (an evaluation through evaluate(), a
    reflection call) is running: the rest of a run's wall time is the engine's own."""

    def __init__(self) -> None:
        self.active = 0
        self.since = 0.0
        self.total = 0.0

    def enter(self) -> None:
        if self.active == 0:
            self.since = time.perf_counter()
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.total += time.perf_counter() - self.since


BUSY = Busy()
_reflect_call = proposers.call_reflection_model


async def _timed_reflection(endpoint: Any, prompt: str) -> str:
    BUSY.enter()
    try:
        return await _reflect_call(endpoint, prompt)
    finally:
        BUSY.leave()


proposers.call_reflection_model = _timed_reflection  # type: ignore[assignment]


class TimedAdapter(RolloutsAdapter):
    async def evaluate(self, batch: Any, candidate: Any, capture_traces: bool = False, *, eval_id: Any = None) -> Any:
        BUSY.enter()
        try:
            return await super().evaluate(batch, candidate, capture_traces, eval_id=eval_id)
        finally:
            BUSY.leave()


class Arith:
    """The task wired as scripted models; counts calls to sum their simulated latencies."""

    def __init__(self, rules: ModuleType, *, max_rules: int | None, task_latency: float, reflect_latency: float):
        self.rules = rules
        self.task_latency, self.reflect_latency = task_latency, reflect_latency
        self.task_calls = self.reflect_calls = 0
        n = next(_names)
        self.task = ScriptedModel(self._task, name=f"arith-task-{n}", latency_s=task_latency, chunk_size=64)
        self.reflector = ScriptedModel(
            lambda req: self._reflect(req, max_rules), name=f"arith-reflect-{n}", latency_s=reflect_latency,
            chunk_size=256,
        )  # fmt: skip

    def _task(self, req: ScriptedRequest) -> str:
        self.task_calls += 1
        m = _QUESTION.fullmatch(req.last_user_text.strip())
        assert m is not None, req.last_user_text
        row = {"a": int(m.group(1)), "op": m.group(2), "b": int(m.group(3))}
        return str(self.rules.task_model(req.system, row))

    def _reflect(self, req: ScriptedRequest, max_rules: int | None) -> str:
        self.reflect_calls += 1
        return str(self.rules.reflection_model(req.last_user_text, max_rules=max_rules))

    def score(self, sample: Sample) -> Score:
        assert sample.trajectory is not None
        system = next((m.text for m in sample.trajectory.messages if m.role == "system"), "")
        value, feedback = self.rules.score_reply(dict(sample.input), sample.response, system)
        return Score((Metric("correct", float(value), 1.0, {"feedback": feedback}),))

    def task_config(self) -> EvalConfig:
        return EvalConfig(endpoint=self.task.endpoint, score_fn=self.score, max_concurrent=64, show_progress=False)

    @property
    def sum_latency_s(self) -> float:
        return self.task_calls * self.task_latency + self.reflect_calls * self.reflect_latency


async def run_once(
    rules: ModuleType,
    *,
    budget: int = 200,
    seed: int = 0,
    max_rules: int | None = None,
    task_latency: float = 0.0,
    reflect_latency: float = 0.0,
    proposals_in_flight: int = 1,
    run_dir: str | None = None,
) -> tuple[GEPAResult, Arith, float]:
    arith = Arith(rules, max_rules=max_rules, task_latency=task_latency, reflect_latency=reflect_latency)
    train, val = rules.make_dataset(20, seed=1000), rules.make_dataset(20, seed=2000)
    BUSY.total = 0.0
    t0 = time.perf_counter()
    result = await optimize(
        rules.SEED_TEXT,
        train,
        val,
        adapter=TimedAdapter(arith.task_config()),
        reflection_endpoint=arith.reflector.endpoint,
        max_metric_calls=budget,
        reflection_minibatch_size=3,
        seed=seed,
        proposals_in_flight=proposals_in_flight,
        run_dir=run_dir,
    )
    wall = time.perf_counter() - t0
    assert arith.task_calls == result.metric_calls, (arith.task_calls, result.metric_calls)
    return result, arith, wall


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rules-file", help=f"path to arith_rules.py (default: ${RULES_ENV} or {DEFAULT_RULES})")
    parser.add_argument("--proposals-in-flight", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="fewer seeds and budgets in the budget check")
    args = parser.parse_args()
    rules = load_rules(args.rules_file)
    w = args.proposals_in_flight

    # 1. the standard configuration, no latency: quality, budget, engine overhead
    best_wall, engine_s = float("inf"), 0.0
    for _ in range(5):
        result, arith, wall = await run_once(rules, proposals_in_flight=w)
        if wall < best_wall:
            best_wall, engine_s = wall, wall - BUSY.total
    overhead_us = best_wall / max(1, result.metric_calls) * 1e6
    engine_us = engine_s / max(1, result.metric_calls) * 1e6
    print(
        f"standard: best valset {result.best_score:.3f} (candidate {result.best_idx}), metric calls "
        f"{result.metric_calls}/200 ({result.calls_saved_by_cache} saved by the cache), {len(result.candidates)} candidates, {result.iterations} iterations, "
        f"{arith.reflect_calls} reflections, stop: {result.stop_reason}"
    )
    print(f"  lineage {' -> '.join(map(str, result.lineage()))}; wall {best_wall * 1e3:.1f} ms without latency: "
          f"{overhead_us:.0f} us per metric call in all (agent loop, evaluate(), scripted models, engine), "
          f"of which the engine alone {engine_us:.0f} us")  # fmt: skip
    for h in result.history:
        print(f"    it {h.iteration:>2} {h.outcome:<16} {h.message}")

    # 2. max_rules=3
    r3, _, _ = await run_once(rules, max_rules=3, proposals_in_flight=w)
    print(
        f"max_rules=3: best valset {r3.best_score:.3f}, {r3.metric_calls}/200 calls, {len(r3.candidates)} candidates, "
        f"front sizes {sorted(len(f) for f in r3.pareto_front)[-3:]}"
    )

    # 3. the budget is never exceeded
    seeds = range(3) if args.quick else range(6)
    budgets = [1, 7, 19, 20, 21, 26, 27, 50, 99, 200, 333] if not args.quick else [7, 20, 26, 99, 200]
    worst = 0
    runs = 0
    for seed, budget, max_rules in itertools.product(seeds, budgets, (None, 3)):
        res, _, _ = await run_once(rules, budget=budget, seed=seed, max_rules=max_rules, proposals_in_flight=w)
        assert res.metric_calls <= budget, f"seed {seed} budget {budget}: used {res.metric_calls}"
        worst = max(worst, res.metric_calls - budget)
        runs += 1
    print(f"budget: {runs} runs (seeds {list(seeds)}, budgets {budgets}, max_rules None/3): never exceeded "
          f"(max over budget {worst})")  # fmt: skip

    # 4. concurrency with simulated latency
    lat, arith_l, wall_l = None, None, float("inf")
    for _ in range(5):  # the best of 5: the machine is shared
        res_l, a_l, w_l = await run_once(rules, task_latency=0.005, reflect_latency=0.020, proposals_in_flight=w)
        if w_l < wall_l:
            lat, arith_l, wall_l = res_l, a_l, w_l
    assert lat is not None and arith_l is not None
    speedup = arith_l.sum_latency_s / wall_l
    with tempfile.TemporaryDirectory() as tmp:
        _, a_d, wall_d = await run_once(
            rules, task_latency=0.005, reflect_latency=0.020, proposals_in_flight=w, run_dir=str(Path(tmp) / "run")
        )
    print(
        f"latency 5 ms/task, 20 ms/reflection: wall {wall_l:.3f} s vs sum of latencies {arith_l.sum_latency_s:.3f} s "
        f"({arith_l.task_calls} task + {arith_l.reflect_calls} reflection calls): {speedup:.2f}x; "
        f"with a run directory (checkpoints, logs) {wall_d:.3f} s: {a_d.sum_latency_s / wall_d:.2f}x"
    )
    print(
        json.dumps(
            {
                "best_val": result.best_score,
                "best_val_max_rules_3": r3.best_score,
                "metric_calls": result.metric_calls,
                "calls_saved_by_cache": result.calls_saved_by_cache,
                "budget": 200,
                "candidates": len(result.candidates),
                "iterations": result.iterations,
                "wall_s": round(wall_l, 4),
                "sum_latency_s": round(arith_l.sum_latency_s, 4),
                "speedup": round(speedup, 2),
                "wall_s_no_latency": round(best_wall, 4),
                "overhead_us_per_call": round(overhead_us, 1),
                "engine_us_per_call": round(engine_us, 1),
                "wall_s_run_dir": round(wall_d, 4),
                "budget_runs": runs,
                "proposals_in_flight": w,
            }
        )
    )


if __name__ == "__main__":
    trio.run(main)
