"""The two backends GRPO talks to: one trains the weights, one serves them for rollouts.

`TrainingBackend` (`initialize`, `train_step(batch, lr)`, `finalize`, plus checkpoint I/O) is
implemented by `TorchBackend` (rollouts.training.torch_backend). `InferenceBackend` gives the
Endpoint rollouts are generated with and brings it up to date after every training step:

* `InProcessPolicy`: the trainer's own torch module, served by the `transformers` provider in
  this process; the weights are shared, so every step is seen by the next token sampled — or,
  with `snapshot=True` (for overlapped rollouts), a copy of the trained weights updated by `sync`.
* `ServedPolicy`: a vLLM server (provider `vllm`, the token-exact path over `/v1/completions`)
  behind a route that reloads weights from a path. After a step the trainer writes the weights
  to `weights_dir/step_NNNNNN` (`save_pretrained`), POSTs `{"model_path": ...}` to
  `reload_route`, and once the server has loaded them deletes the previous copy: at most the
  last one is kept. vLLM has no such route of its own; deployments add one (a worker extension
  calling the model runner's weight reload). A pair that cannot work is refused when the
  ServedPolicy is built: a llama.cpp server cannot reload weights while it runs, and SGLang
  (whose `/update_weights_from_disk` can) has no token-exact provider here yet.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx2
import trio

from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError, ProviderError
from rollouts.training.sample import TrainingSample


@runtime_checkable
class TrainingBackend(Protocol):
    """Owns the weights and the optimizer."""

    async def initialize(self) -> None:
        """Prepare to train (build the optimizer...)."""
        ...

    async def train_step(self, batch: Sequence[TrainingSample], lr: float) -> Mapping[str, float]:
        """One optimizer step on `batch` at learning rate `lr`; returns metrics (loss, kl,
        entropy, grad_norm, ...)."""
        ...

    async def finalize(self) -> None:
        """Release what `initialize` took."""
        ...

    async def save_checkpoint(self, directory: Path) -> None:
        """Write everything needed to continue exactly (weights, optimizer, RNG) into `directory`."""
        ...

    async def load_checkpoint(self, directory: Path) -> None:
        """Restore what `save_checkpoint` wrote."""
        ...

    async def save_weights(self, directory: Path) -> None:
        """Write the weights in a form an inference server loads (`save_pretrained`)."""
        ...

    def model_identity(self) -> Mapping[str, str]:
        """Short hashes of the model as it is now: `architecture` (parameter names and shapes)
        and `weights`. `grpo_train` takes them before training, to resume only the same run."""
        ...


@runtime_checkable
class InferenceBackend(Protocol):
    """Serves the policy for rollouts."""

    def endpoint(self, *, max_tokens: int, temperature: float) -> Endpoint:
        """The Endpoint rollouts use."""
        ...

    async def sync(self, trainer: TrainingBackend, step: int) -> None:
        """Make the served weights equal the trainer's after `step`."""
        ...


@dataclass
class InProcessPolicy:
    """The trainer's torch module served in this process as `Endpoint("transformers", name)`.

    By default the generation engine runs the trainer's own module (nothing to copy; the trainer
    holds `weights_lock` while it changes the weights). With `snapshot=True` it runs a copy of
    the weights instead (`rollouts.training.lora.generation_copy`: the trained parameters are
    copied, frozen ones shared — with LoRA only the adapters cost memory, in full fine-tuning one
    more copy of the weights), brought up to date by `sync`; that lets rollouts be generated
    while the trainer changes its weights (`GRPOConfig.max_policy_lag > 0`)."""

    name: str
    model: Any
    tokenizer: Any
    max_batch_size: int = 64
    snapshot: bool = False

    def __post_init__(self) -> None:
        from rollouts.providers.transformers_local import register_transformers_model
        from rollouts.training.lora import generation_copy

        self.generation_model = generation_copy(self.model) if self.snapshot else self.model
        self.entry = register_transformers_model(
            self.name, self.generation_model, self.tokenizer, max_batch_size=self.max_batch_size
        )

    @property
    def weights_lock(self) -> Any:
        """Held by the trainer while it changes the weights (generation holds it per token)."""
        return self.entry.engine.weights_lock

    @property
    def shares_trainer_weights(self) -> bool:
        """Whether generation runs the trainer's own module (no snapshot)."""
        return not self.snapshot

    def endpoint(self, *, max_tokens: int, temperature: float) -> Endpoint:
        return Endpoint("transformers", self.name, max_tokens=max_tokens, temperature=temperature)

    async def sync(self, trainer: TrainingBackend, step: int) -> None:
        assert getattr(trainer, "model", self.model) is self.model, "InProcessPolicy must serve the trainer's model"
        if not self.snapshot:
            return  # the generation engine runs the trainer's own module: nothing to copy
        from rollouts.training.lora import copy_trained_weights

        def copy() -> None:
            trainer_lock = getattr(trainer, "weights_lock", None) or contextlib.nullcontext()
            with trainer_lock, self.weights_lock:
                copy_trained_weights(self.model, self.generation_model)

        await trio.to_thread.run_sync(copy)


_CANNOT_RELOAD = {
    "llamacpp": "a llama.cpp server cannot reload weights while it runs",
    "local": "the embedded llama.cpp model cannot reload weights while it runs",
    "transformers": "the transformers provider runs in this process: use local_policy() / InProcessPolicy",
}
_STEP_DIR = re.compile(r"step_\d{6}")


@dataclass(frozen=True)
class ServedPolicy:
    """A policy served by vLLM behind a route that reloads weights from a path (see the module
    docstring). Refused at construction (ConfigurationError) when the server cannot reload
    weights or the provider cannot give token ids."""

    api_base: str  # e.g. http://127.0.0.1:8000/v1
    model: str
    weights_dir: Path
    reload_route: str  # e.g. /reload_weights: POST {"model_path": ...} loads the weights there
    provider: str = "vllm"
    reload_body: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        from rollouts.providers.tito import get_token_provider_function

        hint = (
            "serve the policy with vLLM behind a route that reloads weights from a path "
            "(ServedPolicy(..., provider='vllm', reload_route=...)), or train in process with local_policy()"
        )
        if self.provider in _CANNOT_RELOAD:
            reason = _CANNOT_RELOAD[self.provider]
            raise ConfigurationError(
                f"ServedPolicy: {reason}, so rollouts would keep sampling the starting weights; {hint}"
            )
        try:
            get_token_provider_function(self.provider)
        except ConfigurationError as e:
            raise ConfigurationError(
                f"ServedPolicy: provider {self.provider!r} cannot give the token ids and log-probs training "
                f"needs ({e}); {hint}"
            ) from None
        if not self.reload_route.startswith("/"):
            raise ConfigurationError(
                f"ServedPolicy.reload_route must be a path on the server such as /reload_weights, got "
                f"{self.reload_route!r}"
            )

    def endpoint(self, *, max_tokens: int, temperature: float) -> Endpoint:
        return Endpoint(
            self.provider, self.model, api_base=self.api_base, max_tokens=max_tokens, temperature=temperature
        )

    @property
    def reload_url(self) -> str:
        root = self.api_base.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return root + self.reload_route

    async def sync(self, trainer: TrainingBackend, step: int) -> None:
        directory = Path(self.weights_dir) / f"step_{step:06d}"
        await trainer.save_weights(directory)
        await self._reload(directory)
        await trio.to_thread.run_sync(self._remove_other_copies, directory)

    def _remove_other_copies(self, keep: Path) -> None:
        """Delete the copies written for earlier steps (this run's or a killed run's)."""
        for p in Path(self.weights_dir).iterdir():
            if p != keep and p.is_dir() and _STEP_DIR.fullmatch(p.name) and (p / "config.json").is_file():
                shutil.rmtree(p, ignore_errors=True)

    async def _reload(self, directory: Path) -> None:
        body = {"model_path": str(directory), **self.reload_body}
        async with httpx2.AsyncClient(timeout=self.timeout_s) as client:
            try:
                response = await client.post(
                    self.reload_url, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
                )
            except httpx2.HTTPError as e:
                raise ProviderError(f"could not reach {self.reload_url} to reload weights: {e}") from e
        if response.status_code >= 400:
            raise ProviderError(
                f"the server refused to reload weights from {directory} ({self.reload_url} answered "
                f"{response.status_code}: {response.text[:300]})"
            )
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("success") is False:
            raise ConfigurationError(f"the server could not load {directory}: {answer.get('message', answer)}")
