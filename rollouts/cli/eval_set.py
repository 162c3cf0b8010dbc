"""`rollouts eval-set`: several tasks x several models into one directory, compared.

Every TASK (a dataset file or a built-in dataset, as `rollouts eval` takes) runs with every model
of `--models`, each pair as `rollouts eval` would run it, into `--output DIR/<task>/<model>/`,
with `DIR/index.json` listing them all. All pairs run at once under one `--max-concurrent` limit
(samples running across the whole set). Running the same command again resumes every pair: only
what is missing runs. The comparison table prints, per task, each model's mean reward with a
bootstrap 95% interval, its metrics and (with --epochs) the epoch reducers.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rollouts.cli.common import CLIError, HelpFormatter, add_env_args, add_model_args, get_config, stopped_by_ctrl_c
from rollouts.cli.eval import add_epoch_args, eval_config_from_args
from rollouts.cli.mcp_args import add_mcp_args
from rollouts.cli.tasks import add_task_args, check_minimums, results_root, slug
from rollouts.errors import ConfigurationError

if TYPE_CHECKING:
    from rollouts.eval.sets import EvalSetResult, EvalTask

EXAMPLES = """\
examples:
  rollouts eval-set gsm8k.jsonl arith.jsonl --models openai/gpt-4.1-mini,anthropic/claude-haiku-4-5 --score numeric_match
  rollouts eval-set humaneval --models local/qwen2.5-coder-0.5b,local/qwen2.5-coder-1.5b --epochs 5 --output runs/he
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "eval-set",
        help="run several datasets with several models into one compared set",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("tasks", nargs="+", metavar="TASK", help="dataset files (.jsonl/.csv) or built-in dataset names")
    p.add_argument(
        "--models",
        metavar="M1,M2,...",
        help="the models, comma-separated (provider/model or endpoint names from rollouts.toml); or one with --model",
    )
    add_model_args(p)
    add_env_args(p)
    add_mcp_args(p)
    g = p.add_argument_group("evaluation")
    add_task_args(g, system_prompt_help="system prompt added before each row's messages")
    g.add_argument("--max-samples", type=int, metavar="N", help="evaluate only the first N rows of each task")
    g.add_argument("--provider-retries", type=int, metavar="N", help="as for rollouts eval")
    add_epoch_args(g)
    g.add_argument("--output", metavar="DIR", help="the set's directory (default: <results dir>/set-<tasks>)")
    g.add_argument(
        "--bootstrap-samples", type=int, default=1000, metavar="N", help="bootstrap resamples (default 1000)"
    )
    g.add_argument("--json", action="store_true", help="print the index (pairs and comparison) as JSON")
    p.set_defaults(func=main)
    return p


def _models(args: argparse.Namespace) -> list[str]:
    models = [m.strip() for m in (args.models or "").split(",") if m.strip()]
    if args.model:
        models.append(args.model)
    if not models:
        raise CLIError("give the models: rollouts eval-set TASK... --models provider/model,provider/model")
    return list(dict.fromkeys(models))


def _pair_args(args: argparse.Namespace, task: str, model: str) -> argparse.Namespace:
    """The arguments `rollouts eval TASK -m MODEL` would have had."""
    a = copy.copy(args)
    a.dataset, a.model = task, model
    a.name, a.rescore, a.overwrite, a.no_progress, a.workers, a.list_scorers = None, False, False, True, None, False
    return a


def _task_name(task: str) -> str:
    return slug(Path(task).stem if Path(task).suffix in (".jsonl", ".csv", ".json") else task)


def build_set(args: argparse.Namespace) -> tuple[list[EvalTask], list[Any]]:
    """The tasks (each with the config its first model gives; evaluate_set swaps the endpoint)
    and the models' endpoints."""
    from rollouts.cli.eval import dataset_of
    from rollouts.eval.sets import EvalTask

    models = _models(args)
    tasks: list[EvalTask] = []
    endpoints: list[Any] = []
    names = [_task_name(t) for t in args.tasks]
    if len(set(names)) != len(names):
        raise CLIError(f"two tasks have the same name {names}: rename a file")
    for task, name in zip(args.tasks, names, strict=True):
        configs = [eval_config_from_args(_pair_args(args, task, m)) for m in models]
        if not endpoints:
            endpoints = [c.endpoint for c in configs]
        pair_args = _pair_args(args, task, models[0])
        tasks.append(EvalTask(name, functools.partial(dataset_of, pair_args), replace(configs[0], eval_name=name)))
    return tasks, endpoints


async def _run(
    tasks: list[EvalTask], endpoints: list[Any], out: Path, limit: int, resamples: int
) -> EvalSetResult | None:
    from rollouts.eval.sets import PairResult, evaluate_set

    def said(pair: PairResult) -> None:
        counts = pair.report.summary["counts"] if pair.report is not None else None
        done = f"{counts['completed']}/{counts['total']} completed" if counts else pair.error
        print(f"  {pair.task} x {pair.model}: {pair.status} ({done})", file=sys.stderr, flush=True)

    result = None
    async with stopped_by_ctrl_c("finished samples are kept (run again to resume)") as (scope, pressed):
        with scope:
            result = await evaluate_set(
                tasks, endpoints, out, max_concurrent=limit, bootstrap_samples=resamples, on_pair_end=said
            )
    return None if pressed.is_set() else result


def main(args: argparse.Namespace) -> int:
    check_minimums(args, {"max_concurrent": 1, "max_samples": 0, "max_turns": 1, "provider_retries": 0})
    if args.bootstrap_samples < 1:
        raise CLIError("--bootstrap-samples must be at least 1")
    try:
        tasks, endpoints = build_set(args)
    except ConfigurationError as e:
        raise CLIError(str(e)) from None
    config = get_config()
    out = (
        Path(args.output).expanduser()
        if args.output
        else results_root(config) / slug("set-" + "-".join(t.name for t in tasks))
    )
    limit = args.max_concurrent or int(config.defaults.get("max_concurrent") or tasks[0].config.max_concurrent)
    print(f"{len(tasks)} tasks x {len(endpoints)} models into {out} ({limit} samples at a time)", file=sys.stderr)
    result = trio.run(_run, tasks, endpoints, out, limit, args.bootstrap_samples)
    if result is None:
        print(f"interrupted: run the same command again to resume ({out})", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
    else:
        print(result.format())
        print(f"\nset: {out}  (index.json; each pair in <task>/<model>/)")
    return 0 if all(p.status == "completed" for p in result.pairs) else 1
