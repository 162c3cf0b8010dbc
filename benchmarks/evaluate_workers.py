"""evaluate() in-process vs evaluate(..., executor=WorkerPool(N)): the same single-call samples as
benchmarks/evaluate.py (1,000 rows, 100 in flight in total, a fake OpenAI-compatible server in
its own process answering after 50 ms, lean http transport, exact-match scoring, samples.jsonl).

Runs alternate (in-process, then each worker count, `--repeats` times) so machine load hits all
alike; the best wall time of each is kept. CPU is this process's plus its reaped children's
(the worker processes), i.e. everything but the server. Worker start-up (a fresh interpreter
importing rollouts) is inside the measured time: it is what a user waits for.

Run: python benchmarks/evaluate_workers.py [--samples 1000] [--concurrency 100] [--latency 0.05]
     [--workers 2] [--repeats 2]
Last line: JSON with samples_per_s_inprocess, samples_per_s_w<N>, cpu_ms_per_sample_*,
first_result_s_* (start-up) and steady_samples_per_s_* (from the first result to the last), and
the load average. The in-process runs follow a warm-up in the same process, so their start-up
(imports: the openai SDK alone is about a second of CPU) is already paid; each worker process
pays it again at every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from rollouts import Endpoint, EvalConfig, Message, evaluate
from rollouts.eval.sample import Sample, Score
from rollouts.eval.scorers import combine, exact_match, extract_tag, metric
from rollouts.service.eval_workers import WorkerPool

_correct = combine(metric("correct", exact_match(extract=extract_tag("answer")), weight=1.0))


def prepare(row: dict[str, Any]) -> list[Message]:
    return [Message("user", f"Answer with the number in an <answer> tag: {row['n']}")]


def score(sample: Sample) -> Score:
    """Module level, so worker processes import it by reference (`evaluate_workers:score`)."""
    return _correct(sample)  # type: ignore[return-value]


def _config(base_url: str, concurrency: int, output_dir: str, on_end: Any = None) -> EvalConfig:
    return EvalConfig(
        endpoint=Endpoint("openai-compatible", "fake-model", api_base=base_url, api_key="sk-bench", transport="http"),
        prepare_messages=prepare,
        score_fn=score,
        max_concurrent=concurrency,
        max_turns=1,
        output_dir=output_dir,
        eval_name="bench-workers",
        show_progress=False,
        on_sample_end=on_end,
    )


def _cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def _timed(base_url: str, n: int, concurrency: int, workers: int | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        rows = ({"n": i, "answer": str(i)} for i in range(n))
        ends: list[float] = []
        cpu0, t0 = _cpu_s(), time.perf_counter()
        config = _config(base_url, concurrency, out, lambda s: ends.append(time.perf_counter()))
        report = await evaluate(rows, config, executor=WorkerPool(workers) if workers else None)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        lines = sum(1 for _ in (Path(out) / "samples.jsonl").open())
    counts = report.summary["counts"]
    assert counts["completed"] == n and lines == n, counts
    assert report.summary["reward"]["mean"] == 1.0
    # after the first result: the rate once start-up (worker interpreters, imports) is paid
    steady = (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and ends[-1] > ends[0] else 0.0
    return {"wall_s": wall, "cpu_s": cpu, "first_result_s": ends[0] - t0, "steady_per_s": steady}


async def _client(args: argparse.Namespace) -> dict[str, Any]:
    from evaluate import _ServerProcess  # benchmarks/evaluate.py: the fake server in a subprocess

    n, conc = args.samples, args.concurrency
    server = _ServerProcess(args.latency)
    kinds: list[int | None] = [None, *args.workers]
    runs: dict[int | None, list[dict[str, float]]] = {k: [] for k in kinds}
    try:
        await _timed(server.base_url, min(n, 200), conc, None)  # warm-up: connections, imports
        for _ in range(args.repeats):
            for kind in kinds:
                runs[kind].append(await _timed(server.base_url, n, conc, kind))
    finally:
        server.stop()
    result: dict[str, Any] = {}
    for kind in kinds:
        name = "inprocess" if kind is None else f"w{kind}"
        best = min(runs[kind], key=lambda r: r["wall_s"])
        result[f"samples_per_s_{name}"] = round(n / best["wall_s"], 1)
        result[f"cpu_ms_per_sample_{name}"] = round(best["cpu_s"] * 1e3 / n, 3)
        result[f"all_wall_s_{name}"] = [round(r["wall_s"], 3) for r in runs[kind]]
        result[f"first_result_s_{name}"] = round(best["first_result_s"], 3)
        result[f"steady_samples_per_s_{name}"] = round(max(r["steady_per_s"] for r in runs[kind]), 1)
        print(
            f"{name:9s}: {n / best['wall_s']:7.1f} samples/s (best of {[round(r['wall_s'], 2) for r in runs[kind]]} s), "
            f"CPU {best['cpu_s'] * 1e3 / n:.2f} ms/sample (this process + workers), first result after "
            f"{best['first_result_s']:.2f} s, then {best['steady_per_s']:.0f} samples/s"
        )
    result.update(
        samples=n,
        concurrency=conc,
        latency_s=args.latency,
        cpus=os.cpu_count(),
        loadavg_1m=round(os.getloadavg()[0], 2),
    )
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[2], help="e.g. 2 or 2,4")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(trio.run(_client, args)))


if __name__ == "__main__":
    # Worker processes import `score` and `prepare` by name: run them from this module under
    # its own name (functions of __main__ cannot cross to another process). benchmarks/ is
    # sys.path[0] when this file is run as a script.
    import evaluate_workers

    evaluate_workers.main()
