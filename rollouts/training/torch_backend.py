"""TorchBackend: the clipped policy-gradient step in plain torch (CPU or one GPU).

`train_step(batch, lr)` (docs/training.md writes the formulas out):
* the samples with sampled tokens are the step's; the others (failed rollouts) are not trained on;
* per sampled token: ratio = exp(logp - logp_rollout), loss = -min(ratio * A, clip(ratio, 1 - eps,
  1 + eps) * A), plus `kl_coef` times the k3 estimate of KL(policy || reference) when a reference
  model is given (or, for a peft model with LoRA adapters, the same model with its adapters
  disabled: no second copy of the weights);
* `loss_normalization="per_token"` (trl's "dapo", the default) divides the sum over every sampled
  token of the step by their number; "per_sequence" (the original GRPO) takes each completion's
  mean over its tokens, then the mean over completions. Samples with advantage 0 count in both
  denominators, as in trl; without a KL term their loss and gradient are exactly 0, so their
  forward pass is skipped;
* the computed samples are split into `num_minibatches` minibatches, each run as one right-padded
  batch; the gradients accumulate into exactly the step over the whole batch;
* gradients are clipped to `max_grad_norm`, then one AdamW step at the `lr` given (the schedule
  lives in `GRPOConfig`; the backend holds no learning rate of its own).
Under `torchrun` (more than one process: `rollouts.training.distributed`) each rank trains on its
own samples: the denominators above are the whole step's (summed over the ranks), gradients are
all-reduced (`parallel="ddp"`) or sharded with FSDP2 (`parallel="fsdp"`), so N processes make
the update one process would make on the same step; the metrics are the step's; rank 0 writes
checkpoints, in the one-process format.
`clip_fraction` is trl's: the share of sampled tokens where clipping binds — ratio > 1 + eps with
a positive advantage, or ratio < 1 - eps with a negative one.

Only the parameters that require gradients are trained (with LoRA: the adapters). A checkpoint
then holds those alone (the frozen weights are the starting model's, which the run's
fingerprint checks) and, for a peft model, the adapters as `save_pretrained` writes them
(`adapter/`). With gradient checkpointing enabled on the model (`rollouts.training.lora`), the
training forward passes recompute each layer's activations in the backward pass.

It runs in a worker thread, holding `weights_lock` (the generation engine's, when the model is
also served in process) so no token is sampled from half-updated weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from rollouts.errors import ConfigurationError
from rollouts.training import distributed, lora
from rollouts.training.sample import TrainingSample


def _torch() -> Any:
    import torch

    return torch


def sequence_logprobs(model: Any, tokens: Sequence[int], *, temperature: float = 1.0) -> list[float]:
    """The model's log-prob of each token given the ones before it (position 0 gets 0.0), under
    logits / temperature — what the trainer recomputes for a recorded rollout."""
    torch = _torch()
    device = next(model.parameters()).device
    with torch.inference_mode():
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return [0.0, *lp.cpu().tolist()]


def binding_clips(ratio: Any, advantage: Any, clip_eps: float) -> Any:
    """Where the clipped objective binds (trl's clip_ratio/region): the ratio above 1 + eps with a
    positive advantage, or below 1 - eps with a negative one. Elsewhere a ratio outside the band
    is not clipped: the unclipped term is the smaller one and its gradient flows."""
    return ((ratio > 1 + clip_eps) & (advantage > 0)) | ((ratio < 1 - clip_eps) & (advantage < 0))


class TorchBackend:
    """A `TrainingBackend` over a torch causal LM (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        max_grad_norm: float = 1.0,
        num_minibatches: int = 1,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        loss_normalization: str = "per_token",
        reference_model: Any = None,
        temperature: float = 1.0,
        weight_decay: float = 0.0,
        weights_lock: Any = None,
        pad_id: int = 0,
        parallel: str = "ddp",
        share_prefix: bool = False,
    ) -> None:
        if num_minibatches < 1:
            raise ValueError(f"TorchBackend: num_minibatches must be >= 1, got {num_minibatches}")
        if kl_coef > 0 and reference_model is None and not lora.is_adapted(model):
            raise ValueError(
                "TorchBackend: kl_coef > 0 needs a reference_model (a frozen copy of the start), or a peft model "
                "(LoRA), whose reference is the model with its adapters disabled"
            )
        if loss_normalization not in ("per_token", "per_sequence"):
            raise ValueError(
                f"TorchBackend: loss_normalization must be per_token or per_sequence, got {loss_normalization!r}"
            )
        self.model = model
        self.loss_normalization = loss_normalization
        self.max_grad_norm = max_grad_norm
        self.num_minibatches = num_minibatches
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.reference_model = reference_model
        self.temperature = temperature
        self.weight_decay = weight_decay
        self.weights_lock = weights_lock or threading.Lock()
        self.pad_id = pad_id
        if parallel not in distributed.PARALLEL_CHOICES:
            raise ValueError(f"TorchBackend: parallel must be ddp or fsdp, got {parallel!r}")
        self.parallel = parallel  # used only under torchrun with more than one process
        if share_prefix and parallel == "fsdp":
            raise ValueError("TorchBackend: share_prefix cannot be combined with parallel='fsdp'")
        self.share_prefix = share_prefix
        self.optimizer: Any = None
        self.device = next(model.parameters()).device
        self._prepared: distributed.Prepared | None = None

    # -- protocol --------------------------------------------------------------------------

    async def initialize(self) -> None:
        torch = _torch()
        if self._prepared is None:
            world = distributed.init_from_env()
            self._prepared = distributed.prepare_training(
                self.model, self.parallel, world, share_prefix=self.share_prefix
            )
        if self.optimizer is None:
            # lr is set by every train_step (the schedule is GRPOConfig's)
            self.optimizer = torch.optim.AdamW(
                [p for p in self._prepared.trained.parameters() if p.requires_grad],
                lr=0.0,
                weight_decay=self.weight_decay,
            )
        self.model.eval()  # no dropout: the policy trained is the policy sampled

    async def train_step(self, batch: Sequence[TrainingSample], lr: float) -> Mapping[str, float]:
        assert self.optimizer is not None, "TorchBackend.initialize() must run before train_step"
        return await trio.to_thread.run_sync(self._train_step, list(batch), lr)

    async def finalize(self) -> None:
        self.optimizer = None

    async def save_checkpoint(self, directory: Path) -> None:
        await trio.to_thread.run_sync(self._save_checkpoint, Path(directory))

    async def load_checkpoint(self, directory: Path) -> None:
        await trio.to_thread.run_sync(self._load_checkpoint, Path(directory))

    async def save_weights(self, directory: Path) -> None:
        """`save_pretrained` of the model; of an adapted model, of a merged copy (whole weights, as
        an inference server loads them)."""

        def save() -> None:
            if self._prepared is not None and not self._prepared.world.is_main:
                return  # rank 0 writes
            with self.weights_lock:
                if lora.is_adapted(self.model):
                    lora.merged_model(self.model).save_pretrained(str(directory))
                else:
                    self.model.save_pretrained(str(directory))

        await trio.to_thread.run_sync(save)

    def model_identity(self) -> dict[str, str]:
        torch = _torch()
        architecture = hashlib.sha256(str(getattr(getattr(self.model, "config", None), "model_type", "")).encode())
        weights = hashlib.sha256()
        with self.weights_lock:
            for name, tensor in self.model.state_dict().items():
                architecture.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
                weights.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        return {"architecture": architecture.hexdigest()[:16], "weights": weights.hexdigest()[:16]}

    # -- work ------------------------------------------------------------------------------

    def _minibatch_terms(self, samples: list[TrainingSample], weights: list[float]) -> tuple[Any, dict[str, float]]:
        """The weighted loss of `samples` (one padded forward pass; sample i's tokens are weighted
        `weights[i]`) and its sums (KL, entropy, binding clips over the sampled tokens)."""
        torch = _torch()
        width = max(len(s.tokens) for s in samples)
        n = len(samples)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.float32)
        old = torch.zeros((n, width), dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        weight = torch.tensor(weights, dtype=torch.float32)
        for i, s in enumerate(samples):
            k = len(s.tokens)
            ids[i, :k] = torch.tensor(s.tokens, dtype=torch.long)
            attn[i, :k] = 1
            mask[i, :k] = torch.tensor(s.loss_mask, dtype=torch.float32)
            old[i, :k] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        ids, attn, mask, old, adv, weight = (t.to(self.device) for t in (ids, attn, mask, old, adv, weight))
        # Only the sampled positions need the output layer (a 49k-word vocabulary makes it the
        # largest matmul of a small model): row r, position p predicts token p + 1.
        rows, cols = torch.nonzero(mask[:, 1:] > 0, as_tuple=True)
        target = ids[rows, cols + 1]
        old_lp = old[rows, cols + 1]
        assert self._prepared is not None
        logp_all = self._selected_logprobs(self._prepared.module, ids, attn, rows, cols)
        logp = logp_all.gather(-1, target[:, None])[:, 0]
        ratio = torch.exp(logp - old_lp)
        a = adv[rows]
        per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.clip_eps, 1 + self.clip_eps) * a)
        kl = torch.zeros_like(per_token)
        if self.kl_coef > 0:
            with torch.no_grad(), self._reference() as reference:
                reference = distributed.selected_logits_module(reference)
                ref_all = self._selected_logprobs(reference, ids, attn, rows, cols)
                ref_lp = ref_all.gather(-1, target[:, None])[:, 0]
            delta = ref_lp - logp
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + self.kl_coef * kl
        total = (per_token * weight[rows]).sum()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            stats = {
                "kl": float(kl.sum()),
                "entropy": float(entropy.sum()),
                "clipped": float(binding_clips(ratio, a, self.clip_eps).sum()),
                "ratio_max": float(ratio.max()),
            }
        return total, stats

    @contextlib.contextmanager
    def _reference(self) -> Iterator[Any]:
        """The KL reference: the frozen copy given, else the model with its adapters disabled."""
        if self.reference_model is not None:
            yield self.reference_model
        else:
            with lora.adapters_disabled(self.model) as base:
                yield base

    def _selected_logprobs(self, module: Any, ids: Any, attn: Any, rows: Any, cols: Any) -> Any:
        """Log-softmax (at `temperature`) of the next-token logits at positions (rows, cols);
        `module` is a `distributed.selected_logits_module` (wrapped in DDP / FSDP under torchrun)."""
        torch = _torch()
        logits = module(ids, attn, rows, cols)
        if self.temperature > 0 and self.temperature != 1.0:
            logits = logits / self.temperature
        return torch.log_softmax(logits, dim=-1)

    def _loss_weights(self, usable: list[TrainingSample], n_usable: float, total_tokens: float) -> dict[str, float]:
        """Each sample's per-token weight in the step's loss (see the module docstring); `n_usable`
        and `total_tokens` are the whole step's (every rank's)."""
        if self.loss_normalization == "per_token":
            return {s.id: 1.0 / total_tokens for s in usable}
        return {s.id: 1.0 / (s.num_model_tokens * n_usable) for s in usable}

    def _minibatches(self, computed: list[TrainingSample], world: distributed.World) -> list[list[TrainingSample]]:
        """The forward/backward passes of the step. Under torchrun every rank runs exactly
        `num_minibatches` passes (an empty one where it has fewer samples): DDP and FSDP
        exchange at every pass, so the ranks must run the same number."""
        size = max(1, math.ceil(len(computed) / self.num_minibatches))
        parts = [computed[start : start + size] for start in range(0, len(computed), size)]
        if world.distributed:
            parts += [[] for _ in range(self.num_minibatches - len(parts))]
        return parts

    def _idle_pass(self) -> Any:
        """A pass contributing nothing (weight 0) for a rank with no sample left this pass: it
        still takes part in the gradient exchange."""
        pad = self.pad_id
        idle = TrainingSample("__idle__", -1, tokens=(pad, pad), loss_mask=(0, 1), rollout_logprobs=(0.0, 0.0))
        return self._minibatch_terms([idle], [0.0])[0]

    def _train_step(self, batch: list[TrainingSample], lr: float) -> dict[str, float]:
        assert self._prepared is not None
        prepared, world = self._prepared, self._prepared.world
        usable = [s for s in batch if s.tokens and s.num_model_tokens > 0]
        computed = [s for s in usable if s.advantage != 0.0 or self.kl_coef > 0]
        counts = [len(usable), sum(s.num_model_tokens for s in usable), len(computed)]
        counts.append(sum(s.num_model_tokens for s in computed))
        n_usable, total_tokens, n_computed, computed_tokens = distributed.all_reduce_sums(
            world, counts, "summing the step's token counts"
        )
        metrics = {"loss": 0.0, "kl": 0.0, "train_entropy": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0, "lr": lr}
        metrics["trained_samples"] = float(n_usable)
        metrics["nonzero_advantage_samples"] = float(n_computed)
        metrics["model_tokens"] = float(total_tokens)
        if not n_computed:
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        weights = self._loss_weights(usable, n_usable, total_tokens)
        parts = self._minibatches(computed, world)
        loss_sum = clipped = kl = entropy = 0.0
        exchange = distributed.collective(world, "the step's gradient exchange", only_if_a_peer_failed=True)
        with self.weights_lock, lora.checkpointing_active(prepared.trained), exchange:
            self.optimizer.zero_grad(set_to_none=True)
            for i, part in enumerate(parts):
                with distributed.gradient_sync(prepared, enabled=i == len(parts) - 1):
                    if not part:
                        self._idle_pass().backward()
                        continue
                    loss, stats = self._minibatch_terms(part, [weights[s.id] for s in part])
                    # DDP and FSDP average the ranks' gradients; the step's gradient is their sum
                    (loss * world.size if world.distributed else loss).backward()
                loss_sum += float(loss.detach())
                kl += stats["kl"]
                entropy += stats["entropy"]
                clipped += stats["clipped"]
            params = [p for p in prepared.trained.parameters() if p.grad is not None]
            metrics["grad_norm"] = distributed.clip_grad_norm(prepared, params, self.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            distributed.copy_to_replica(prepared, self.model)
        loss_sum, kl, entropy, clipped = distributed.all_reduce_sums(
            world, [loss_sum, kl, entropy, clipped], "summing the step's metrics"
        )
        metrics["loss"] = loss_sum
        metrics["kl"] = kl / computed_tokens
        metrics["train_entropy"] = entropy / computed_tokens
        metrics["clip_fraction"] = clipped / total_tokens
        return metrics

    def _frozen_names(self) -> set[str]:
        """State-dict names of the parameters not trained (tied ones under every name)."""
        return {name for name, p in self.model.named_parameters(remove_duplicate=False) if not p.requires_grad}

    def _save_checkpoint(self, directory: Path) -> None:
        """Weights, optimizer and RNG in the one-process format (gathered whole under FSDP: a
        collective); only rank 0 writes."""
        torch = _torch()
        assert self._prepared is not None
        main = self._prepared.world.is_main
        if main:
            directory.mkdir(parents=True, exist_ok=True)
        frozen = self._frozen_names()
        with self.weights_lock:
            if main and lora.is_adapted(self.model):
                lora.save_adapter(self.model, directory / "adapter")
            state = {
                "model": {k: v.detach().clone() for k, v in self.model.state_dict().items() if k not in frozen},
                "frozen": sorted(frozen),
                "optimizer": (
                    distributed.full_optimizer_state(self._prepared, self.optimizer)
                    if self.optimizer is not None
                    else None
                ),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            }
        if main:
            torch.save(state, directory / "trainer.pt")

    def _load_checkpoint(self, directory: Path) -> None:
        """Restore a checkpoint written at any world size: rank 0 reads it and sends it to the
        others (their disks need not hold it)."""
        torch = _torch()
        assert self._prepared is not None
        world = self._prepared.world
        state = None
        if world.is_main:
            where = "cpu" if world.distributed else self.device
            state = torch.load(directory / "trainer.pt", map_location=where, weights_only=False)
        state = distributed.broadcast(world, state, "sending the checkpoint")
        assert state is not None
        frozen = self._frozen_names()
        with self.weights_lock:
            try:
                if sorted(frozen) != state.get("frozen", []):
                    raise RuntimeError("the checkpoint trained other parameters than this model trains")
                result = self.model.load_state_dict(state["model"], strict=not frozen)
                if result is not None and (result.unexpected_keys or set(result.missing_keys) - frozen):
                    raise RuntimeError(f"missing {result.missing_keys[:3]}, unexpected {result.unexpected_keys[:3]}")
            except RuntimeError as e:  # another architecture (a checkpoint of an older format, unchecked)
                first = str(e).strip().splitlines()[0]
                raise ConfigurationError(
                    f"checkpoint {directory} holds weights of another model architecture ({first}); resume with "
                    "the model the run started from, or use a new output directory"
                ) from None
            if state["optimizer"] is not None and self.optimizer is None:
                raise AssertionError("load_checkpoint after initialize(): the optimizer must exist")
            distributed.load_full_state(self._prepared, self.model, state["model"], self.optimizer, state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
