"""GRPO on SmolLM2-135M-Instruct (CPU): held-out reward before and after, our loop against trl.

Task: single-digit sums (a, b < 10: 100 ordered pairs; 16 unordered pairs {a, b}, both orders,
held out — 32 questions — so no held-out sum has its commuted twin in training, and never the
prompt's worked example 2 + 3), asked with one worked example ("Answer with only the number." / "What is 2 + 3?" / "5" / "What is a + b?"),
so the model replies with a bare number — and, greedily, mostly a wrong one: SmolLM2-135M writes
"2 + 9 = 11" when it may show its work, but its direct answers are guesses (held-out exact match
about 0.1). Sampled at temperature 1.0, about 5% of its replies are the right number: enough for
group-relative advantages to work with. Training reward: 1.0 for exactly the sum, 0.5 / (1 +
distance) for another bare number, 0.0 for anything else (a denser signal than all-or-nothing on
8 completions). The held-out figure is strict: the fraction of held-out questions whose greedy
(temperature 0) reply is exactly the sum, measured through `evaluate()` before and after training.
(Without the example, "Reply with only the number" gets "a + b = c" or "The answer is c" and
almost never a bare number, so nothing is there to reinforce: measured, the reward plateaus at
the equation form.)

1. ours: `grpo_train` with the in-process policy (the `transformers` provider, batched sampling)
   and `TorchBackend`; `--steps` steps of `--prompts-per-step` prompts x `--group` completions.
2. reference: trl's `GRPOTrainer` on the same task, model (the same starting weights), group
   size, steps, learning rate, completion length and temperature (its own generation, not an
   agent loop), with the rollout batch in one generation step as ours, the same learning-rate
   schedule (`--lr-schedule`, constant by default) and the same objective (trl's defaults
   loss_type "dapo" and scale_rewards "group" are ours: per-token loss, unbiased group std);
   its model's held-out reward is measured before and after on the same held-out set, through
   the same `evaluate()` path and greedy decoding as ours.
3. multi-turn: the same loop through tool calls ("start from 0, add a, then add b, then call
   complete_task with the result"), in `AddCalculator` (the calculator with only the two tools
   the task needs), after one worked episode (2 + 1) given as real tool calls and the
   environment's own results — from the tools' description alone SmolLM2-135M wrote no tool call
   at all —, sampled at `--multiturn-temperature`. Held out: at least 16 episodes
   (`--heldout-multiturn`; 17 with the defaults), split off as above — no operand pair shared
   with training in either order, never the worked episode. Training reward
   (`calculator_reached`, `--multiturn-reward reached`): 0.5 when the calculator ends at the sum,
   0.5 more for success; `--multiturn-reward shaped` is the earlier `calculator_shaped` (0.25 when
   the first call is add(a), 0.25 more when the second is then add(b), 0.5 for success), under
   which every run stalled at add(a) followed by a wrong call. Defaults: 30 steps of 4 prompts x
   16 rollouts (two training passes a step), temperature 0.7, lr 2e-5, 3 turns of at most 32
   tokens, `share_prefix` (the worked episode runs once per pass). The held-out
   figure is strict success (`calculator_success`): complete_task called with the calculator at
   the sum and the sum reported, greedily, before training and every `--multiturn-heldout-every`
   steps during it (`grpo_train(..., heldout=HeldOut(...))`, so it is also in the run's
   log.jsonl as `heldout_reward`). `--only-multiturn` runs this alone.

4. ddp2 (run first, before this process loads its model): the single-turn run of 1. (without
   its held-out measurements) in 2 processes under torchrun, data parallel with DDP over gloo (`benchmarks/grpo_ddp.py`): `ddp2_sec_per_step` beside
   `sec_per_step`, with the same threads per process; `--only-ddp2` runs this part alone,
   `--skip-ddp2` leaves it out.
5. `--only memory`: `peak_rss_mb` (full fine-tuning) against `peak_rss_mb_lora` (LoRA rank 16,
   alpha 32, on every linear layer, at `--lora-lr`, with gradient checkpointing: the memory
   options together) and `peak_rss_mb_lora_no_checkpointing` (LoRA alone), `--steps` steps of the
   single-turn task, each in its own process, the peak taken from after the model is loaded
   (Linux VmHWM, reset through /proc/self/clear_refs after malloc_trim) to the end of training;
   all strictly alternating. Target: LoRA at most half. (At this step size — 32 rollouts of ~60
   tokens — the activations kept for the backward pass outweigh the weights, gradients and AdamW
   state together, and LoRA keeps them too: measured, LoRA alone peaks near full fine-tuning.) `--only overlap`: `sec_per_step` (full fine-tuning, lag 0) against `sec_per_step_lag1`
   (the next step's rollouts generated while a step trains), each in its own process; `--only
   all`: both, sharing the full fine-tuning run.

Peak memory is the process's peak RSS after our single-turn run (before trl is imported). Our
runs here strictly alternate generation and training (`max_policy_lag=0`), as trl's loop does.
Run: python benchmarks/grpo.py [--steps 25] [--model smollm2-135m | tiny] [--only-multiturn]
     python benchmarks/grpo.py --only memory|overlap|all --steps 5
Last line: JSON with heldout_reward_before, heldout_reward_after, trl_heldout_reward_before,
trl_heldout_reward_after, steps, sec_per_step, trl_sec_per_step, sec_per_step_ratio_to_trl,
peak_rss_mb, multiturn_heldout_before, multiturn_heldout_after (strict success; they replace the
partial-credit multiturn_reward_before/after of earlier versions), multiturn_heldout_curve
([step, success] pairs, -1 before training), multiturn_sec_per_step, the multi-turn settings
(multiturn_reward, _temperature, _lr, _prompts_per_step, _group, _seed), ddp2_sec_per_step, the
reward curves, load_average (the machine's load when it ran) and the process's peak RSS at the
end (peak_rss_mb_with_trl, or peak_rss_mb_at_end with --skip-trl). The single-turn settings
(steps, group, prompts_per_step, peak_rss_mb) appear only when the single-turn run ran.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from rollouts.dtypes import Endpoint, Message, Tool, ToolCall, ToolCallContent, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.eval.config import EvalConfig
from rollouts.eval.run import evaluate
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.providers.tito import set_sampling_seed
from rollouts.providers.transformers_local import register_transformers_model
from rollouts.run_config import RunConfig
from rollouts.training import GRPOConfig, HeldOut, grpo_train, load_causal_lm, local_policy
from rollouts.training.tiny import tiny_chat_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_ddp import run_ddp2

SYSTEM = "Answer with only the number."
EXAMPLE_PAIR = (2, 3)
EXAMPLE = ((f"What is {EXAMPLE_PAIR[0]} + {EXAMPLE_PAIR[1]}?", str(sum(EXAMPLE_PAIR))),)
MULTI_EXAMPLE_PAIR = (2, 1)
QUESTION = "What is {a} + {b}?"
MULTI = "Use the calculator tools: start from 0, add {a}, then add {b}, then call complete_task with the result."


class AddCalculator(CalculatorEnvironment):
    """The calculator with only the tools the task needs (add, complete_task): the three others'
    JSON schemas were a third of the prompt's tokens (519 -> 346), and on this CPU a step's time
    grows with the prompt (every turn prefills it, every training pass reads it)."""

    def get_tools(self) -> Sequence[Tool]:
        return tuple(t for t in super().get_tools() if t.name in ("add", "complete_task"))


def _demo_calls() -> list[Message]:
    """One worked episode (2 + 1) as real tool calls and the environment's own results:
    SmolLM2-135M writes no tool call from the tools' description alone (measured: 0 of 32
    samples), and about half of its samples are calls after one demonstration."""
    out = [Message("user", MULTI.format(a=MULTI_EXAMPLE_PAIR[0], b=MULTI_EXAMPLE_PAIR[1]))]
    steps = [("add", {"value": 2}, "Added 2 to 0. Current value: 2"), ("add", {"value": 1}, "Added 1 to 2. Current value: 3"),
             ("complete_task", {"final_result": "3"}, "Task completed. Final result: 3")]  # fmt: skip
    for i, (name, arguments, result) in enumerate(steps):
        call = ToolCallContent(f"demo-{i}", name, arguments)
        out += [Message("assistant", (call,)), Message.tool_result(call, result)]
    return out


DEMO = tuple(_demo_calls())


def multiturn_messages(row: Mapping[str, Any]) -> list[Message]:
    """The multi-turn prompt: the worked episode, then the task."""
    return [*DEMO, Message("user", MULTI.format(**row))]


def multiturn_split(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The calculator episodes: (training rows, held-out rows) — at least `--heldout-multiturn`
    held out, no operand pair shared with training in either order, never the worked episode."""
    return arithmetic_split(args.max_operand, args.heldout_multiturn, seed=args.seed + 1, example=MULTI_EXAMPLE_PAIR)


def arithmetic_split(
    max_operand: int, heldout: int, seed: int, example: tuple[int, int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows), held out honestly: the unordered pairs {a, b} (a, b <
    max_operand) are shuffled and whole pairs — both orders — go to the held-out set until it has
    `heldout` rows, so no held-out sum has its commuted twin in training; the prompt's worked
    example is never held out (it stays with training, where the prompt shows it anyway)."""
    pairs = [(a, b) for a in range(max_operand) for b in range(a, max_operand)]
    random.Random(seed).shuffle(pairs)
    held: list[tuple[int, int]] = []
    train: list[tuple[int, int]] = []
    for a, b in pairs:
        both = [(a, b)] if a == b else [(a, b), (b, a)]
        if len(held) < heldout and {a, b} != set(example):
            held += both
        else:
            train += both
    rng = random.Random(seed + 1)
    rng.shuffle(train)

    def rows(items: list[tuple[int, int]]) -> list[dict[str, Any]]:
        return [{"a": a, "b": b, "answer": str(a + b)} for a, b in items]

    assert not {frozenset(p) for p in held} & {frozenset(p) for p in train}, "a held-out pair leaked into training"
    return rows(train), rows(held)


def _bare(sample: Sample) -> str:
    return sample.response.strip().rstrip(".").strip()


def exact_sum(sample: Sample) -> Score:
    """The held-out measure: 1.0 when the reply is exactly the sum (a final period allowed), else 0.0."""
    return Score((Metric("exact", 1.0 if _bare(sample) == sample.input["answer"] else 0.0, weight=1.0),))


def shaped_sum(sample: Sample) -> Score:
    """The training reward: 1.0 for exactly the sum; another bare number earns 0.5 / (1 + its
    distance to the sum); anything else 0.0."""
    reply, answer = _bare(sample), int(sample.input["answer"])
    if reply == str(answer):
        value = 1.0
    elif reply.isdigit():
        value = 0.5 / (1 + abs(int(reply) - answer))
    else:
        value = 0.0
    return Score((Metric("sum", value, weight=1.0),))


def question_messages(row: Mapping[str, Any]) -> list[Message]:
    """The single-turn prompt: the instruction, the worked example, the question."""
    messages = [Message("system", SYSTEM)]
    for q, a in EXAMPLE:
        messages += [Message("user", q), Message("assistant", a)]
    return [*messages, Message("user", QUESTION.format(**row))]


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _episode(sample: Sample) -> tuple[list[ToolCall], float | None]:
    """The run's own valid tool calls (not the demonstration's) and the calculator's final value."""
    traj = sample.trajectory
    own = traj.messages[len(multiturn_messages(sample.input)) :] if traj else ()
    calls = [c for m in own for c in m.get_tool_calls() if c.parse_error is None]
    return calls, _number((sample.environment_state or {}).get("current_value"))


def calculator_success(sample: Sample) -> Score:
    """The held-out measure, strict: 1.0 when the run called complete_task with the calculator at
    the sum and reported the sum as its final result, else 0.0."""
    calls, value = _episode(sample)
    answer = float(sample.input["answer"])
    final = [c for c in calls if c.name == "complete_task"]
    done = sample.stop_reason == "task_completed" and bool(final)
    reported = _number(final[-1].arguments.get("final_result")) if final else None
    ok = done and value == answer and reported == answer
    return Score((Metric("success", 1.0 if ok else 0.0, weight=1.0),))


def calculator_shaped(sample: Sample) -> Score:
    """The training reward: 0.5 for success (as `calculator_success`), plus 0.25 when the first
    call is add(a) and 0.25 more when the second is then add(b) — the steps the task asks for."""
    calls, _ = _episode(sample)
    a, b = float(sample.input["a"]), float(sample.input["b"])

    def is_add(i: int, operand: float) -> bool:
        return len(calls) > i and calls[i].name == "add" and _number(calls[i].arguments.get("value")) == operand

    first = is_add(0, a)
    value = 0.25 * first + 0.25 * (first and is_add(1, b)) + 0.5 * calculator_success(sample).reward
    return Score((Metric("calculator", value, weight=1.0),))


def calculator_reached(sample: Sample) -> Score:
    """The training reward (the default): 0.5 when the calculator ends at the sum, 0.5 more for
    success (as `calculator_success`). No credit for a first step alone: under
    `calculator_shaped`'s 0.25 for add(a), every run settled on add(a) followed by a wrong second
    call, and the credit, given to whole episodes, reinforced those wrong calls with it."""
    _, value = _episode(sample)
    reached = value == float(sample.input["answer"])
    value_credit = 0.5 * reached + 0.5 * calculator_success(sample).reward
    return Score((Metric("calculator", value_credit, weight=1.0),))


MULTITURN_REWARDS = {"reached": calculator_reached, "shaped": calculator_shaped}


async def heldout_reward(
    name: str,
    rows: list[dict[str, Any]],
    score: Any,
    prepare: Any,
    *,
    max_tokens: int,
    env: Any = None,
    turns: int = 1,
) -> float:
    config = EvalConfig(
        endpoint=Endpoint("transformers", name, max_tokens=max_tokens, temperature=0.0),
        score_fn=score,
        prepare_messages=prepare,
        environment_factory=env,
        run_config=RunConfig(use_tito=True),
        max_turns=turns,
        max_concurrent=len(rows),
        show_progress=False,
        provider_error_retries=0,
        on_sample_start=lambda sid, row: set_sampling_seed(0),
    )
    report = await evaluate(rows, config)
    return sum(s.reward for s in report.samples) / len(report.samples)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def single_turn_config(args: argparse.Namespace, out: Path, **changes: Any) -> GRPOConfig:
    """The single-turn task's training settings from the command line (every variant starts here):
    strict alternation (`max_policy_lag=0`, as trl's loop) unless a variant says otherwise."""
    settings: dict[str, Any] = {
        "output_dir": out,
        "num_steps": args.steps,
        "batch_size": args.prompts_per_step,
        "n_samples_per_prompt": args.group,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "lr": args.lr,
        "lr_schedule": args.lr_schedule,
        "checkpoint_every": 10_000,
        "seed": args.seed,
        "prepare_messages": question_messages,
        "max_policy_lag": 0,
    }
    return GRPOConfig(**{**settings, **changes})


async def run_ours(
    model: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    heldout: list[dict[str, Any]],
    out: Path,
) -> dict[str, Any]:
    config = single_turn_config(args, out)
    backend, policy = local_policy(model, tokenizer, config, name="bench-policy")
    before = await heldout_reward("bench-policy", heldout, exact_sum, question_messages, max_tokens=args.max_tokens)
    print(f"ours: held-out reward before {before:.3f}", file=sys.stderr)

    def show(r: Any) -> None:
        print(
            f"ours: step {r.step} reward {r.reward_mean:.3f} loss {r.metrics['loss']:.4f} {r.seconds:.1f}s",
            file=sys.stderr,
        )

    result = await grpo_train(config, rows, shaped_sum, backend=backend, inference=policy, on_step=show)
    after = await heldout_reward("bench-policy", heldout, exact_sum, question_messages, max_tokens=args.max_tokens)
    print(f"ours: held-out reward after {after:.3f}", file=sys.stderr)
    secs = [s.seconds for s in result.steps]
    return {
        "heldout_reward_before": before,
        "heldout_reward_after": after,
        "sec_per_step": sum(secs) / len(secs),
        "rollout_sec_per_step": sum(s.rollout_seconds for s in result.steps) / len(secs),
        "train_sec_per_step": sum(s.train_seconds for s in result.steps) / len(secs),
        "reward_curve": [round(s.reward_mean, 4) for s in result.steps],
    }


def run_trl(
    model: Any,
    tokenizer: Any,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    heldout: list[dict[str, Any]],
    out: Path,
) -> dict[str, Any]:
    """trl's GRPOTrainer on the same task; its model's held-out reward is measured before and
    after through the same `evaluate()` path and greedy decoding as ours."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    data = Dataset.from_list(
        [
            {"prompt": [{"role": m.role, "content": m.text} for m in question_messages(r)], "answer": r["answer"]}
            for r in rows
        ]
    )

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        out = []
        for c, a in zip(completions, answer, strict=True):
            text = c[0]["content"] if isinstance(c, list) else str(c)
            out.append(shaped_sum(Sample("trl", {"answer": a}, Trajectory((Message("assistant", text),)))).reward)
        return out

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.times: list[float] = []
            self._t = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self._t = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            self.times.append(time.perf_counter() - self._t)

    per_step = args.prompts_per_step * args.group
    config = TRLConfig(
        output_dir=str(out),
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        max_completion_length=args.max_tokens,
        learning_rate=args.lr,
        lr_scheduler_type=args.lr_schedule,  # as ours; loss_type "dapo" and scale_rewards "group" are both defaults
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        max_steps=args.steps,
        temperature=args.temperature,
        top_p=1.0,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=args.seed,
        disable_tqdm=True,
    )
    timer = StepTimer()
    register_transformers_model("bench-trl", model, tokenizer)
    before = trio.run(measure_single, "bench-trl", heldout, args)
    print(f"trl: held-out reward before {before:.3f}", file=sys.stderr)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=copy.deepcopy(tokenizer),
        callbacks=[timer],
    )
    model.train()
    trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    register_transformers_model("bench-trl", trained, tokenizer)
    after = trio.run(measure_single, "bench-trl", heldout, args)
    print(f"trl: held-out reward after {after:.3f}", file=sys.stderr)
    curve = [round(float(e["reward"]), 4) for e in trainer.state.log_history if "reward" in e]
    return {
        "trl_heldout_reward_before": before,
        "trl_heldout_reward_after": after,
        "trl_sec_per_step": sum(timer.times) / len(timer.times),
        "trl_reward_curve": curve,
    }


async def measure_single(name: str, heldout: list[dict[str, Any]], args: argparse.Namespace) -> float:
    """Held-out exact match of the model registered as `name` (greedy, through evaluate())."""
    return await heldout_reward(name, heldout, exact_sum, question_messages, max_tokens=args.max_tokens)


async def run_multiturn(model: Any, tokenizer: Any, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Train the calculator agent on the shaped reward; the held-out figure is strict success
    (`calculator_success`), greedy, before training and every `--multiturn-heldout-every` steps
    during it (written to the run's log.jsonl as `heldout_reward`)."""
    rows, held = multiturn_split(args)
    config = GRPOConfig(
        output_dir=out,
        num_steps=args.multiturn_steps,
        batch_size=args.multiturn_prompts_per_step,
        n_samples_per_prompt=args.multiturn_group,
        max_tokens=args.multiturn_max_tokens,
        temperature=args.multiturn_temperature,
        max_turns=args.multiturn_turns,
        lr=args.multiturn_lr,
        lr_schedule=args.lr_schedule,
        checkpoint_every=10_000,
        seed=args.seed if args.multiturn_seed is None else args.multiturn_seed,
        prepare_messages=multiturn_messages,
        max_policy_lag=0,
        num_minibatches=args.multiturn_minibatches,
        share_prefix=True,  # the system prompt and worked episode (~330 of ~450 tokens) run once a pass
    )
    backend, policy = local_policy(model, tokenizer, config, name="bench-multiturn")
    heldout = HeldOut(held, calculator_success, every=args.multiturn_heldout_every)

    def show(r: Any) -> None:
        held_out = f" held-out {r.metrics['heldout_reward']:.3f}" if "heldout_reward" in r.metrics else ""
        if "heldout_reward_start" in r.metrics:  # evaluated before the first update (HeldOut.at_start)
            held_out += f" (before training {r.metrics['heldout_reward_start']:.3f})"
        print(f"multi-turn: step {r.step} reward {r.reward_mean:.3f}{held_out} {r.seconds:.1f}s", file=sys.stderr)

    result = await grpo_train(
        config,
        rows,
        MULTITURN_REWARDS[args.multiturn_reward],
        AddCalculator,
        backend=backend,
        inference=policy,
        on_step=show,
        heldout=heldout,
    )
    curve = [(s.step, round(s.metrics["heldout_reward"], 4)) for s in result.steps if "heldout_reward" in s.metrics]
    before = result.steps[0].metrics["heldout_reward_start"]
    return {
        "multiturn_heldout_before": before,
        "multiturn_heldout_after": curve[-1][1],
        "multiturn_heldout_curve": [[-1, round(before, 4)], *[list(c) for c in curve]],
        "multiturn_heldout_episodes": len(held),
        "multiturn_steps": args.multiturn_steps,
        "multiturn_reward": args.multiturn_reward,
        "multiturn_temperature": args.multiturn_temperature,
        "multiturn_lr": args.multiturn_lr,
        "multiturn_prompts_per_step": args.multiturn_prompts_per_step,
        "multiturn_group": args.multiturn_group,
        "multiturn_seed": config.seed,
        "multiturn_rollouts_per_step": args.multiturn_prompts_per_step * args.multiturn_group,
        "multiturn_sec_per_step": sum(s.seconds for s in result.steps) / len(result.steps),
        "multiturn_reward_curve": [round(s.reward_mean, 4) for s in result.steps],
    }


VARIANTS = {
    # name: (LoRA rank, max_policy_lag, gradient checkpointing); memory: full vs LoRA (with and
    # without gradient checkpointing), all strictly alternating (no generation copy); overlap:
    # full fine-tuning at lag 0 vs lag 1
    "full": (0, 0, False),
    "lora": (16, 0, True),
    "lora_no_checkpointing": (16, 0, False),
    "lag1": (0, 1, False),
}


def training_peak_rss_mb() -> float:
    """The process's peak RSS since `reset_peak_rss()` (Linux: VmHWM), else since it started."""
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return peak_rss_mb()


def reset_peak_rss() -> None:
    """Start the peak RSS afresh (Linux: writing 5 to /proc/self/clear_refs resets VmHWM), so
    the figure is training's, not the model load's (a GGUF is dequantised through a second copy).
    The heap the load freed is first handed back to the system (glibc's malloc_trim): else the
    reset would start from the load's high-water mark (measured: 1.35 GB resident after loading
    SmolLM2, 0.94 GB after the trim) and training would reuse that memory unseen."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak then includes the load's freed heap
        pass
    Path("/proc/self/clear_refs").write_text("5", encoding="utf-8")


async def run_variant(model: Any, tokenizer: Any, args: argparse.Namespace, name: str, out: Path) -> dict[str, Any]:
    """`--steps` steps of the single-turn task with variant `name`'s LoRA rank and policy lag."""
    rank, lag, checkpointing = VARIANTS[name]
    rows, _ = arithmetic_split(args.max_operand, args.heldout, seed=args.seed, example=EXAMPLE_PAIR)
    config = single_turn_config(
        args,
        out,
        lr=args.lora_lr if rank else args.lr,
        lora_r=rank,
        lora_alpha=2.0 * rank if rank else 16.0,
        gradient_checkpointing=checkpointing,
        max_policy_lag=lag,
    )
    backend, policy = local_policy(model, tokenizer, config, name=f"bench-{name}")
    result = await grpo_train(config, rows, shaped_sum, backend=backend, inference=policy)
    steps = result.steps
    return {
        "sec_per_step": sum(s.seconds for s in steps) / len(steps),
        "generation_sec_per_step": sum(s.generation_seconds for s in steps) / len(steps),
        "train_sec_per_step": sum(s.train_seconds for s in steps) / len(steps),
        "policy_lags": [s.step - s.policy_version for s in steps],
        "reward_curve": [round(s.reward_mean, 4) for s in steps],
    }


def child_main(args: argparse.Namespace) -> None:
    """One variant in this process: load, reset the peak, train; one JSON line."""
    model, tokenizer = tiny_chat_model(seed=0) if args.model == "tiny" else load_causal_lm(args.model)
    reset_peak_rss()
    with tempfile.TemporaryDirectory() as tmp:
        result = trio.run(run_variant, model, tokenizer, args, args.child, Path(tmp) / args.child)
    result["peak_rss_mb"] = round(training_peak_rss_mb(), 1)
    print(json.dumps(result))


def run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Variant `name` in a subprocess of its own, so each peak RSS is its own."""
    import subprocess

    command = [sys.executable, __file__, "--child", name, "--model", args.model, "--steps", str(args.steps)]
    command += ["--threads", str(args.threads), "--seed", str(args.seed), "--lr", str(args.lr)]
    command += ["--lora-lr", str(args.lora_lr), "--prompts-per-step", str(args.prompts_per_step)]
    command += ["--group", str(args.group), "--max-tokens", str(args.max_tokens)]
    print(f"{name}: {' '.join(command[1:])}", file=sys.stderr)
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"variant {name} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{name}: {json.dumps(out)}", file=sys.stderr)
    return out


def run_only(args: argparse.Namespace) -> dict[str, Any]:
    """`--only memory`: peak RSS of full fine-tuning and of LoRA (rank 16, all linear layers);
    `--only overlap`: seconds per step at lag 0 and lag 1; `--only all`: both, sharing the full
    fine-tuning run — each variant in its own process."""
    result: dict[str, Any] = {"model": args.model, "steps": args.steps, "only": args.only, "threads": args.threads}
    full = run_child("full", args)
    result["peak_rss_mb"] = full["peak_rss_mb"]
    result["sec_per_step"] = full["sec_per_step"]
    if args.only in ("memory", "all"):
        lora = run_child("lora", args)
        result["peak_rss_mb_lora"] = lora["peak_rss_mb"]
        result["peak_rss_ratio_lora"] = lora["peak_rss_mb"] / full["peak_rss_mb"]
        result["sec_per_step_lora"] = lora["sec_per_step"]
        result["reward_curve_lora"] = lora["reward_curve"]
        plain = run_child("lora_no_checkpointing", args)
        result["peak_rss_mb_lora_no_checkpointing"] = plain["peak_rss_mb"]
        result["sec_per_step_lora_no_checkpointing"] = plain["sec_per_step"]
    if args.only in ("overlap", "all"):
        lag1 = run_child("lag1", args)
        result["sec_per_step_lag1"] = lag1["sec_per_step"]
        result["sec_per_step_ratio_lag1"] = lag1["sec_per_step"] / full["sec_per_step"]
        for key in ("generation_sec_per_step", "train_sec_per_step"):
            result[f"{key}_lag0"] = full[key]
            result[f"{key}_lag1"] = lag1[key]
        result["policy_lags_lag1"] = lag1["policy_lags"]
        result["peak_rss_mb_lag1"] = lag1["peak_rss_mb"]
        result["reward_curve_lag1"] = lag1["reward_curve"]
    result["reward_curve"] = full["reward_curve"]
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m (packaged), tiny (smoke test) or a path")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--multiturn-steps", type=int, default=30)
    parser.add_argument("--multiturn-group", type=int, default=16)
    parser.add_argument(
        "--multiturn-minibatches", type=int, default=2, help="training passes per step (less memory, same update)"
    )
    parser.add_argument("--multiturn-lr", type=float, default=2e-5)
    parser.add_argument("--multiturn-turns", type=int, default=3, help="model turns per calculator episode")
    parser.add_argument(
        "--multiturn-max-tokens", type=int, default=32, help="per model turn (a complete_task call is 22 tokens)"
    )
    parser.add_argument(
        "--multiturn-reward",
        default="reached",
        choices=tuple(MULTITURN_REWARDS),
        help="training reward: reached (0.5 calculator at the sum + 0.5 success) or shaped (0.25 add a, 0.25 add b, 0.5 success)",
    )
    parser.add_argument("--multiturn-heldout-every", type=int, default=6, help="steps between held-out evaluations")
    parser.add_argument(
        "--multiturn-seed",
        type=int,
        help="the multi-turn training's seed (prompt order, sampling; default --seed); the split stays --seed's",
    )
    parser.add_argument("--multiturn-output", help="keep the multi-turn run (log.jsonl, checkpoint) in this directory")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--multiturn-prompts-per-step", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument(
        "--lr-schedule", default="constant", choices=("constant", "linear", "cosine"), help="ours and trl's alike"
    )
    parser.add_argument("--heldout", type=int, default=32)
    parser.add_argument(
        "--heldout-multiturn", type=int, default=16, help="held-out calculator episodes (at least this many)"
    )
    parser.add_argument("--max-operand", type=int, default=10, help="a, b < this (default 10)")
    parser.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (ours and trl)")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: on a loaded machine more threads are slower)"
    )
    parser.add_argument(
        "--multiturn-temperature",
        type=float,
        default=0.7,
        help="(at 1.0 the samples' tool calls were mostly malformed: training reward 0.00-0.03)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-ddp2", action="store_true", help="leave out the 2-process DDP run")
    parser.add_argument("--only-ddp2", action="store_true", help="only the 2-process DDP run (ddp2_sec_per_step)")
    parser.add_argument("--skip-multiturn", action="store_true")
    parser.add_argument("--skip-single", action="store_true", help="skip the single-turn runs (ours and trl)")
    parser.add_argument(
        "--only-multiturn",
        action="store_true",
        help="only the multi-turn run (as --skip-single --skip-trl --skip-ddp2)",
    )
    parser.add_argument(
        "--only",
        choices=("memory", "overlap", "all"),
        help="only peak_rss_mb vs peak_rss_mb_lora (memory), sec_per_step vs sec_per_step_lag1 (overlap) or "
        "both (all), each variant in its own process for --steps steps",
    )
    parser.add_argument("--lora-lr", type=float, default=1e-4, help="learning rate of the LoRA variant")
    parser.add_argument("--child", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only_multiturn:
        args.skip_single = args.skip_trl = args.skip_ddp2 = True
        args.skip_multiturn = False
    return args


def rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """Floats to 4 decimals, but learning rates (2e-5 would print as 0.0) as they are."""
    return {k: round(v, 4) if isinstance(v, float) and not k.endswith("lr") else v for k, v in figures.items()}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child_main(args)
        return
    if args.only:
        only = run_only(args)
        print(json.dumps(rounded(only)))
        return
    # first, before this process loads its model: the two processes' memory does not add to its own
    ddp2 = {} if args.skip_ddp2 else run_ddp2(sys.argv[1:])
    if args.only_ddp2:
        figures = {"model": args.model, "steps": args.steps, "group": args.group, **ddp2}
        figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(rounded(figures)))
        return

    t0 = time.perf_counter()
    if args.model == "tiny":
        model, tokenizer = tiny_chat_model(seed=0)
    else:
        model, tokenizer = load_causal_lm(args.model)
    load_s = time.perf_counter() - t0
    print(f"loaded {args.model} in {load_s:.1f}s", file=sys.stderr)
    start = copy.deepcopy(model.state_dict())
    rows, heldout = arithmetic_split(args.max_operand, args.heldout, seed=args.seed, example=EXAMPLE_PAIR)
    result: dict[str, Any] = {"model": args.model}
    if not args.skip_single:  # the single-turn run's settings only when it runs
        result.update(steps=args.steps, group=args.group, prompts_per_step=args.prompts_per_step)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_single:
            result.update(trio.run(run_ours, model, tokenizer, args, rows, heldout, Path(tmp) / "ours"))
            result["peak_rss_mb"] = round(peak_rss_mb(), 1)
        model.load_state_dict(start)
        if not args.skip_trl and not args.skip_single:
            trl_model = copy.deepcopy(model)
            result.update(run_trl(trl_model, tokenizer, args, rows, heldout, Path(tmp) / "trl"))
            del trl_model
            result["sec_per_step_ratio_to_trl"] = result["sec_per_step"] / result["trl_sec_per_step"]
        elif not args.skip_single:
            result["trl_sec_per_step"] = None
        model.load_state_dict(start)
        if not args.skip_multiturn:
            out = Path(args.multiturn_output) if args.multiturn_output else Path(tmp) / "multiturn"
            result.update(trio.run(run_multiturn, model, tokenizer, args, out))
    result.update(ddp2)
    result["load_s"] = round(load_s, 1)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["peak_rss_mb_at_end" if args.skip_trl else "peak_rss_mb_with_trl"] = round(peak_rss_mb(), 1)
    print(json.dumps(rounded(result)))


if __name__ == "__main__":
    main()
