"""GRPO on a tiny randomly initialised model: learning, checkpoints, kill and exact resume,
advantages, prompt order, and the served policy's weight reload (against the fake server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

try:
    import torch
    import transformers  # noqa: F401
except ImportError:  # never skipped: say what to install
    pytest.fail(
        "the training tests need torch and transformers: pip install torch==2.13.0 -e '.[train]'", pytrace=False
    )
from _training_helpers import PROMPTS, kill_and_resume, sevens

from rollouts.errors import ConfigurationError, ProviderError
from rollouts.providers.scripted import ScriptedReply
from rollouts.testing import http_error, open_fake_server
from rollouts.testing.fake_server import RecordedRequest, RenderContext
from rollouts.training import (
    GRPOConfig,
    ServedPolicy,
    TorchBackend,
    group_advantages,
    grpo_train,
    local_policy,
    prompts_for_step,
)
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


def _config(out: Path, **changes: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(
        output_dir=out,
        num_steps=8,
        batch_size=2,
        n_samples_per_prompt=8,
        max_tokens=6,
        lr=3e-2,
        lr_schedule="constant",
        checkpoint_every=4,
        seed=3,
        # strict alternation, as these tests were written for (the default, 1, overlaps rollouts
        # with training: tests/test_training_overlap.py)
        max_policy_lag=0,
    )
    base.update(changes)
    return GRPOConfig(**base)


async def test_a_reward_preferring_one_token_is_learned_in_a_few_steps(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-grpo-learn")
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    rewards = [s.reward_mean for s in result.steps]
    assert len(rewards) == 8
    assert rewards[0] < 0.1
    assert sum(rewards[-2:]) / 2 > 0.5
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log] == list(range(8))
    for entry in log:
        for key in ("reward_mean", "loss", "kl", "entropy", "grad_norm", "tokens_per_s", "model_tokens"):
            assert key in entry
    assert log[-1]["entropy"] < log[0]["entropy"]  # the policy sharpened towards '7'
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003", "step_000007"]


async def test_kill_and_resume_reproduces_the_uninterrupted_run_exactly(tmp_path: Path) -> None:
    # killed (SIGKILL) right after step 2 was logged, its checkpoint written before
    run = await kill_and_resume(tmp_path, _config, dict(num_steps=5, checkpoint_every=1), kill_after=2)
    assert run.resumed.resumed_from == 2
    assert [s.step for s in run.resumed.steps] == [3, 4]


async def test_resume_refuses_another_configuration(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, num_steps=1, n_samples_per_prompt=2)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-refuse")
    await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    other = _config(tmp_path, num_steps=2, n_samples_per_prompt=2, lr=1e-3)
    backend2, policy2 = local_policy(model, tokenizer, other, name="tiny-refuse")
    with pytest.raises(ConfigurationError, match=r"another configuration.*setting lr \(0\.03 -> 0\.001\)"):
        await grpo_train(other, PROMPTS, sevens, backend=backend2, inference=policy2)


def test_prompt_order_is_a_seeded_shuffle_per_epoch() -> None:
    steps = [prompts_for_step(5, 2, s, seed=1) for s in range(5)]
    flat = [i for s in steps for i in s]
    assert sorted(flat[:5]) == [0, 1, 2, 3, 4] and sorted(flat[5:10]) == [0, 1, 2, 3, 4]
    assert steps == [prompts_for_step(5, 2, s, seed=1) for s in range(5)]
    assert steps != [prompts_for_step(5, 2, s, seed=2) for s in range(5)]


def test_group_advantages() -> None:
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    adv = group_advantages([1.0, 0.0])
    assert adv[0] == pytest.approx(0.5 / (2**-0.5 + 1e-4)) and adv[1] == pytest.approx(-adv[0])
    assert group_advantages([2.0, 0.0], scale=False) == [1.0, -1.0]


def test_kl_needs_a_reference_model() -> None:
    model, _ = tiny_chat_model(seed=0)
    with pytest.raises(ValueError, match="reference_model"):
        TorchBackend(model, kl_coef=0.1)


async def test_kl_to_the_reference_is_logged(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, num_steps=3, kl_coef=0.05)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-kl")
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
    assert result.steps[0].metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is the reference
    assert result.steps[-1].metrics["kl"] > 0


# ---------------------------------------------------------------------------------------------
# The served policy reloads weights from a checkpoint path
# ---------------------------------------------------------------------------------------------


def _suffixes(path: Path) -> set[str]:
    return {p.suffix for p in path.iterdir()}


class ReloadFormat:
    """SGLang's `POST /update_weights_from_disk`, for the fake server."""

    name = "reload"

    def matches(self, method: str, path: str) -> bool:
        return method == "POST" and path == "/update_weights_from_disk"

    def static_response(self, request: RecordedRequest) -> Any | None:
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return False

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        raise AssertionError("not streamed")

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        return {"success": reply.text == "ok", "message": reply.text}

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        return {"error": message}


async def test_served_policy_reloads_the_trainers_weights_from_a_path(tmp_path: Path) -> None:
    model, _ = tiny_chat_model(seed=0)
    backend = TorchBackend(model)
    async with open_fake_server(["ok", "cannot read safetensors", http_error(500)], formats=[ReloadFormat()]) as srv:
        policy = ServedPolicy(
            srv.base_url, "policy", weights_dir=tmp_path / "weights", reload_route="/update_weights_from_disk"
        )
        assert policy.endpoint(max_tokens=8, temperature=1.0).api_base == srv.base_url
        await policy.sync(backend, 3)
        request = srv.requests[-1]
        path = Path(request.json["model_path"])
        assert path == tmp_path / "weights" / "step_000003"
        assert (path / "config.json").is_file()
        assert ".safetensors" in _suffixes(path)
        with pytest.raises(ConfigurationError, match="cannot read safetensors"):
            await policy.sync(backend, 4)
        with pytest.raises(ProviderError, match="refused to reload"):
            await policy.sync(backend, 5)


async def test_gradient_accumulation_over_minibatches_equals_one_batch() -> None:
    import copy

    from rollouts.training import TrainingSample

    model, _ = tiny_chat_model(seed=0)
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    batch = []
    for i in range(6):
        n_prompt, n_out = 5 + i, 3 + (i % 3)
        tokens = tuple(int(t) for t in torch.randint(5, 60, (n_prompt + n_out,), generator=gen))
        mask = (0,) * n_prompt + (1,) * n_out
        logprobs = (0.0,) * n_prompt + tuple(-2.0 - 0.1 * k for k in range(n_out))
        batch.append(
            TrainingSample(
                f"s{i}", i // 3, tokens=tokens, loss_mask=mask, rollout_logprobs=logprobs, advantage=(-1.0) ** i
            )
        )
    one = TorchBackend(model, num_minibatches=1, max_grad_norm=1e9)
    three = TorchBackend(other, num_minibatches=3, max_grad_norm=1e9)
    await one.initialize()
    await three.initialize()
    m1 = await one.train_step(batch, 1e-3)
    m3 = await three.train_step(batch, 1e-3)
    assert m1["loss"] == pytest.approx(m3["loss"], rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(m3["grad_norm"], rel=1e-4)
    for (name, a), b in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    # clipping: with a small max norm the reported (pre-clip) norm is the same, the update smaller
    clipped_model, _ = tiny_chat_model(seed=0)
    clipped = TorchBackend(clipped_model, max_grad_norm=1e-3)
    await clipped.initialize()
    mc = await clipped.train_step(batch, 1e-3)
    assert mc["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-4)
