"""TorchBackend: the clipped policy-gradient step in plain torch (CPU or one GPU).

`train_step(batch, lr)`:
* samples with nothing to learn from (no tokens, or advantage 0 when there is no KL term) are
  skipped;
* the rest are split into `num_minibatches` minibatches; each is run as one right-padded batch,
  and its gradients accumulate (weighted so the step equals one over the whole batch);
* per sampled token: ratio = exp(logp - logp_rollout), loss = -min(ratio * A, clip(ratio, 1 - eps,
  1 + eps) * A), plus `kl_coef` times the k3 estimate of KL(policy || reference) when a reference
  model is given; a sample's loss is the mean over its sampled tokens, the batch's the mean over
  samples;
* gradients are clipped to `max_grad_norm`, then one optimizer step (AdamW by default).

It runs in a worker thread, holding `weights_lock` (the generation engine's, when the model is
also served in process) so no token is sampled from half-updated weights.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

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


class TorchBackend:
    """A `TrainingBackend` over a torch causal LM (see the module docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        lr: float = 1e-6,
        max_grad_norm: float = 1.0,
        num_minibatches: int = 1,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        reference_model: Any = None,
        temperature: float = 1.0,
        weight_decay: float = 0.0,
        weights_lock: Any = None,
        pad_id: int = 0,
    ) -> None:
        if num_minibatches < 1:
            raise ValueError(f"TorchBackend: num_minibatches must be >= 1, got {num_minibatches}")
        if kl_coef > 0 and reference_model is None:
            raise ValueError("TorchBackend: kl_coef > 0 needs a reference_model (a frozen copy of the start)")
        self.model = model
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.num_minibatches = num_minibatches
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.reference_model = reference_model
        self.temperature = temperature
        self.weight_decay = weight_decay
        self.weights_lock = weights_lock or threading.Lock()
        self.pad_id = pad_id
        self.optimizer: Any = None
        self.device = next(model.parameters()).device

    # -- protocol --------------------------------------------------------------------------

    async def initialize(self) -> None:
        torch = _torch()
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                [p for p in self.model.parameters() if p.requires_grad], lr=self.lr, weight_decay=self.weight_decay
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
        def save() -> None:
            with self.weights_lock:
                self.model.save_pretrained(str(directory))

        await trio.to_thread.run_sync(save)

    # -- work ------------------------------------------------------------------------------

    def _minibatch_terms(self, samples: list[TrainingSample]) -> tuple[Any, dict[str, float]]:
        """The summed loss of `samples` (one padded forward pass) and its statistics."""
        torch = _torch()
        width = max(len(s.tokens) for s in samples)
        n = len(samples)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.float32)
        old = torch.zeros((n, width), dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        for i, s in enumerate(samples):
            k = len(s.tokens)
            ids[i, :k] = torch.tensor(s.tokens, dtype=torch.long)
            attn[i, :k] = 1
            mask[i, :k] = torch.tensor(s.loss_mask, dtype=torch.float32)
            old[i, :k] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
        ids, attn, mask, old, adv = (t.to(self.device) for t in (ids, attn, mask, old, adv))
        # Only the sampled positions need the output layer (a 49k-word vocabulary makes it the
        # largest matmul of a small model): row r, position p predicts token p + 1.
        rows, cols = torch.nonzero(mask[:, 1:] > 0, as_tuple=True)
        target = ids[rows, cols + 1]
        old_lp = old[rows, cols + 1]
        logp_all = self._selected_logprobs(self.model, ids, attn, rows, cols)
        logp = logp_all.gather(-1, target[:, None])[:, 0]
        ratio = torch.exp(logp - old_lp)
        a = adv[rows]
        per_token = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - self.clip_eps, 1 + self.clip_eps) * a)
        kl = torch.zeros_like(per_token)
        if self.kl_coef > 0:
            with torch.no_grad():
                ref_all = self._selected_logprobs(self.reference_model, ids, attn, rows, cols)
                ref_lp = ref_all.gather(-1, target[:, None])[:, 0]
            delta = ref_lp - logp
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + self.kl_coef * kl
        counts = torch.bincount(rows, minlength=n).clamp(min=1).float()
        weights = 1.0 / counts[rows]  # each sample's loss is the mean over its sampled tokens
        total = (per_token * weights).sum()
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            stats = {
                "kl": float((kl * weights).sum()),
                "entropy": float((entropy * weights).sum()),
                "clipped": float(((ratio - 1).abs() > self.clip_eps).float().sum()),
                "ratio_max": float(ratio.max()),
            }
        return total, stats

    def _selected_logprobs(self, model: Any, ids: Any, attn: Any, rows: Any, cols: Any) -> Any:
        """Log-softmax (at `temperature`) of the next-token logits at positions (rows, cols)."""
        torch = _torch()
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        logits = model.get_output_embeddings()(hidden[rows, cols]).float()
        if self.temperature > 0 and self.temperature != 1.0:
            logits = logits / self.temperature
        return torch.log_softmax(logits, dim=-1)

    def _train_step(self, batch: list[TrainingSample], lr: float) -> dict[str, float]:
        torch = _torch()
        usable = [s for s in batch if s.tokens and s.num_model_tokens > 0 and (s.advantage != 0.0 or self.kl_coef > 0)]
        tokens = sum(s.num_model_tokens for s in batch if s.tokens)
        metrics = {"loss": 0.0, "kl": 0.0, "train_entropy": 0.0, "grad_norm": 0.0, "clip_fraction": 0.0}
        metrics.update(trained_samples=float(len(usable)), model_tokens=float(tokens))
        if not usable:
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        size = math.ceil(len(usable) / self.num_minibatches)
        total_tokens = sum(s.num_model_tokens for s in usable)
        clipped = 0.0
        with self.weights_lock:
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(usable), size):
                loss_sum, stats = self._minibatch_terms(usable[start : start + size])
                (loss_sum / len(usable)).backward()
                metrics["loss"] += float(loss_sum.detach()) / len(usable)
                metrics["kl"] += stats["kl"] / len(usable)
                metrics["train_entropy"] += stats["entropy"] / len(usable)
                clipped += stats["clipped"]
            params = [p for p in self.model.parameters() if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            metrics["grad_norm"] = float(norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        metrics["clip_fraction"] = clipped / max(total_tokens, 1)
        return metrics

    def _save_checkpoint(self, directory: Path) -> None:
        torch = _torch()
        directory.mkdir(parents=True, exist_ok=True)
        with self.weights_lock:
            state = {
                "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
                "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            }
        torch.save(state, directory / "trainer.pt")

    def _load_checkpoint(self, directory: Path) -> None:
        torch = _torch()
        state = torch.load(directory / "trainer.pt", map_location=self.device, weights_only=False)
        with self.weights_lock:
            self.model.load_state_dict(state["model"])
            if state["optimizer"] is not None:
                if self.optimizer is None:
                    raise AssertionError("load_checkpoint after initialize(): the optimizer must exist")
                self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
