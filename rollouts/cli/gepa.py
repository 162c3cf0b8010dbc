"""`rollouts gepa`: evolve a system prompt (or several prompt components) with GEPA.

The task is a dataset run through an agent and scored, exactly as with `rollouts eval`; a second
model (the reflection model) reads what happened and proposes better prompts. Everything goes to
the run directory (`--output`): the checkpoint, every rollout and reflection, the best prompt
(`best_system_prompt.txt`) and the result (`result.json`). Running the same command again
resumes, and ends as if it had never stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    refuse_key_flag,
    stopped_by_ctrl_c,
)
from rollouts.cli.tasks import (
    add_task_args,
    check_minimums,
    environment_factory,
    given_settings,
    load_dataset,
    resolve_scorer,
    results_root,
    slug,
)
from rollouts.config import RolloutsConfig, resolve_model

if TYPE_CHECKING:  # (the CLI imports the library lazily, for start-up time)
    from rollouts.gepa.result import GEPAResult

EXAMPLES = """\
examples:
  rollouts gepa train.jsonl --val val.jsonl -m openai/gpt-4.1-mini --reflection-model anthropic/claude-sonnet-4-5 \\
      --score my_evals:score --system-prompt "You are a careful assistant." --budget 500
  rollouts gepa data.jsonl -m local/qwen2.5-coder-0.5b --reflection-model openai/gpt-4.1 --score exact_match \\
      --system-prompt-file prompt.txt --budget 300 --output runs/gepa-qwen
  rollouts gepa data.jsonl -m openai/gpt-4.1-mini --reflection-model openai/gpt-4.1 --score my_evals:score \\
      --candidate components.json --merge --budget 800      # several components: {"system_prompt": ..., "hint": ...}

the score function should put feedback text in its metrics' metadata ({"feedback": "..."}): the
reflection model learns from it. Components other than system_prompt are {{name}} placeholders in
the messages --prepare makes, or tool descriptions named tool:NAME.

results: --output DIR (default: <results dir>/gepa-<dataset>-<model>): state.json (checkpoint),
rollouts.jsonl, reflections.jsonl, result.json, best_candidate.json and best_<component>.txt.
Running the same command again resumes (with a --budget at least what was spent). `touch DIR/STOP`
(or --stop-file) stops after the iteration in flight (the next run removes it at its start, and
says so); Ctrl-C stops at once; both keep the best prompt so far.

exit status: 0 finished, 2 usage or configuration error, 130 interrupted by Ctrl-C.
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "gepa",
        help="evolve a prompt with GEPA",
        description="Evolve a system prompt (or several prompt components) with GEPA: reflective "
        "prompt evolution scored on your dataset. Resumable.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("dataset", metavar="TRAIN", help="training rows (.jsonl or .csv): the reflection minibatches")
    add_model_args(p)
    add_env_args(p)
    r = p.add_argument_group("reflection model")
    r.add_argument("--reflection-model", metavar="PROVIDER/MODEL", help="the model that proposes new prompts")
    r.add_argument("--reflection-api-base", metavar="URL", help="its server URL (openai-compatible)")
    r.add_argument("--reflection-api-key-env", metavar="NAME", help="read its API key from this variable")
    refuse_key_flag(r, "--reflection-api-key")
    r.add_argument("--reflection-max-tokens", type=int, metavar="N", help="its maximum output tokens")
    t = p.add_argument_group("task")
    t.add_argument("--val", metavar="FILE", help="validation rows (default: the training rows)")
    add_task_args(t, system_prompt_help="the seed system prompt")
    t.add_argument("--candidate", metavar="FILE", help="a JSON object of component name -> seed text")
    g = p.add_argument_group("search")
    g.add_argument("--budget", type=int, metavar="N", help="metric calls (rollouts of one row), never exceeded")
    g.add_argument("--minibatch", type=int, metavar="N", help="training rows per reflection (default 3)")
    g.add_argument(
        "--selection", choices=("pareto", "current_best", "epsilon_greedy"), help="parent selection (default pareto)"
    )
    g.add_argument("--components", choices=("round_robin", "all"), help="components rewritten per iteration")
    g.add_argument("--merge", action="store_true", help="also merge frontier candidates")
    g.add_argument("--seed", type=int, metavar="N", help="random seed (default 0)")
    g.add_argument("--max-iterations", type=int, metavar="N", help="stop after N iterations")
    g.add_argument("--score-threshold", type=float, metavar="X", help="stop once the best validation score >= X")
    g.add_argument("--no-improvement", type=int, metavar="N", help="stop after N iterations without a better best")
    g.add_argument("--timeout", type=float, metavar="SECONDS", help="stop at once after SECONDS")
    g.add_argument("--stop-file", metavar="PATH", help="stop when PATH exists (default: DIR/STOP)")
    o = p.add_argument_group("output")
    o.add_argument("--output", metavar="DIR", help="run directory (resumes when it exists)")
    o.add_argument("--no-progress", action="store_true", help="no progress lines")
    o.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=main)
    return p


def _seed_candidate(args: argparse.Namespace, config: RolloutsConfig) -> dict[str, str]:
    if args.candidate:
        if args.system_prompt or args.system_prompt_file:
            raise CLIError("give --candidate or --system-prompt/--system-prompt-file, not both")
        try:
            data = json.loads(Path(args.candidate).read_text(encoding="utf-8"))
        except OSError as e:
            raise CLIError(f"--candidate: cannot read {args.candidate}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise CLIError(f"--candidate {args.candidate}: not JSON ({e.msg})") from None
        if not isinstance(data, dict) or not data or not all(isinstance(v, str) for v in data.values()):
            raise CLIError(f"--candidate {args.candidate}: must be a JSON object of component name -> text")
        return data
    text = read_system_prompt(args, config)
    if not text:
        raise CLIError("give the prompt to evolve: --system-prompt TEXT, --system-prompt-file FILE or --candidate FILE")
    return {"system_prompt": text}


async def _run(kwargs: dict[str, Any]) -> tuple[GEPAResult, bool]:
    """optimize() under a SIGINT receiver: Ctrl-C ends the run with the best so far."""
    from rollouts.gepa import optimize

    async with stopped_by_ctrl_c("the best prompt so far is kept (run again to resume)") as (scope, pressed):
        result = await optimize(**kwargs, cancel_scope=scope)
    return result, pressed.is_set()


def main(args: argparse.Namespace) -> int:
    check_minimums(args, {"budget": 0, "minibatch": 1, "max_concurrent": 1, "max_turns": 1, "no_improvement": 1})
    from rollouts.eval.run import EvalConfig, default_prepare_messages
    from rollouts.gepa.checkpoint import STATE_FILE

    config = get_config()
    if not args.reflection_model:
        raise CLIError("give the reflection model: --reflection-model PROVIDER/MODEL (it proposes the new prompts)")
    if not args.score:
        raise CLIError("give a score function: --score NAME or --score module:function (GEPA optimizes its reward)")
    if args.budget is None and not (args.max_iterations or args.timeout or args.score_threshold or args.no_improvement):
        raise CLIError("give a budget: --budget N (metric calls), or a stop condition such as --max-iterations N")
    seed = _seed_candidate(args, config)
    score_fn = resolve_scorer(args.score)  # (a module:function scorer is imported before any model call)
    prepare = load_callable(args.prepare, "--prepare") if args.prepare else default_prepare_messages
    endpoint = model_config_from_args(args, config).to_endpoint()
    reflection = resolve_model(
        args.reflection_model,
        config,
        api_base=args.reflection_api_base,
        api_key_env=args.reflection_api_key_env,
        max_tokens=args.reflection_max_tokens,
    ).to_endpoint()
    for ep in (endpoint, reflection):
        check_model_available(ep, user_modules=True)
    train = list(load_dataset(args.dataset))
    val = list(load_dataset(args.val)) if args.val else None
    factory = environment_factory(args.env or str(config.defaults.get("env") or "basic"), args.cwd)
    name = slug(f"gepa-{Path(args.dataset).stem}-{endpoint.provider}-{endpoint.model}")
    output = Path(args.output).expanduser() if args.output else results_root(config) / name
    if (output / STATE_FILE).exists() and not args.json:
        print(f"resuming in {output}", file=sys.stderr)
    # Only what the user set is passed: the defaults are EvalConfig's.
    given: dict[str, Any] = {
        "max_turns": args.max_turns,
        "max_concurrent": args.max_concurrent or config.defaults.get("max_concurrent"),
        "sample_timeout_s": args.sample_timeout,
    }
    task = EvalConfig(
        endpoint=endpoint,
        score_fn=score_fn,
        prepare_messages=prepare,
        environment_factory=factory,
        show_progress=False,
        **given_settings(given),
    )
    kwargs: dict[str, Any] = {
        "seed_candidate": seed,
        "trainset": train,
        "valset": val,
        "task": task,
        "reflection_endpoint": reflection,
        "max_metric_calls": args.budget,
        "reflection_minibatch_size": args.minibatch,
        "candidate_selection": args.selection,
        "component_selection": args.components,
        "use_merge": True if args.merge else None,
        "seed": args.seed,
        "score_threshold": args.score_threshold,
        "no_improvement_iterations": args.no_improvement,
        "max_iterations": args.max_iterations,
        "timeout_s": args.timeout,
        "stop_file": args.stop_file or output / "STOP",
        "run_dir": output,
        "show_progress": not args.no_progress,
    }
    result, interrupted = trio.run(_run, kwargs)
    if args.json:
        print(result.to_json())
    else:
        print(result.summary())
        for component, text in result.best_candidate.items():
            print(f"\n--- best {component} ---\n{text}")
        print(f"\nwritten to {output} (best_candidate.json, result.json)")
    return 130 if interrupted else 0
