"""GRPOConfig: how `grpo_train` runs, and the learning-rate schedule it computes.

Defaults follow trl's `GRPOConfig` (1.x), so a trl user gets the objective they expect:
`loss_normalization="per_token"` (trl's `loss_type="dapo"`), `scale_rewards="group"` with the
unbiased standard deviation and eps 1e-4, `lr_schedule="linear"` decay with no warm-up,
`lr=1e-6`, `clip_eps=0.2`, `kl_coef=0.0`, `max_grad_norm=1.0`. docs/training.md writes out the
formula each setting computes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollouts.errors import ConfigurationError
from rollouts.eval.config import PrepareMessages, default_prepare_messages

LossNormalization = Literal["per_token", "per_sequence"]
ScaleRewards = Literal["group", "batch", "none"]
LRSchedule = Literal["linear", "cosine", "constant"]
Dtype = Literal["fp32", "bf16"]
Parallel = Literal["ddp", "fsdp"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "loss_normalization": ("per_token", "per_sequence"),
    "scale_rewards": ("group", "batch", "none"),
    "lr_schedule": ("linear", "cosine", "constant"),
    "dtype": ("fp32", "bf16"),
    "parallel": ("ddp", "fsdp"),
}


@dataclass(frozen=True)
class GRPOConfig:
    """How GRPO runs (docs/training.md has the formulas).

    output_dir: log, checkpoints (and the resume point).
    num_steps / batch_size / n_samples_per_prompt: steps, prompts per step, rollouts per prompt
        (at least 2: a group of one has advantage 0 and teaches nothing).
    max_tokens / temperature: per model call (temperature > 0: at 0 every completion of a group
        is the same, so every advantage is 0).
    max_turns: model turns per rollout (1 for single-turn tasks; more with tools).
    lr / lr_schedule / warmup_steps: the peak learning rate and its schedule over `num_steps`
        (linear or cosine decay to 0 after a linear warm-up from 0, or constant), as
        transformers' schedulers compute it. The one place the learning rate is given: the
        training backend gets each step's value.
    loss_normalization: "per_token" averages the clipped objective over every sampled token of
        the step (trl's "dapo"); "per_sequence" averages each completion's tokens, then the
        completions (the original GRPO, trl's "grpo").
    scale_rewards: advantages are reward minus the group mean, divided by the group's ("group")
        or the whole step's ("batch") unbiased standard deviation + 1e-4, or not divided ("none",
        Dr. GRPO).
    max_grad_norm / num_minibatches / clip_eps / kl_coef: passed to the training backend
        (`rollouts.training.local_policy` builds a `TorchBackend` with them).
    max_failed_fraction: the share of a step's rollouts that may fail (provider error, a score
        function that raises, ...) before the run stops with the first error; 0.0 (the default)
        stops on any failure, as trl does on a reward exception. A step in which every rollout
        failed always stops.
    checkpoint_every: steps between checkpoints (the last step always gets one);
        keep_checkpoints: how many to keep.
    seed: prompt order, sampling seeds and the LoRA adapters' initialisation.
    lora_r / lora_alpha / lora_targets: train LoRA adapters (peft) of rank `lora_r` (0, the
        default: train every weight), scale `lora_alpha / lora_r`, on the modules named
        (`("all-linear",)`: every linear layer but the output layer) instead of the whole model;
        the KL reference is then the model with its adapters disabled (no second copy).
    dtype: the weights' dtype in the trainer, "fp32" (default) or "bf16" (half the memory; on a
        CPU without native bf16 matmuls slower, and full fine-tuning in bf16 rounds away updates
        smaller than about 1/256 of a weight: docs/training.md).
    gradient_checkpointing: recompute each decoder layer's activations in the backward pass
        instead of keeping them (less memory, about one more forward pass of time); not part
        of what a resume must share (it does not change the arithmetic).
    share_prefix: a speed option: the training pass runs the columns all rollouts of a pass share
        (a group's prompt; a task's system prompt and worked examples, which every prompt of the
        step shares) once instead of once per rollout, and every rollout's own tokens attend to
        their keys and values — the same update to float rounding (docs/training.md "Shared
        prompt prefix"). Off by default so that runs at different world sizes and memory options
        compute the same to the last bit; not with gradient_checkpointing (it drops the cache
        the rollouts attend to) nor parallel="fsdp" (FSDP2 aborts when a sharded layer runs
        twice in one forward). Not part of what a resume must share. (Generation always shares
        the prompts' common beginning: it changes no sampled token.)
    max_policy_lag: how many training steps older than the step it trains a rollout's policy
        may be. 0: generation and training strictly alternate; 1 (the default): step k + 1's
        rollouts are generated while step k trains, by the policy before step k's update (the
        clipped ratio uses the sampler's stored log-probs, so the update stays the correct
        off-policy one); checkpoint steps drain, so resumes stay exact
        (`rollouts.training.overlap`). Larger values are accepted; the lag never exceeds 1.
    keep_step_samples: also write each step's rollouts (an eval output directory: samples.jsonl,
        report.json) to `<output_dir>/steps/step_NNNNNN/`, which `rollouts view` links from the
        step; off by default (the token records make them large). Not part of the resume check.
    parallel: under torchrun with more than one process, "ddp" (each process holds the model and
        optimizer state; gradients are all-reduced) or "fsdp" (FSDP2: parameters, gradients and
        optimizer state sharded over the processes); ignored in one process. Not part of what a
        resume must share: a run resumes at another world size or parallelism.
    """

    output_dir: Path
    num_steps: int = 10
    batch_size: int = 4
    n_samples_per_prompt: int = 8
    max_tokens: int = 128
    temperature: float = 1.0
    max_turns: int = 1
    lr: float = 1e-6
    lr_schedule: LRSchedule = "linear"
    warmup_steps: int = 0
    loss_normalization: LossNormalization = "per_token"
    scale_rewards: ScaleRewards = "group"
    max_grad_norm: float = 1.0
    num_minibatches: int = 1
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    max_failed_fraction: float = 0.0
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    lora_r: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("all-linear",)
    dtype: Dtype = "fp32"
    gradient_checkpointing: bool = False
    share_prefix: bool = False
    max_policy_lag: int = 1
    prepare_messages: PrepareMessages = default_prepare_messages
    sample_timeout_s: float | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    keep_step_samples: bool = False
    parallel: Parallel = "ddp"

    def __post_init__(self) -> None:
        for name in ("num_steps", "batch_size", "max_tokens", "max_turns", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"GRPOConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_samples_per_prompt < 2:
            raise ConfigurationError(
                f"GRPOConfig.n_samples_per_prompt must be >= 2, got {self.n_samples_per_prompt}: advantages are "
                "relative to the other completions of the same prompt, so a group of one has advantage 0 and "
                "teaches nothing"
            )
        if not self.temperature > 0:
            raise ConfigurationError(
                f"GRPOConfig.temperature must be > 0, got {self.temperature}: at temperature 0 every completion "
                "of a prompt is the same, so every advantage is 0 and nothing is learned"
            )
        if not self.lr > 0:
            raise ConfigurationError(f"GRPOConfig.lr must be > 0, got {self.lr}")
        if isinstance(self.lora_targets, str):
            raise ConfigurationError(
                f"GRPOConfig.lora_targets must be a tuple of module names, got the string {self.lora_targets!r}"
            )
        if self.lora_r < 0 or not self.lora_alpha > 0 or not self.lora_targets:
            raise ConfigurationError(
                f"GRPOConfig: lora_r must be >= 0 (0: no LoRA), lora_alpha > 0 and lora_targets non-empty; got "
                f"lora_r={self.lora_r}, lora_alpha={self.lora_alpha}, lora_targets={self.lora_targets!r}"
            )
        if self.max_policy_lag < 0:
            raise ConfigurationError(
                f"GRPOConfig.max_policy_lag must be >= 0 (0: strict alternation), got {self.max_policy_lag}"
            )
        if self.warmup_steps < 0:
            raise ConfigurationError(f"GRPOConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.max_failed_fraction < 1.0:
            raise ConfigurationError(
                f"GRPOConfig.max_failed_fraction must be in [0, 1), got {self.max_failed_fraction} "
                "(a step in which every rollout failed has nothing to train on)"
            )
        if self.share_prefix and (self.gradient_checkpointing or self.parallel == "fsdp"):
            raise ConfigurationError(
                "GRPOConfig.share_prefix cannot be combined with "
                + ("gradient_checkpointing" if self.gradient_checkpointing else 'parallel="fsdp"')
                + ": turn one of them off (share_prefix saves time, the other memory)"
            )
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ConfigurationError(
                    f"GRPOConfig.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )

    def settings(self) -> dict[str, Any]:
        """What a resumed run must share with the run it continues, by name: every setting but
        num_steps (a run may be extended), output_dir, metadata, gradient_checkpointing (memory
        only), share_prefix (speed only), keep_step_samples (what is written, not what is
        trained), parallel (a run resumes at another world size or parallelism) and the callables (those are fingerprinted by
        identity: see `rollouts.training.checkpoints`). The LoRA settings are left out when LoRA
        is off, and dtype when it is fp32, so runs checkpointed before those settings existed
        still resume."""
        skip = {"num_steps", "output_dir", "prepare_messages", "metadata", "gradient_checkpointing"}
        skip |= {"keep_step_samples", "parallel", "share_prefix"}
        if self.lora_r == 0:
            skip |= {"lora_r", "lora_alpha", "lora_targets"}
        if self.dtype == "fp32":
            skip.add("dtype")
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in skip}


def learning_rate(config: GRPOConfig, step: int) -> float:
    """The learning rate of `step` (0-based): transformers' `get_scheduler` over `num_steps` with
    `warmup_steps` (linear warm-up from 0, then linear or half-cosine decay to 0, or constant)."""
    total, warmup = config.num_steps, config.warmup_steps
    if step < warmup:
        return config.lr * step / max(1, warmup)
    if config.lr_schedule == "constant":
        return config.lr
    progress = (step - warmup) / max(1, total - warmup)
    if config.lr_schedule == "linear":
        return config.lr * max(0.0, 1.0 - progress)
    return config.lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
