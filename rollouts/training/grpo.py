"""GRPO over agent rollouts: `grpo_train(config, prompts, score_fn, environment_factory)`.

Each step:
1. draws `batch_size` prompts (a seeded shuffle per epoch, so the order is a function of the
   seed and the step);
2. runs `n_samples_per_prompt` rollouts of each through `evaluate()` — concurrently, a fresh
   environment per sample, the score function as in any evaluation — recorded token-exact
   (`RunConfig.use_tito`), each sample's sampling seeded from (seed, step, sample id); a rollout
   that fails is logged (logger `rollouts.training`, printed to stderr when logging is not
   configured) as it happens, and more failures than `max_failed_fraction` allows — or a step
   with nothing to train on — stop the run with a `TrainingError` naming the first;
3. turns them into `TrainingSample`s with group-normalised advantages (`scale_rewards`);
4. calls `TrainingBackend.train_step(batch, lr)` at the step's scheduled learning rate, then
   `InferenceBackend.sync` so the next rollouts use the new weights — or, with
   `max_policy_lag >= 1` (the default), starts step k + 1's rollouts before step k trains, so
   they are generated meanwhile by the policy one step older (`rollouts.training.overlap`:
   when, and why resumes stay exact);
5. appends a line to `<output_dir>/log.jsonl` (reward, loss, KL, entropy — the sampled tokens'
   mean negative log-prob —, grad norm, lr, tokens, seconds, the `policy_version` that
   generated the step's rollouts and its `policy_lag`) and every `checkpoint_every` steps
   writes a checkpoint (weights, optimizer, RNG, step) to `<output_dir>/checkpoints/step_NNNNNN`,
   atomically (`rollouts.training.checkpoints`); with `keep_step_samples`, the step's rollouts
   go to `<output_dir>/steps/step_NNNNNN/` (an eval output directory the viewer links from the step);
   with `heldout`, every `heldout.every` steps the line also has the policy's greedy reward on
   rows it never trains on (`heldout_reward`, `rollouts.training.heldout`), and step 0's line
   the same before any update (`heldout_reward_start`).

Under `torchrun` with N processes (`rollouts.training.distributed`; the backend joins the process
group in `initialize`) every rank runs this same loop on the same prompt list: each rolls out its
block of the step's groups (a group never straddles two ranks; sample ids and so sampling seeds
are the same as in one process), failures and the "batch" reward scale are decided over the whole
step, the backend's update is the whole step's, the log line is the step's; rank 0 alone writes
the log and checkpoints (the others wait at a barrier) and decides the resume; `on_step` runs on
every rank. A rank that raises posts its error so the others stop naming it.

Run again with the same `output_dir` and it resumes after the latest checkpoint — if the
configuration, dataset, score function, environment and starting model are the same (else a
ConfigurationError names what changed): same step, same prompts, same sampling seeds, so a run
killed and resumed ends with the weights an uninterrupted run would have had (on the same
machine and thread count).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trio

from rollouts._awaitable import maybe_await
from rollouts.errors import ConfigurationError, RolloutsError
from rollouts.eval.config import EnvironmentFactory, EvalConfig, ScoreFn
from rollouts.eval.run import evaluate
from rollouts.eval.sample import Sample
from rollouts.providers.tito import set_sampling_seed
from rollouts.run_config import RunConfig
from rollouts.training.backends import InferenceBackend, TrainingBackend
from rollouts.training.checkpoints import (
    RunFingerprint,
    check_resumable,
    checkpoint_dirs,
    truncate_log,
    write_checkpoint,
)
from rollouts.training.config import GRPOConfig, learning_rate
from rollouts.training.distributed import (
    DistributedError,
    World,
    all_gather,
    barrier,
    broadcast,
    current_world,
    report_failure,
)
from rollouts.training.heldout import HeldOut, heldout_metrics, heldout_start_metrics
from rollouts.training.overlap import open_rollout_scheduler, overlaps_after
from rollouts.training.sample import TrainingSample, with_group_advantages

LOG_FILE = "log.jsonl"
_log = logging.getLogger("rollouts.training")


class TrainingError(RolloutsError):
    """A training step could not go on: too many rollouts failed (the first failure is named)."""


@dataclass(frozen=True)
class StepResult:
    """One step's record (also the JSONL log line)."""

    step: int
    reward_mean: float
    reward_std: float
    metrics: Mapping[str, float]
    samples: int
    failed: int
    seconds: float
    rollout_seconds: float
    train_seconds: float
    model_tokens: int
    generation_seconds: float = 0.0
    policy_version: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "reward_mean": self.reward_mean,
            "reward_std": self.reward_std,
            **{k: float(v) for k, v in self.metrics.items()},
            "samples": self.samples,
            "failed": self.failed,
            "seconds": self.seconds,
            "rollout_seconds": self.rollout_seconds,
            "train_seconds": self.train_seconds,
            "model_tokens": self.model_tokens,
            "tokens_per_s": self.model_tokens / self.seconds if self.seconds > 0 else 0.0,
            "generation_seconds": self.generation_seconds,
            "policy_version": self.policy_version,
            "policy_lag": self.step - self.policy_version,
        }


@dataclass(frozen=True)
class GRPOResult:
    """What `grpo_train` did: the steps it ran in this call and where it started."""

    steps: tuple[StepResult, ...]
    resumed_from: int | None
    output_dir: Path


OnStep = Callable[[StepResult], Awaitable[None] | None]


def prompts_for_step(num_prompts: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of the prompts of `step`: consecutive slices of a shuffle per epoch."""
    out: list[int] = []
    position = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, num_prompts)
        order = list(range(num_prompts))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        take = min(batch_size - len(out), num_prompts - offset)
        out.extend(order[offset : offset + take])
        position += take
    return out


def _sample_seed(seed: int, step: int, sample_id: str) -> int:
    digest = hashlib.sha256(f"{seed}:{step}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def grpo_train(
    config: GRPOConfig,
    prompts: Sequence[Mapping[str, Any]],
    score_fn: ScoreFn,
    environment_factory: EnvironmentFactory | None = None,
    *,
    backend: TrainingBackend,
    inference: InferenceBackend,
    on_step: OnStep | None = None,
    heldout: HeldOut | None = None,
) -> GRPOResult:
    """Run GRPO (see the module docstring); resumes from `config.output_dir` if it holds a
    checkpoint of the same configuration. `heldout`: rows evaluated greedily every
    `heldout.every` steps, written to the log as `heldout_reward` (not part of what a resume
    must share: it changes no weight)."""
    if not prompts:
        raise ConfigurationError("grpo_train: no prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, Mapping):
            raise ConfigurationError(f"grpo_train: prompt {i} is a {type(p).__name__}; every prompt must be a dict")
    if config.max_policy_lag > 0 and getattr(inference, "shares_trainer_weights", False):
        raise ConfigurationError(
            f"grpo_train: max_policy_lag={config.max_policy_lag} generates rollouts while the trainer changes the "
            "weights, but this in-process policy samples from the trainer's own module; build it with "
            "InProcessPolicy(..., snapshot=True) (local_policy does when max_policy_lag > 0) or set max_policy_lag=0"
        )
    # the starting model's identity, before any checkpoint is loaded into it
    identity = await trio.to_thread.run_sync(backend.model_identity)
    fingerprint = RunFingerprint.of(config, prompts, score_fn, environment_factory, identity)
    await backend.initialize()  # joins the process group under torchrun
    world = current_world()
    run = _Run(config, prompts, score_fn, environment_factory, backend, inference, fingerprint, world, heldout)
    try:
        if world.size > config.batch_size:
            raise ConfigurationError(
                f"grpo_train: batch_size {config.batch_size} is below the {world.size} processes: each process "
                f"rolls out whole prompt groups, so give at least {world.size} prompts per step (--batch-size)"
            )
        if world.is_main:
            _make_dir(Path(config.output_dir))
        return await _train(run, on_step)
    except Exception as e:
        if not isinstance(e, DistributedError):
            report_failure(world, e)
        raise
    finally:
        with trio.CancelScope(shield=True):
            await backend.finalize()


@dataclass(frozen=True)
class _Run:
    config: GRPOConfig
    prompts: Sequence[Mapping[str, Any]]
    score_fn: ScoreFn
    environment_factory: EnvironmentFactory | None
    backend: TrainingBackend
    inference: InferenceBackend
    fingerprint: RunFingerprint
    world: World
    heldout: HeldOut | None = None


async def _train(run: _Run, on_step: OnStep | None) -> GRPOResult:
    config = run.config
    out = Path(config.output_dir)
    world = run.world
    resumed = await _resume(run)
    start = 0 if resumed is None else resumed + 1
    if world.is_main:
        truncate_log(out / LOG_FILE, start - 1)
    results: list[StepResult] = []
    version = served = start  # training steps applied to the trainer's / the served weights
    before: dict[str, float] = {}  # the held-out figure before any update, for step 0's line
    if start == 0:
        if world.is_main:  # rank 0 evaluates the held-out rows; the others wait for it
            before = await heldout_start_metrics(run.heldout, run.inference, config, run.environment_factory)
        before = broadcast(world, before, "receiving the held-out result before training")

    async def generate(step: int) -> list[Sample]:
        return await _rollout_batch(run, step)

    async with open_rollout_scheduler(generate) as rollouts:
        for step in range(start, config.num_steps):
            t0 = time.perf_counter()
            generated = await rollouts.take(step, version)
            t_rollout = time.perf_counter()
            if not 0 <= step - generated.version <= config.max_policy_lag:
                raise AssertionError(f"step {step}: rollouts of policy version {generated.version} exceed the lag")
            batch = _training_batch(run.config, step, generated.result, generated.version, world)
            ahead = overlaps_after(
                step,
                num_steps=config.num_steps,
                checkpoint_every=config.checkpoint_every,
                max_policy_lag=config.max_policy_lag,
                heldout_every=run.heldout.every if run.heldout is not None else None,
            )
            if ahead:  # step + 1's rollouts are generated while this step trains (training.overlap)
                if served != version:
                    await run.inference.sync(run.backend, version - 1)
                    served = version
                rollouts.start_ahead(step + 1, version)
            metrics = await run.backend.train_step(batch, learning_rate(config, step))
            version += 1
            if not ahead:
                await run.inference.sync(run.backend, step)
                served = version
            timing = _Timing(t0, t_rollout, time.perf_counter(), generated.seconds)
            result = _step_result(step, batch, metrics, timing, generated.version, world)
            extra: dict[str, float] = {}
            if world.is_main:  # rank 0 evaluates the held-out rows; the others wait for it
                extra = await heldout_metrics(run.heldout, step, run.inference, config, run.environment_factory)
            extra = broadcast(world, extra, f"receiving step {step}'s held-out result")
            result = replace(result, metrics={**result.metrics, **extra, **(before if step == 0 else {})})
            if world.is_main:
                _append_line(out / LOG_FILE, json.dumps(result.to_dict()))
            if (step + 1) % config.checkpoint_every == 0 or step == config.num_steps - 1:
                with trio.CancelScope(shield=True):
                    await write_checkpoint(config, run.backend, step, run.fingerprint, is_main=world.is_main)
                    barrier(world, f"waiting for step {step}'s checkpoint")
            results.append(result)
            if on_step is not None:
                await maybe_await(on_step(result))
    return GRPOResult(tuple(results), resumed, out)


async def _resume(run: _Run) -> int | None:
    """The step of the latest checkpoint, loaded into the backend and the served policy (None
    when the output directory holds none); ConfigurationError when it is another run's."""
    found: tuple[int, str] | str | None = None
    if run.world.is_main:  # rank 0 decides (the other ranks' disks need not hold the run)
        checkpoints = checkpoint_dirs(Path(run.config.output_dir))
        try:
            found = (
                (check_resumable(checkpoints[-1][1], run.fingerprint), str(checkpoints[-1][1])) if checkpoints else None
            )
        except ConfigurationError as e:
            found = str(e)
    found = broadcast(run.world, found, "receiving the resume decision")
    if isinstance(found, str):
        raise ConfigurationError(found)
    if found is None:
        return None
    step, path = found[0], Path(found[1])
    await run.backend.load_checkpoint(path)
    await run.inference.sync(run.backend, step)
    return step


async def _rollout_batch(run: _Run, step: int) -> list[Sample]:
    """This rank's rollouts of the step, in row order (group g's k-th sample at (g - first) *
    group_size + k, `first` the rank's first group: 0 in one process)."""
    config = run.config
    group_size = config.n_samples_per_prompt
    chosen = prompts_for_step(len(run.prompts), config.batch_size, step, config.seed)
    mine = run.world.groups(len(chosen))  # every group in one process
    rows = []
    for g, index in enumerate(chosen):
        if g not in mine:
            continue
        for k in range(group_size):
            rows.append({**run.prompts[index], "id": f"step{step}-g{g}-k{k}", "_prompt_index": index})

    def start_sample(sample_id: str, row: Mapping[str, Any]) -> None:
        set_sampling_seed(_sample_seed(config.seed, step, sample_id))

    def end_sample(sample: Sample) -> None:
        if sample.status != "completed":
            _log.warning("step %d: rollout %s failed (%s): %s", step, sample.id, sample.status, sample.error)

    eval_config = EvalConfig(
        endpoint=run.inference.endpoint(max_tokens=config.max_tokens, temperature=config.temperature),
        score_fn=run.score_fn,
        prepare_messages=config.prepare_messages,
        environment_factory=run.environment_factory,
        run_config=RunConfig(use_tito=True, max_turns=config.max_turns),
        max_turns=config.max_turns,
        max_concurrent=len(rows),
        sample_timeout_s=config.sample_timeout_s,
        provider_error_retries=0,
        show_progress=False,
        eval_name=f"grpo-step-{step}",
        **_step_samples_dir(config, step, run.world),
        on_sample_start=start_sample,
        on_sample_end=end_sample,
    )
    report = await evaluate(rows, eval_config)
    by_id = {s.id: s for s in report.samples}
    return [by_id[row["id"]] for row in rows]


STEPS_DIR = "steps"


def _step_samples_dir(config: GRPOConfig, step: int, world: World) -> dict[str, Any]:
    """Where the step's rollouts are written (`keep_step_samples`: `steps/step_NNNNNN`, started
    over when a resumed run runs the step again; the samples stay in memory as without it).
    Under torchrun rank R > 0 writes its share to `steps/rankR/step_NNNNNN`."""
    if not config.keep_step_samples:
        return {}
    root = Path(config.output_dir) / STEPS_DIR
    out = (root if world.is_main else root / f"rank{world.rank}") / f"step_{step:06d}"
    return {"output_dir": out, "overwrite": True, "keep_samples": True}


def _training_batch(
    config: GRPOConfig, step: int, samples: Sequence[Sample], policy_version: int, world: World | None = None
) -> list[TrainingSample]:
    """This rank's training samples with advantages, each recording the `policy_version` that
    generated it; TrainingError (on every rank) when more of the step's rollouts failed than
    `max_failed_fraction` allows, or none can be trained on."""
    world = world or World()
    group_size = config.n_samples_per_prompt
    first_group = world.groups(config.batch_size).start
    batch = [
        TrainingSample.from_eval_sample(s, group_index=first_group + i // group_size) for i, s in enumerate(samples)
    ]
    batch = [replace(t, metadata={**t.metadata, "policy_version": policy_version}) for t in batch]
    local_failed = [(s.id, s.error or s.status) for s, t in zip(samples, batch, strict=True) if not t.tokens]
    local_rewards = [t.reward for t in batch if t.tokens]
    gathered = all_gather(world, (len(batch), local_failed, local_rewards), f"gathering step {step}'s rewards")
    total = sum(n for n, _, _ in gathered)
    failed = [f for _, part, _ in gathered for f in part]
    if failed and (len(failed) == total or len(failed) / total > config.max_failed_fraction):
        first_id, first_error = failed[0]
        raise TrainingError(
            f"step {step}: {len(failed)} of {total} rollouts failed (max_failed_fraction is "
            f"{config.max_failed_fraction}); the first, {first_id}: {first_error}. Fix the cause, "
            "or let a share of rollouts fail with GRPOConfig.max_failed_fraction (--max-failed-fraction); a "
            "failed rollout is left out of training and of its group's statistics"
        )
    step_rewards = [r for _, _, part in gathered for r in part]
    return with_group_advantages(batch, scale_rewards=config.scale_rewards, batch_rewards=step_rewards)


@dataclass(frozen=True)
class _Timing:
    start: float
    rollouts_in: float
    end: float
    generation_seconds: float


def _step_result(
    step: int,
    batch: Sequence[TrainingSample],
    metrics: Mapping[str, float],
    timing: _Timing,
    policy_version: int,
    world: World | None = None,
) -> StepResult:
    """The step's record (over every rank's samples): the backend's metrics plus rewards,
    entropy, failures, timings (this rank's) and the policy version that generated the rollouts."""
    sampled = [lp for s in batch for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m]
    trained = [s for s in batch if s.tokens]
    mine = (sum(sampled), len(sampled), [s.reward for s in trained], len(batch), sum(s.num_model_tokens for s in batch))
    parts = all_gather(world or World(), mine, f"gathering step {step}'s record")
    n_sampled = sum(p[1] for p in parts)
    # the mean negative log-prob of the sampled tokens: a Monte Carlo estimate of the policy's entropy
    entropy = -sum(p[0] for p in parts) / n_sampled if n_sampled else 0.0
    rewards = [r for p in parts for r in p[2]]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    samples = sum(p[3] for p in parts)
    return StepResult(
        step=step,
        reward_mean=mean,
        reward_std=std,
        metrics={**metrics, "entropy": entropy},
        samples=samples,
        failed=samples - len(rewards),
        seconds=timing.end - timing.start,
        rollout_seconds=timing.rollouts_in - timing.start,
        train_seconds=timing.end - timing.rollouts_in,
        model_tokens=sum(p[4] for p in parts),
        generation_seconds=timing.generation_seconds,
        policy_version=policy_version,
    )
