"""GRPO over agent rollouts: `grpo_train(config, prompts, score_fn, environment_factory)`.

Each step:
1. draws `batch_size` prompts (a seeded shuffle per epoch, so the order is a function of the
   seed and the step);
2. runs `n_samples_per_prompt` rollouts of each through `evaluate()` — concurrently, a fresh
   environment per sample, the score function as in any evaluation — recorded token-exact
   (`RunConfig.use_tito`), each sample's sampling seeded from (seed, step, sample id);
3. turns them into `TrainingSample`s with group-normalised advantages;
4. calls `TrainingBackend.train_step(batch, lr)`, then `InferenceBackend.sync` so the next
   rollouts use the new weights;
5. appends a line to `<output_dir>/log.jsonl` (reward, loss, KL, entropy — the sampled tokens'
   mean negative log-prob —, grad norm, tokens, seconds) and every `checkpoint_every` steps writes a checkpoint (weights, optimizer, RNG,
   step) to `<output_dir>/checkpoints/step_NNNNNN`, atomically.

Run again with the same `output_dir` and it resumes after the latest checkpoint: same step, same
prompts, same sampling seeds, so a run killed and resumed ends with the weights an
uninterrupted run would have had (on the same machine and thread count).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from rollouts.errors import ConfigurationError
from rollouts.eval.config import EnvironmentFactory, EvalConfig, PrepareMessages, ScoreFn, default_prepare_messages
from rollouts.eval.run import evaluate
from rollouts.providers.tito import set_sampling_seed
from rollouts.run_config import RunConfig
from rollouts.training.backends import InferenceBackend, TrainingBackend
from rollouts.training.sample import TrainingSample, with_group_advantages

LOG_FILE = "log.jsonl"
CHECKPOINTS = "checkpoints"
_STATE = "state.json"


@dataclass(frozen=True)
class GRPOConfig:
    """How GRPO runs.

    output_dir: log, checkpoints (and the resume point).
    num_steps / batch_size / n_samples_per_prompt: steps, prompts per step, rollouts per prompt.
    max_tokens / temperature: per model call.
    max_turns: model turns per rollout (1 for single-turn tasks; more with tools).
    lr / max_grad_norm / num_minibatches / clip_eps / kl_coef: passed to the training backend
        (`TorchBackend` built by `rollouts.training.policy_from_pretrained` reads them).
    normalize_std: divide advantages by the group's standard deviation (GRPO) or not (Dr. GRPO).
    checkpoint_every: steps between checkpoints (the last step always gets one);
        keep_checkpoints: how many to keep.
    seed: prompt order and sampling seeds.
    """

    output_dir: Path
    num_steps: int = 10
    batch_size: int = 4
    n_samples_per_prompt: int = 8
    max_tokens: int = 128
    temperature: float = 1.0
    max_turns: int = 1
    lr: float = 1e-6
    max_grad_norm: float = 1.0
    num_minibatches: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    normalize_std: bool = True
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    prepare_messages: PrepareMessages = default_prepare_messages
    sample_timeout_s: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_steps", "batch_size", "n_samples_per_prompt", "max_tokens", "max_turns", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ConfigurationError(f"GRPOConfig.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if self.lr <= 0:
            raise ConfigurationError(f"GRPOConfig.lr must be > 0, got {self.lr}")

    def fingerprint(self) -> str:
        """What a resumed run must share with the run it continues (not num_steps)."""
        d = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("num_steps", "output_dir", "prepare_messages", "metadata")
        }
        d["prepare_messages"] = getattr(self.prepare_messages, "__qualname__", repr(self.prepare_messages))
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


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


def _checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    root = output_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.name.startswith("step_") and (p / _STATE).is_file():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def _truncate_log(path: Path, last_step: int) -> None:
    """Drop log lines of steps after `last_step` (they are run again after a resume)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["step"] <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by the kill
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    os.replace(tmp, path)


async def _write_checkpoint(config: GRPOConfig, backend: TrainingBackend, step: int) -> None:
    root = config.output_dir / CHECKPOINTS
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    await backend.save_checkpoint(tmp)
    state = {"step": step, "fingerprint": config.fingerprint(), "seed": config.seed}
    (tmp / _STATE).write_text(json.dumps(state), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)  # the checkpoint exists whole or not at all
    for _, old in _checkpoint_dirs(config.output_dir)[: -config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)


def _make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


async def _maybe_await(value: Any) -> Any:
    if hasattr(value, "__await__"):
        return await value
    return value


async def grpo_train(
    config: GRPOConfig,
    prompts: Sequence[Mapping[str, Any]],
    score_fn: ScoreFn,
    environment_factory: EnvironmentFactory | None = None,
    *,
    backend: TrainingBackend,
    inference: InferenceBackend,
    on_step: OnStep | None = None,
) -> GRPOResult:
    """Run GRPO (see the module docstring); resumes from `config.output_dir` if it holds a
    checkpoint of the same configuration."""
    if not prompts:
        raise ConfigurationError("grpo_train: no prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, Mapping):
            raise ConfigurationError(f"grpo_train: prompt {i} is a {type(p).__name__}; every prompt must be a dict")
    _make_dir(Path(config.output_dir))
    await backend.initialize()
    try:
        return await _train(config, prompts, score_fn, environment_factory, backend, inference, on_step)
    finally:
        with trio.CancelScope(shield=True):
            await backend.finalize()


async def _train(
    config: GRPOConfig,
    prompts: Sequence[Mapping[str, Any]],
    score_fn: ScoreFn,
    environment_factory: EnvironmentFactory | None,
    backend: TrainingBackend,
    inference: InferenceBackend,
    on_step: OnStep | None,
) -> GRPOResult:
    out = Path(config.output_dir)
    log_path = out / LOG_FILE
    start, resumed = 0, None
    checkpoints = _checkpoint_dirs(out)
    if checkpoints:
        step, path = checkpoints[-1]
        state = json.loads((path / _STATE).read_text(encoding="utf-8"))
        if state.get("fingerprint") != config.fingerprint():
            raise ConfigurationError(
                f"{out} holds a run with another configuration (checkpoint {path.name}); use a new output_dir "
                "or the same settings"
            )
        await backend.load_checkpoint(path)
        await inference.sync(backend, step)
        start, resumed = step + 1, step
    _truncate_log(log_path, start - 1)

    group_size = config.n_samples_per_prompt
    results: list[StepResult] = []
    for step in range(start, config.num_steps):
        t0 = time.perf_counter()
        chosen = prompts_for_step(len(prompts), config.batch_size, step, config.seed)
        rows = []
        for g, index in enumerate(chosen):
            for k in range(group_size):
                rows.append({**prompts[index], "id": f"step{step}-g{g}-k{k}", "_prompt_index": index})

        def start_sample(sample_id: str, row: Mapping[str, Any], _step: int = step) -> None:
            set_sampling_seed(_sample_seed(config.seed, _step, sample_id))

        eval_config = EvalConfig(
            endpoint=inference.endpoint(max_tokens=config.max_tokens, temperature=config.temperature),
            score_fn=score_fn,
            prepare_messages=config.prepare_messages,
            environment_factory=environment_factory,
            run_config=RunConfig(use_tito=True, max_turns=config.max_turns),
            max_turns=config.max_turns,
            max_concurrent=len(rows),
            sample_timeout_s=config.sample_timeout_s,
            provider_error_retries=0,
            show_progress=False,
            eval_name=f"grpo-step-{step}",
            on_sample_start=start_sample,
        )
        report = await evaluate(rows, eval_config)
        t_rollout = time.perf_counter()
        by_id = {s.id: s for s in report.samples}
        batch = [
            TrainingSample.from_eval_sample(by_id[row["id"]], group_index=i // group_size) for i, row in enumerate(rows)
        ]
        batch = with_group_advantages(batch, normalize_std=config.normalize_std)
        metrics = await backend.train_step(batch, config.lr)
        await inference.sync(backend, step)
        t_train = time.perf_counter()
        sampled = [lp for s in batch for lp, m in zip(s.rollout_logprobs, s.loss_mask, strict=True) if m]
        # the mean negative log-prob of the sampled tokens: a Monte Carlo estimate of the policy's entropy
        entropy = -sum(sampled) / len(sampled) if sampled else 0.0
        metrics = {**metrics, "entropy": entropy}
        rewards = [s.reward for s in batch]
        mean = sum(rewards) / len(rewards)
        std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        result = StepResult(
            step=step,
            reward_mean=mean,
            reward_std=std,
            metrics=dict(metrics),
            samples=len(batch),
            failed=sum(1 for s in batch if not s.tokens),
            seconds=t_train - t0,
            rollout_seconds=t_rollout - t0,
            train_seconds=t_train - t_rollout,
            model_tokens=sum(s.num_model_tokens for s in batch),
        )
        _append_line(log_path, json.dumps(result.to_dict()))
        if (step + 1) % config.checkpoint_every == 0 or step == config.num_steps - 1:
            with trio.CancelScope(shield=True):
                await _write_checkpoint(config, backend, step)
        results.append(result)
        if on_step is not None:
            await _maybe_await(on_step(result))
    return GRPOResult(tuple(results), resumed, out)
