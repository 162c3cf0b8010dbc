"""Memory options of the in-process trainer: LoRA adapters (peft), bf16 weights, gradient
checkpointing — and the helpers that save, merge and copy an adapted model.

`prepare_model(model, config)` gives the module `local_policy` trains:

* `config.dtype == "bf16"`: the weights are cast to bfloat16 (half the bytes of float32;
  log-probs and the loss are still computed in float32 from the logits);
* `config.lora_r > 0`: the model is wrapped with peft LoRA adapters (rank `lora_r`, scale
  `lora_alpha / lora_r`, on the `lora_targets` modules — `all-linear` by default: every linear
  layer but the output layer). Only the adapter weights require gradients, so only they get
  gradients and AdamW state; the base weights stay frozen (and bit-identical). The adapters'
  random initialisation is seeded from `config.seed` (B starts at 0, so the adapted model starts
  as the base model). peft keeps adapters in float32 under bf16 base weights;
* `config.gradient_checkpointing`: transformers' activation checkpointing on every decoder layer
  (non-reentrant), so a layer's activations are recomputed in the backward pass instead of kept.

The KL reference of an adapted model is the same module with its adapters disabled
(`adapters_disabled`), so no second copy of the weights is needed. `save_adapter` writes the
adapters on their own (`save_pretrained` of the PeftModel, naming the base model) and
`merged_model` / `load_adapted` put them back into the base weights (`merge_and_unload`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollouts.errors import ConfigurationError
from rollouts.training.config import GRPOConfig


def _torch() -> Any:
    import torch

    return torch


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigurationError(
            "LoRA training needs peft: pip install 'rollouts[train]' (or pip install peft)"
        ) from None
    return peft


def is_adapted(model: Any) -> bool:
    """Whether `model` is a peft model (LoRA adapters over frozen base weights)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def prepare_model(model: Any, config: GRPOConfig) -> Any:
    """The module to train (see the module docstring): `model` in `config.dtype`, with gradient
    checkpointing when asked, wrapped with LoRA adapters when `config.lora_r > 0`. `model` itself
    is changed in place (cast, adapter layers injected)."""
    torch = _torch()
    if config.dtype == "bf16":
        model.to(torch.bfloat16)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if config.lora_r > 0:
        model = add_lora(model, r=config.lora_r, alpha=config.lora_alpha, targets=config.lora_targets, seed=config.seed)
    return model


def add_lora(model: Any, *, r: int, alpha: float, targets: tuple[str, ...], seed: int) -> Any:
    """`model` wrapped with peft LoRA adapters (no dropout: the policy trained is the policy
    sampled); the adapters' random init is drawn from a generator seeded with `seed`, without
    touching the global torch RNG."""
    peft = _peft()
    torch = _torch()
    target: str | list[str] = "all-linear" if tuple(targets) == ("all-linear",) else list(targets)
    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=target, lora_dropout=0.0, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            adapted = peft.get_peft_model(model, config)
        except ValueError as e:  # e.g. target modules not found in the model
            raise ConfigurationError(
                f"LoRA: {e} (set lora_targets / --lora-targets to module names of this model)"
            ) from None
    adapted.eval()
    return adapted


def enable_gradient_checkpointing(model: Any) -> None:
    """Turn on transformers' activation checkpointing (non-reentrant) on every decoder layer."""
    base = model.get_base_model() if is_adapted(model) else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigurationError(f"gradient checkpointing: {type(base).__name__} does not support it")
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def checkpointing_active(model: Any) -> Iterator[None]:
    """While open, the checkpointed layers recompute their activations in the backward pass.
    transformers checkpoints a layer only in training mode; the trainer keeps the model in eval
    mode (no dropout), so this sets the training flag on the checkpointed layers alone — their
    submodules (attention and dropout) stay in eval mode."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True]
    before = [m.training for m in layers]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m, flag in zip(layers, before, strict=True):
            m.training = flag


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[Any]:
    """The base model's forward pass through `model` (a peft model): its adapters disabled while open."""
    with model.disable_adapter():
        yield model


def generation_copy(model: Any) -> Any:
    """A copy of `model` to generate from while the original trains: the parameters being
    trained (and buffers) are copied, the frozen ones shared — with LoRA only the adapters
    cost memory, in full fine-tuning one more copy of the weights."""
    torch = _torch()
    memo: dict[int, Any] = {id(p): p for p in model.parameters() if not p.requires_grad}
    duplicate = copy.deepcopy(model, memo)
    for p in duplicate.parameters():
        p.requires_grad_(False)
    duplicate.eval()
    with torch.no_grad():
        copy_trained_weights(model, duplicate)
    return duplicate


def copy_trained_weights(source: Any, target: Any) -> None:
    """Copy `source`'s parameters into `target`'s (a `generation_copy`), skipping shared ones."""
    torch = _torch()
    with torch.no_grad():
        for (name, a), (other, b) in zip(source.named_parameters(), target.named_parameters(), strict=True):
            assert name == other, (name, other)
            if a is not b:
                b.copy_(a)


def save_adapter(model: Any, directory: Path, *, base_model: str | None = None) -> None:
    """Write `model`'s adapters on their own (`save_pretrained` of the PeftModel:
    adapter_config.json + adapter_model.safetensors), naming `base_model` (what
    `load_adapted` / `rollouts train merge` load them onto) when given."""
    if base_model is not None:
        for cfg in model.peft_config.values():
            cfg.base_model_name_or_path = base_model
    model.save_pretrained(str(directory))


def merged_model(model: Any) -> Any:
    """The base model with `model`'s adapters merged into its weights (`merge_and_unload`), as
    a new module (a copy: `model` keeps training)."""
    return copy.deepcopy(model).merge_and_unload()


def load_adapted(directory: Path, *, base: str | None = None) -> tuple[Any, Any]:
    """`(model, tokenizer)`: the base model named in `directory`'s adapter_config.json (or
    `base`) with the adapters of `directory` merged in — a plain model again."""
    from rollouts.providers.transformers_local import load_merged_adapter

    return load_merged_adapter(Path(directory), base=base)
