"""Overlapped rollouts (`max_policy_lag`), on the tiny model: lag 0 is the strict alternation
bit for bit; lag 1 generates step k + 1 while step k trains (decided by events), never exceeds
the lag, drains at checkpoints so a killed run resumes exactly, and works with a served policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from _training_helpers import PROMPTS, kill_and_resume, sevens
from test_training_served import ServedTinyModel

from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Score
from rollouts.testing import open_fake_server
from rollouts.training import (
    GRPOConfig,
    HeldOut,
    InProcessPolicy,
    ServedPolicy,
    TorchBackend,
    evaluate_heldout,
    grpo_train,
    local_policy,
)
from rollouts.training.distributed import World
from rollouts.training.grpo import _rollout_batch, _Run, _training_batch
from rollouts.training.overlap import overlaps_after
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


def _config(out: Path, **changes: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(
        output_dir=out,
        num_steps=3,
        batch_size=2,
        n_samples_per_prompt=8,
        max_tokens=6,
        lr=3e-2,
        lr_schedule="constant",
        checkpoint_every=10,
        seed=3,
        kl_coef=0.05,
    )
    base.update(changes)
    return GRPOConfig(**base)


def _weights(model: Any) -> dict[str, Any]:
    return {k: v.clone() for k, v in model.state_dict().items()}


async def _strict_alternation(config: GRPOConfig, model: Any, tokenizer: Any) -> list[float]:
    """The loop as it was before overlapping (main's code path): generate step k's rollouts with
    the weights after step k - 1, train, sync, repeat — the same rollout and batch helpers."""
    from rollouts.training.checkpoints import RunFingerprint
    from rollouts.training.config import learning_rate

    backend, policy = local_policy(model, tokenizer, config, name="strict-reference")
    identity = backend.model_identity()
    fingerprint = RunFingerprint.of(config, PROMPTS, sevens, None, identity)
    run = _Run(config, PROMPTS, sevens, None, backend, policy, fingerprint, World())
    await backend.initialize()
    rewards = []
    for step in range(config.num_steps):
        samples = await _rollout_batch(run, step)
        batch = _training_batch(config, step, samples, step)
        await backend.train_step(batch, learning_rate(config, step))
        await policy.sync(backend, step)
        rewards.append(sum(s.reward for s in batch) / len(batch))
    return rewards


async def test_lag0_is_the_strict_alternation_bit_for_bit(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path / "lag0", max_policy_lag=0)
    backend, policy = local_policy(model, tokenizer, config, name="lag0")
    assert policy.shares_trainer_weights  # lag 0: no copy of the weights
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    reference_model, tokenizer2 = tiny_chat_model(seed=0)
    rewards = await _strict_alternation(_config(tmp_path / "ref", max_policy_lag=0), reference_model, tokenizer2)
    assert [s.reward_mean for s in result.steps] == rewards
    want = _weights(reference_model)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    assert [s.policy_version for s in result.steps] == [0, 1, 2]


class RecordingBackend:
    """A TorchBackend whose train_step records its start and end, and (for the steps given)
    does not end before a rollout of the next step has been scored."""

    def __init__(self, inner: TorchBackend, events: list[tuple[str, int]], wait_for: dict[int, trio.Event]) -> None:
        self._inner = inner
        self._events = events
        self._wait_for = wait_for

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def train_step(self, batch: Any, lr: float) -> Any:
        step = int(batch[0].id.split("-")[0].removeprefix("step"))
        self._events.append(("train_start", step))
        if step in self._wait_for:
            with trio.fail_after(120):  # without overlap this never comes: the test fails here
                await self._wait_for[step].wait()
        metrics = await self._inner.train_step(batch, lr)
        self._events.append(("train_end", step))
        return metrics


async def test_lag1_generates_the_next_steps_rollouts_while_the_step_trains_and_never_exceeds_the_lag(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, num_steps=5, checkpoint_every=3, max_policy_lag=1)
    overlapped = [k for k in range(5) if overlaps_after(k, num_steps=5, checkpoint_every=3, max_policy_lag=1)]
    assert overlapped == [0, 1, 3]  # step 2 writes a checkpoint (a drain point), step 4 is the last
    events: list[tuple[str, int]] = []
    next_scored = {k: trio.Event() for k in overlapped}

    def score(sample: Any) -> Score:
        step = int(sample.id.split("-")[0].removeprefix("step"))
        events.append(("scored", step))
        if step - 1 in next_scored:
            next_scored[step - 1].set()
        return sevens(sample)

    model, tokenizer = tiny_chat_model(seed=0)
    inner, policy = local_policy(model, tokenizer, config, name="lag1-events")
    assert not policy.shares_trainer_weights and policy.generation_model is not model
    backend = RecordingBackend(inner, events, next_scored)
    result = await grpo_train(config, PROMPTS, score, backend=backend, inference=policy)  # type: ignore[arg-type]
    for k in overlapped:  # step k + 1 was being generated (a sample scored) while step k trained
        start, end = events.index(("train_start", k)), events.index(("train_end", k))
        assert ("scored", k + 1) in events[start:end], k
    for k in (2, 4):  # not after a checkpoint step, nor past the last
        assert ("scored", k + 1) not in events[: events.index(("train_end", k))]
    versions = [s.policy_version for s in result.steps]
    assert versions == [0, 0, 1, 3, 3]  # step 3 follows the checkpoint of step 2: generated by its weights
    assert all(0 <= s.step - s.policy_version <= config.max_policy_lag for s in result.steps)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [e["policy_lag"] for e in log] == [0, 1, 1, 0, 1]
    assert all(e["generation_seconds"] > 0 for e in log)
    # the generation copy was brought up to date: after the last sync it holds the trained weights
    for (name, a), b in zip(model.named_parameters(), policy.generation_model.parameters(), strict=True):
        assert torch.equal(a, b), name


async def test_a_policy_sharing_the_trainers_module_is_refused_with_a_lag(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    policy = InProcessPolicy("shared-lag", model, tokenizer)
    config = _config(tmp_path, max_policy_lag=1, kl_coef=0.0)
    with pytest.raises(ConfigurationError, match=r"max_policy_lag=1 .* snapshot=True"):
        await grpo_train(config, PROMPTS, sevens, backend=TorchBackend(model), inference=policy)
    with pytest.raises(ConfigurationError, match="max_policy_lag must be >= 0"):
        _config(tmp_path, max_policy_lag=-1)


async def test_lag1_with_lora_copies_only_the_adapters_for_generation(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, lora_r=4, lora_alpha=8.0, max_policy_lag=1, lr=5e-2)
    backend, policy = local_policy(model, tokenizer, config, name="lag1-lora")
    copy_params = dict(policy.generation_model.named_parameters())
    for name, p in backend.model.named_parameters():
        assert (copy_params[name] is p) == (not p.requires_grad), name  # frozen base shared, adapters copied
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    assert [s.policy_version for s in result.steps] == [0, 0, 1]
    for name, p in backend.model.named_parameters():
        assert torch.equal(copy_params[name], p), name


async def test_lag1_kill_and_resume_reproduces_the_uninterrupted_run_exactly(tmp_path: Path) -> None:
    # killed (SIGKILL) right after step 2 was logged, while step 3's rollouts were being
    # generated ahead; the last checkpoint is step 1's (a drain point)
    changes = dict(num_steps=6, checkpoint_every=2, max_policy_lag=1)
    run = await kill_and_resume(tmp_path, _config, changes, kill_after=2)
    assert [s.policy_version for s in run.straight.steps] == [0, 0, 2, 2, 4, 4]  # overlapped after steps 0, 2, 4
    assert run.resumed.resumed_from == 1 and [s.step for s in run.resumed.steps] == [2, 3, 4, 5]
    assert [e["policy_version"] for e in run.resumed_log] == [e["policy_version"] for e in run.straight_log]


async def test_lag1_with_a_served_policy_reloads_only_between_generations(tmp_path: Path) -> None:
    trainer_model, tokenizer = tiny_chat_model(seed=0)
    server = ServedTinyModel(tiny_chat_model(seed=0)[0], tokenizer)
    config = _config(tmp_path / "run", num_steps=4, n_samples_per_prompt=4, max_tokens=5, kl_coef=0.0, max_policy_lag=1)
    backend = TorchBackend(trainer_model)
    prompts = [{"prompt": "say seven"}, {"prompt": "digits"}]
    async with open_fake_server(lambda request: "unused", formats=[server]) as srv:
        policy = ServedPolicy(srv.base_url, "policy", weights_dir=tmp_path / "weights", reload_route="/reload_weights")
        result = await grpo_train(config, prompts, sevens, backend=backend, inference=policy)
    # steps 1, 2, 3 were generated ahead, by the weights after steps -, 0, 1; the last step syncs
    assert [s.policy_version for s in result.steps] == [0, 0, 1, 2]
    assert server.reloaded == [str(tmp_path / "weights" / f"step_{k:06d}") for k in (0, 1, 3)]
    served = server.model.state_dict()
    for name, tensor in trainer_model.state_dict().items():
        assert torch.equal(served[name], tensor), name


async def test_lag1_drains_before_a_heldout_evaluation_which_sees_that_steps_weights(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, num_steps=5, max_policy_lag=1, kl_coef=0.0)
    backend, policy = local_policy(model, tokenizer, config, name="lag1-heldout")
    heldout = HeldOut([{"prompt": "seven please"}, {"prompt": "one digit"}], sevens, every=2)
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, heldout=heldout)
    # held out after steps 1, 3 and the last: none of those generates the next step ahead
    assert [s.step for s in result.steps if "heldout_reward" in s.metrics] == [1, 3, 4]
    assert [s.policy_version for s in result.steps] == [0, 0, 2, 2, 4]
    # the last figure is the trained policy's (the generation copy was synced before it)
    again = await evaluate_heldout(heldout, policy, config)
    assert result.steps[-1].metrics["heldout_reward"] == pytest.approx(again.reward)
