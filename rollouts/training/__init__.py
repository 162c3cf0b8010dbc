"""RL training over agent rollouts: token-exact samples, GRPO, training and inference backends.

    model, tokenizer = load_causal_lm("smollm2-135m")     # or tiny_chat_model() in tests
    backend, policy = local_policy(model, tokenizer, config)
    result = await grpo_train(config, prompts, score_fn, backend=backend, inference=policy)

Install with `pip install torch==2.13.0 'rollouts[train]'` (the CPU build of torch first).
Modules: `config` (GRPOConfig, the learning-rate schedule), `sample` (TrainingSample,
advantages), `grpo` (the loop), `heldout` (held-out evaluation during training),
`checkpoints` (checkpoints and what a resume must share), `backends` (the TrainingBackend /
InferenceBackend protocols, in-process and served policies), `overlap` (rollouts generated
while the previous step trains: `max_policy_lag`), `torch_backend` (TorchBackend), `lora` (LoRA
adapters through peft, bf16, gradient checkpointing), `distributed` (torchrun: DDP / FSDP2),
`tiny` (a tiny test model). Packaged model files live in `rollouts.local_model.packaged`.
"""

from __future__ import annotations

import copy
from typing import Any

from rollouts.providers.transformers_local import load_causal_lm
from rollouts.training import distributed
from rollouts.training.backends import InferenceBackend, InProcessPolicy, ServedPolicy, TrainingBackend
from rollouts.training.config import GRPOConfig, learning_rate
from rollouts.training.distributed import DistributedError, World
from rollouts.training.grpo import GRPOResult, StepResult, TrainingError, grpo_train, prompts_for_step
from rollouts.training.heldout import HeldOut, HeldOutResult, evaluate_heldout
from rollouts.training.lora import load_adapted, prepare_model
from rollouts.training.sample import TrainingSample, group_advantages, token_view, with_group_advantages
from rollouts.training.torch_backend import TorchBackend, sequence_logprobs


def local_policy(
    model: Any, tokenizer: Any, config: GRPOConfig, *, name: str = "policy", max_batch_size: int = 64
) -> tuple[TorchBackend, InProcessPolicy]:
    """A TorchBackend training `model` with `config`'s settings and the InProcessPolicy serving
    the same module as `Endpoint("transformers", name)`. `model` is first cast to `config.dtype`,
    given gradient checkpointing and wrapped with LoRA adapters as the config says
    (`rollouts.training.lora.prepare_model`; `backend.model` is then the peft model). When
    `config.kl_coef > 0` the reference is a frozen copy of the start — or, with LoRA, the same
    model with its adapters disabled. With `config.max_policy_lag > 0` the policy generates from
    a copy of the trained weights (`InProcessPolicy(snapshot=True)`), so rollouts can be
    generated while the trainer steps. Under torchrun it joins the process group
    (`distributed.init_from_env`) and, when CUDA is available, moves `model` to this process's
    GPU (LOCAL_RANK)."""
    world = distributed.init_from_env()
    if distributed.env_world() is not None:
        model.to(distributed.device(world))
    model = prepare_model(model, config)
    overlapped = config.max_policy_lag > 0  # generation from a copy of the weights (training.overlap)
    policy = InProcessPolicy(name, model, tokenizer, max_batch_size=max_batch_size, snapshot=overlapped)
    reference = None
    if config.kl_coef > 0 and not config.lora_r:
        reference = copy.deepcopy(model).eval()
        for p in reference.parameters():
            p.requires_grad_(False)
    backend = TorchBackend(
        model,
        max_grad_norm=config.max_grad_norm,
        num_minibatches=config.num_minibatches,
        clip_eps=config.clip_eps,
        kl_coef=config.kl_coef,
        loss_normalization=config.loss_normalization,
        reference_model=reference,
        temperature=config.temperature,
        weights_lock=None if overlapped else policy.weights_lock,
        pad_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id),
        parallel=config.parallel,
        share_prefix=config.share_prefix,
    )
    return backend, policy


__all__ = [
    "DistributedError",
    "GRPOConfig",
    "GRPOResult",
    "HeldOut",
    "HeldOutResult",
    "InProcessPolicy",
    "InferenceBackend",
    "ServedPolicy",
    "StepResult",
    "TorchBackend",
    "TrainingBackend",
    "TrainingError",
    "TrainingSample",
    "World",
    "evaluate_heldout",
    "grpo_train",
    "group_advantages",
    "learning_rate",
    "load_adapted",
    "load_causal_lm",
    "local_policy",
    "prepare_model",
    "prompts_for_step",
    "sequence_logprobs",
    "token_view",
    "with_group_advantages",
]
