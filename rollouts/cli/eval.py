"""`rollouts eval`: run a dataset (JSONL or CSV) through an agent, score it, keep the results.

Results go to `--output DIR` (default: `<results dir>/<dataset>-<model>`): `samples.jsonl`
grows as samples finish and `report.json` holds the summary. Running the same command again
resumes: finished samples are reused and only missing or failed ones run.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from rollouts.cli.common import (
    CLIError,
    HelpFormatter,
    add_env_args,
    add_model_args,
    check_model_available,
    get_config,
    load_callable,
    model_config_from_args,
    read_system_prompt,
)
from rollouts.cli.tasks import (
    add_task_args,
    builtin_scorers,
    check_minimums,
    environment_factory,
    given_settings,
    load_dataset,
    resolve_scorer,
    results_root,
    slug,
    with_system_prompt,
)

EXAMPLES = """\
examples:
  rollouts eval data.jsonl -m openai/gpt-4.1 --score exact_match
  rollouts eval data.csv -m anthropic/claude-sonnet-4-5 --score my_evals:score --max-concurrent 32
  rollouts eval math.jsonl -m scripted/calculator --env calculator --score my_evals:score --output runs/math
  rollouts eval data.jsonl -m local/qwen2.5-coder-0.5b --prepare my_evals:prepare --max-samples 20

rows: each row is a JSON object (or CSV line). By default the user message is the row's
`prompt`, `question` or `input` field (or its `messages` list) and the expected answer is
`answer` or `ground_truth`; --prepare module:function turns a row into messages instead.
--score takes a built-in scorer name (see `rollouts eval --list-scorers`) or module:function
(a function Sample -> Score, sync or async). module may also be a path to a .py file.

results: --output DIR (default: ./results/<dataset>-<model>-<setting hash>, under [defaults]
results_dir in rollouts.toml or $ROLLOUTS_RESULTS_DIR; the hash covers the model's settings,
system prompt, environment, max turns and scorer, so another setting gets another directory).
Running again with the same output resumes, reusing only samples made with the same settings;
a different setting is an error naming what changed: use another --output, --rescore (only the
scorer changed: re-score the recorded trajectories) or --overwrite (start over).

exit status: 0 every sample completed, 1 some samples failed, 2 usage or configuration error,
130 interrupted by Ctrl-C (finished samples are kept; run again to resume).
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "eval",
        help="run a dataset through an agent and score it",
        description="Run every row of a dataset through an agent, score it, and keep the results (resumable).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("dataset", nargs="?", metavar="DATASET", help="a .jsonl or .csv file")
    add_model_args(p)
    add_env_args(p)
    g = p.add_argument_group("evaluation")
    add_task_args(g, system_prompt_help="system prompt added before each row's messages")
    g.add_argument("--list-scorers", action="store_true", help="list the built-in scorers and exit")
    g.add_argument("--max-samples", type=int, metavar="N", help="evaluate only the first N rows")
    g.add_argument(
        "--provider-retries",
        type=int,
        metavar="N",
        help="continue a sample that ended in a provider error up to N more times (default: EvalConfig's, 2)",
    )
    g.add_argument("--output", metavar="DIR", help="results directory (resumes when it exists)")
    again = g.add_mutually_exclusive_group()
    again.add_argument(
        "--rescore",
        action="store_true",
        help="resume with another score function: keep the recorded trajectories, run only the scoring",
    )
    again.add_argument("--overwrite", action="store_true", help="delete the results in the output directory first")
    g.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run the samples in N worker processes on this machine (same output and resume; "
        "--max-concurrent stays the total in flight). Default 1: in this process",
    )
    g.add_argument("--name", metavar="NAME", help="evaluation name (default: from the dataset and model)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--json", action="store_true", help="print the final report as JSON instead of a table")
    p.set_defaults(func=main)
    return p


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, r in enumerate(rows):
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summary_text(report: Any) -> str:
    s = report.summary
    c = s["counts"]
    head = (
        f"{report.eval_name}: {c['total']} samples [{report.status}] in {report.duration_s:.1f}s "
        f"(completed {c['completed']}, failed {c['failed']}, provider errors {c['provider_error']}, "
        f"reused {report.reused}" + (f", rescored {report.rescored}" if report.rescored else "") + ")"
    )
    rows = [["metric", "mean", "min", "max", "std"]]
    r = s["reward"]
    rows.append(["reward", _fmt(r["mean"]), _fmt(r["min"]), _fmt(r["max"]), _fmt(r["std"])])
    for name, st in s["metrics"].items():
        rows.append([name, _fmt(st["mean"]), _fmt(st["min"]), _fmt(st["max"]), _fmt(st["std"])])
    t = s["tokens"]
    parts = [("in", "input"), ("cache read", "cache_read"), ("cache write", "cache_write"), ("out", "output")]
    split = ", ".join(f"{label} {t[key]}" for label, key in parts if t.get(key) or key in ("input", "output"))
    tail = f"tokens {t['total']} ({split}), cost ${s['cost_usd']:.4f}"
    if s["turns"]["mean"] is not None:
        tail += f", turns/sample {s['turns']['mean']:.2f}"
    lines = [head, "", format_table(rows), "", tail]
    n_failed = c["failed"] + c["provider_error"]
    if n_failed:  # (report.samples reads samples.jsonl back: only when something failed)
        failed = [x for x in report.samples if x.status in ("failed", "provider_error")]
        for x in failed[:5]:
            lines.append(f"  {x.id}: {x.status}: {(x.error or '').splitlines()[0][:160] if x.error else ''}")
        if len(failed) > 5:
            lines.append(f"  ... and {len(failed) - 5} more (see samples.jsonl)")
    if report.output_dir:
        lines.append(f"results: {report.output_dir}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


async def _run(
    dataset: Any, eval_config: Any, workers: int | None = None, worker_config: Any = None
) -> tuple[Any, bool]:
    """evaluate() under a SIGINT receiver: Ctrl-C cancels it (results so far are kept)."""
    from rollouts.eval.run import evaluate, load_report

    interrupted = False
    report = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            eval_scope = trio.CancelScope()

            async def watch() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    print("\n^C stopping; finished samples are kept (run again to resume)", file=sys.stderr)
                    eval_scope.cancel()
                    return

            nursery.start_soon(watch)
            with eval_scope:
                report = await evaluate(dataset, eval_config, workers=workers, worker_config=worker_config)
            nursery.cancel_scope.cancel()
    if report is None:
        if eval_config.output_dir is None:
            return None, interrupted
        report = load_report(eval_config.output_dir)
    return report, interrupted


def main(args: argparse.Namespace) -> int:
    if args.list_scorers:
        for name, doc in sorted(builtin_scorers().items()):
            print(f"{name:18s} {doc}")
        print("combine several with commas (--score exact_match,contains), or pass module:function")
        return 0
    if not args.dataset:
        raise CLIError("give a dataset file: rollouts eval DATA.jsonl -m provider/model")
    check_minimums(args, {"max_concurrent": 1, "max_samples": 0, "max_turns": 1, "provider_retries": 0, "workers": 1})
    if args.sample_timeout is not None and args.sample_timeout <= 0:
        raise CLIError("--sample-timeout must be a positive number of seconds")
    from rollouts.eval.fingerprint import output_hash

    config = get_config()
    eval_config = eval_config_from_args(args)
    # The default directory is named by the setting too, so a different setting never resumes
    # (and never collides with) another's results.
    output = (
        Path(args.output).expanduser()
        if args.output
        else results_root(config) / f"{eval_config.eval_name}-{output_hash(eval_config)}"
    )
    eval_config = replace(eval_config, output_dir=output)
    if output.exists() and not args.json:
        print(f"{'starting over' if args.overwrite else 'resuming'} in {output}", file=sys.stderr)
    workers = args.workers if args.workers and args.workers > 1 else None
    # Worker processes rebuild the same EvalConfig from the same arguments (its callables are
    # closures: they cannot be sent to another process).
    worker_config = functools.partial(eval_config_from_args, args) if workers else None
    report, interrupted = trio.run(_run, dataset_of(args), eval_config, workers, worker_config)
    return _exit_status(args, report, interrupted)


def dataset_of(args: argparse.Namespace) -> Any:
    return load_dataset(args.dataset)


def eval_config_from_args(args: argparse.Namespace) -> Any:
    """The EvalConfig `rollouts eval` runs (without its output_dir); module level, so that
    `--workers` processes can rebuild it from the same arguments."""
    from rollouts.eval.run import EvalConfig, default_prepare_messages

    config = get_config()
    endpoint = model_config_from_args(args, config).to_endpoint()
    prepare = load_callable(args.prepare, "--prepare") if args.prepare else default_prepare_messages
    system_prompt = read_system_prompt(args, config)
    if system_prompt:
        prepare = with_system_prompt(prepare, system_prompt)
    score_fn = resolve_scorer(args.score) if args.score else None
    check_model_available(endpoint, user_modules=True)  # (after the user's modules, which may define scripted models)
    factory = environment_factory(args.env or str(config.defaults.get("env") or "basic"), args.cwd)
    name = args.name or slug(f"{Path(args.dataset).stem}-{endpoint.provider}-{endpoint.model}")
    # Only what the user set is passed: the defaults (max_concurrent 8, 2 provider retries, ...)
    # are EvalConfig's. ([defaults] max_concurrent in rollouts.toml is the user's own setting.)
    given: dict[str, Any] = {
        "max_turns": args.max_turns,
        "max_samples": args.max_samples,
        "max_concurrent": args.max_concurrent or config.defaults.get("max_concurrent"),
        "sample_timeout_s": args.sample_timeout,
        "provider_error_retries": args.provider_retries,
    }
    return EvalConfig(
        endpoint=endpoint,
        score_fn=score_fn,
        prepare_messages=prepare,
        environment_factory=factory,
        eval_name=name,
        show_progress=not args.no_progress,
        rescore=args.rescore,
        overwrite=args.overwrite,
        metadata={"dataset": str(Path(args.dataset).resolve()), "model": f"{endpoint.provider}/{endpoint.model}"},
        **given_settings(given),
    )


def _exit_status(args: argparse.Namespace, report: Any, interrupted: bool) -> int:
    if report is None:
        return 130
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print(summary_text(report))
    if interrupted or report.status == "cancelled":
        return 130
    counts = report.summary["counts"]
    if report.status != "completed" or counts["failed"] or counts["provider_error"]:
        return 1
    return 0
