"""Checkpoints of a GRPO run: written atomically, found again, and resumed only by the same run.

A checkpoint directory `<output_dir>/checkpoints/step_NNNNNN` holds what the training backend
saves (weights, optimizer, RNG) and `state.json`: the step and the run's fingerprint, one short
hash per part a resumed run must share with the run it continues —

* `settings`: every GRPOConfig setting but num_steps (a run may be extended; the learning-rate
  schedule then follows the new length), written out so a mismatch names the setting;
* `dataset`: the prompt rows; `score_fn`, `environment`, `prepare_messages`: the callables'
  identity as `evaluate()` fingerprints them (`rollouts.eval.fingerprint.callable_identity`:
  qualified name, source, what they close over);
* `model_architecture` and `model_weights`: the starting model's parameter names and shapes, and
  its starting weights (the backend's `model_identity()`).

A mismatch is a ConfigurationError naming every part that changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.errors import ConfigurationError
from rollouts.eval.config import EnvironmentFactory, ScoreFn
from rollouts.eval.fingerprint import callable_identity
from rollouts.training.backends import TrainingBackend
from rollouts.training.config import GRPOConfig

CHECKPOINTS = "checkpoints"
STATE = "state.json"
_PART_NAMES = {
    "dataset": "dataset (the prompt rows)",
    "score_fn": "score function",
    "environment": "environment (its factory or class)",
    "prepare_messages": "prepare_messages",
    "model_architecture": "model architecture (parameter names and shapes)",
    "model_weights": "starting model weights",
}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RunFingerprint:
    """What a resumed run must share with the run it continues (see the module docstring)."""

    settings: Mapping[str, Any]
    parts: Mapping[str, str]

    @classmethod
    def of(
        cls,
        config: GRPOConfig,
        prompts: Sequence[Mapping[str, Any]],
        score_fn: ScoreFn,
        environment_factory: EnvironmentFactory | None,
        model_identity: Mapping[str, str],
    ) -> RunFingerprint:
        parts = {
            "dataset": _digest([dict(p) for p in prompts]),
            "score_fn": callable_identity(score_fn),
            "environment": callable_identity(environment_factory),
            "prepare_messages": callable_identity(config.prepare_messages),
            **{f"model_{k}": v for k, v in model_identity.items()},
        }
        settings = json.loads(json.dumps(config.settings(), default=str))
        return cls(settings, parts)

    def to_dict(self) -> dict[str, Any]:
        return {"settings": dict(self.settings), "parts": dict(self.parts)}

    def differences(self, recorded: Mapping[str, Any]) -> list[str]:
        """What differs from a checkpoint's recorded fingerprint, in words."""
        if not isinstance(recorded.get("settings"), Mapping) or not isinstance(recorded.get("parts"), Mapping):
            return ["the checkpoint's format (it was written by an older version of rollouts)"]
        out = []
        old_settings = recorded["settings"]
        for name in sorted(set(self.settings) | set(old_settings)):
            if self.settings.get(name) != old_settings.get(name):
                out.append(f"setting {name} ({old_settings.get(name)!r} -> {self.settings.get(name)!r})")
        old_parts = recorded["parts"]
        for name in self.parts:
            if self.parts[name] != old_parts.get(name):
                out.append(_PART_NAMES.get(name, name))
        return out


def checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    """The complete checkpoints under `output_dir`, oldest first."""
    root = output_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.name.startswith("step_") and (p / STATE).is_file():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def check_resumable(path: Path, fingerprint: RunFingerprint) -> int:
    """The step of checkpoint `path`; ConfigurationError naming what changed when it was written
    by another run."""
    state = json.loads((path / STATE).read_text(encoding="utf-8"))
    changed = fingerprint.differences(state.get("fingerprint") or {})
    if changed:
        raise ConfigurationError(
            f"{path.parent.parent} holds a run with another configuration (checkpoint {path.name}): "
            f"{'; '.join(changed)} changed. Use a new output directory, or the same settings, data, score "
            "function, environment and model to resume it"
        )
    return int(state["step"])


def truncate_log(path: Path, last_step: int) -> None:
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


async def write_checkpoint(
    config: GRPOConfig, backend: TrainingBackend, step: int, fingerprint: RunFingerprint, *, is_main: bool = True
) -> None:
    """Checkpoint `step` atomically (the directory exists whole or not at all), keeping the
    newest `config.keep_checkpoints`. Under torchrun every rank calls it (gathering sharded
    state is collective) and rank 0 (`is_main`) alone writes."""
    root = config.output_dir / CHECKPOINTS
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    if not is_main:
        await backend.save_checkpoint(tmp)  # takes part in the gathering; writes nothing
        return
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    await backend.save_checkpoint(tmp)
    state = {"step": step, "seed": config.seed, "fingerprint": fingerprint.to_dict()}
    (tmp / STATE).write_text(json.dumps(state), encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in checkpoint_dirs(config.output_dir)[: -config.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
