"""Issue 26's training defects, one regression test (or more) each, on the tiny model: loud
failures (1), refused settings that cannot learn (5), resume fingerprints (6), the standard
GRPO choices as settings with the formulas they compute (7), and trl's clip fraction."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from _training_helpers import PROMPTS, sevens  # (the same prompts and reward as the GRPO tests)

from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Score
from rollouts.training import (
    GRPOConfig,
    TorchBackend,
    TrainingError,
    TrainingSample,
    grpo_train,
    learning_rate,
    local_policy,
    sequence_logprobs,
    with_group_advantages,
)
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


def _config(out: Path, **changes: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(
        output_dir=out, num_steps=1, batch_size=2, n_samples_per_prompt=4, max_tokens=4, lr=1e-2, seed=1
    )
    base.update(changes)
    return GRPOConfig(**base)


async def _train(config: GRPOConfig, prompts: Any = PROMPTS, score: Any = sevens, **kw: Any) -> Any:
    model, tokenizer = kw.pop("model", None) or tiny_chat_model(seed=0)
    backend, policy = local_policy(model, tokenizer, config, name=f"defects-{config.output_dir}")
    return await grpo_train(config, prompts, score, kw.pop("env", None), backend=backend, inference=policy)


# -- 1: no silent failures ---------------------------------------------------------------------


async def test_defect1_a_run_where_every_rollout_fails_stops_with_the_first_error(tmp_path: Path) -> None:
    rows = [{"text": "no prompt field"}]  # default_prepare_messages cannot make messages from it
    with pytest.raises(TrainingError, match=r"step 0: 8 of 8 rollouts failed.*prepare_messages") as info:
        await _train(_config(tmp_path, max_failed_fraction=0.5), rows)
    assert "max_failed_fraction" in str(info.value)
    assert not (tmp_path / "checkpoints").exists()  # nothing was trained, nothing is saved as if it were
    assert not (tmp_path / "log.jsonl").exists()


def odd_samples_raise(sample: Any) -> Score:
    """A scorer that raises on some outputs (every odd-numbered sample of a group)."""
    if int(sample.id.rsplit("-k", 1)[1]) % 2:
        raise ValueError(f"cannot score {sample.response!r}")
    return sevens(sample)


async def test_defect1_a_scorer_raising_on_some_outputs_stops_the_run_unless_tolerated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(TrainingError, match=r"4 of 8 rollouts failed.*score_fn.*cannot score"):
        await _train(_config(tmp_path / "strict"), score=odd_samples_raise)

    # tolerated: the run goes on, every failure printed as it happened and counted in the log
    caplog.set_level(logging.WARNING, logger="rollouts.training")
    caplog.clear()
    result = await _train(_config(tmp_path / "tolerant", max_failed_fraction=0.5), score=odd_samples_raise)
    failures = [r.getMessage() for r in caplog.records if r.name == "rollouts.training"]
    assert len(failures) == 4 and all("failed" in m and "cannot score" in m for m in failures)
    line = json.loads((tmp_path / "tolerant" / "log.jsonl").read_text())
    assert line["failed"] == 4 and line["trained_samples"] == 4
    assert result.steps[0].failed == 4


# -- 5: settings that cannot learn ------------------------------------------------------------


def test_defect5_a_group_of_one_and_temperature_zero_are_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="n_samples_per_prompt must be >= 2"):
        _config(tmp_path, n_samples_per_prompt=1)
    with pytest.raises(ConfigurationError, match="temperature must be > 0"):
        _config(tmp_path, temperature=0.0)
    with pytest.raises(ConfigurationError, match=r"max_failed_fraction must be in \[0, 1\)"):
        _config(tmp_path, max_failed_fraction=1.0)
    with pytest.raises(ConfigurationError, match="loss_normalization must be one of"):
        _config(tmp_path, loss_normalization="per_batch")


# -- 6: resume fingerprints -------------------------------------------------------------------


def other_scorer(sample: Any) -> Score:
    return Score((Metric("len", float(len(sample.response)), weight=1.0),))


async def test_defect6_resume_refuses_another_dataset_scorer_environment_or_model(tmp_path: Path) -> None:
    config = _config(tmp_path, num_steps=1)
    await _train(config)
    more = _config(tmp_path, num_steps=2)
    with pytest.raises(ConfigurationError, match=r"dataset \(the prompt rows\) changed"):
        await _train(more, [*PROMPTS, {"prompt": "new"}])
    with pytest.raises(ConfigurationError, match="score function changed"):
        await _train(more, score=other_scorer)
    with pytest.raises(ConfigurationError, match=r"environment .* changed"):
        await _train(more, env=CalculatorEnvironment)
    with pytest.raises(ConfigurationError, match="starting model weights changed"):
        await _train(more, model=tiny_chat_model(seed=5))
    with pytest.raises(ConfigurationError, match=r"model architecture \(parameter names and shapes\)"):
        await _train(more, model=tiny_chat_model(seed=0, hidden_size=64))
    # the same run resumes (a longer num_steps is allowed)
    result = await _train(more)
    assert result.resumed_from == 0 and [s.step for s in result.steps] == [1]


# -- 7: the standard choices, computing what the docs say ---------------------------------------


def test_defect7_learning_rate_schedules_match_transformers(tmp_path: Path) -> None:
    from transformers import get_scheduler

    for schedule, hf_name in (("linear", "linear"), ("cosine", "cosine"), ("constant", "constant_with_warmup")):
        for warmup in (0, 3):
            config = _config(tmp_path, num_steps=12, lr=2e-5, lr_schedule=schedule, warmup_steps=warmup)
            optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-5)
            scheduler = get_scheduler(hf_name, optimizer, num_warmup_steps=warmup, num_training_steps=12)
            for step in range(12):
                assert learning_rate(config, step) == pytest.approx(scheduler.get_last_lr()[0], abs=1e-12), (
                    schedule,
                    warmup,
                    step,
                )
                optimizer.step()
                scheduler.step()
    assert GRPOConfig(output_dir=tmp_path).lr_schedule == "linear"  # transformers' and trl's default


def _rewards_sample(i: int, group: int, reward: float) -> TrainingSample:
    return TrainingSample(f"s{i}", group, tokens=(1, 2), loss_mask=(0, 1), rollout_logprobs=(0.0, -1.0), reward=reward)


def test_defect7_advantages_use_trls_unbiased_std_and_eps() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.2, 0.2, 0.9, 0.1]])
    samples = [_rewards_sample(i, i // 4, float(r)) for i, r in enumerate(rewards.flatten())]
    mean = rewards.mean(dim=1, keepdim=True)
    expected = {
        # trl: (r - group mean) / (std + 1e-4), torch.std being the unbiased estimate
        "group": (rewards - mean) / (rewards.std(dim=1, keepdim=True) + 1e-4),
        "batch": (rewards - mean) / (rewards.std() + 1e-4),
        "none": rewards - mean,
    }
    for scale, want in expected.items():
        got = [s.advantage for s in with_group_advantages(samples, scale_rewards=scale)]
        assert got == pytest.approx(want.flatten().tolist(), rel=1e-5, abs=1e-6), scale
    assert GRPOConfig(output_dir=Path("x")).scale_rewards == "group"


def _on_policy_batch(model: Any, advantages: list[float], shifts: list[float] | None = None) -> list[TrainingSample]:
    """Samples of different lengths whose rollout log-probs are the model's own (ratio 1), or the
    model's minus `shifts[i]` (ratio exp(shift))."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for i, adv in enumerate(advantages):
        n_prompt, n_out = 4 + i, 2 + 2 * i
        tokens = tuple(int(t) for t in torch.randint(5, 60, (n_prompt + n_out,), generator=gen))
        own = sequence_logprobs(model, tokens)
        shift = shifts[i] if shifts else 0.0
        logprobs = (0.0,) * n_prompt + tuple(lp - shift for lp in own[n_prompt:])
        out.append(
            TrainingSample(
                f"s{i}", 0, tokens=tokens, loss_mask=(0,) * n_prompt + (1,) * n_out, rollout_logprobs=logprobs,
                advantage=adv,
            )
        )  # fmt: skip
    return out


async def test_defect7_loss_normalisation_per_token_and_per_sequence_compute_their_formulas() -> None:
    """At ratio 1 the clipped objective is -A per token, so the loss is -sum(A_i n_i) / sum(n_i)
    per token and -sum(A_i) / N per sequence; samples with advantage 0 count in both denominators."""
    advantages = [1.0, -0.5, 0.0, 2.0]
    for normalization in ("per_token", "per_sequence"):
        model, _ = tiny_chat_model(seed=0)
        batch = _on_policy_batch(model, advantages)
        lengths = [s.num_model_tokens for s in batch]
        backend = TorchBackend(model, loss_normalization=normalization)
        await backend.initialize()
        metrics = await backend.train_step(batch, 0.0)
        if normalization == "per_token":
            expected = -sum(a * n for a, n in zip(advantages, lengths, strict=True)) / sum(lengths)
        else:
            expected = -sum(advantages) / len(advantages)
        assert metrics["loss"] == pytest.approx(expected, rel=1e-4), normalization
        assert metrics["trained_samples"] == 4 and metrics["nonzero_advantage_samples"] == 3


async def test_clip_fraction_counts_only_where_clipping_binds_as_trl_defines_it() -> None:
    """Issue 32 item 6b. trl (GRPOTrainer._compute_loss): is_low_clipped = (ratio < 1 - eps) &
    (A < 0), is_high_clipped = (ratio > 1 + eps) & (A > 0), clip_ratio/region_mean = the masked
    mean of their union over every completion token. A ratio outside the band on the other side
    is not clipped (the unclipped term is the smaller one) and must not be counted."""
    model, _ = tiny_chat_model(seed=0)
    advantages = [1.0, -1.0, 1.0, -1.0, 0.0]
    shifts = [0.5, 0.5, -0.5, -0.5, 0.5]  # ratios e^0.5 = 1.65 and e^-0.5 = 0.61, outside 1 +- 0.2
    batch = _on_policy_batch(model, advantages, shifts)
    ratio = torch.cat(
        [torch.full((s.num_model_tokens,), math.exp(shift)) for s, shift in zip(batch, shifts, strict=True)]
    )
    adv = torch.cat([torch.full((s.num_model_tokens,), s.advantage) for s in batch])
    eps = 0.2
    trl_region = ((ratio < 1 - eps) & (adv < 0)) | ((ratio > 1 + eps) & (adv > 0))
    expected = float(trl_region.float().mean())
    backend = TorchBackend(model, clip_eps=eps)
    await backend.initialize()
    metrics = await backend.train_step(batch, 0.0)
    n = [s.num_model_tokens for s in batch]
    assert expected == pytest.approx((n[0] + n[3]) / sum(n))  # samples 0 and 3 bind; 1, 2 and 4 do not
    assert metrics["clip_fraction"] == pytest.approx(expected, abs=1e-6)


async def test_defect7_zero_advantage_samples_count_in_the_loss_denominator_without_being_run(
    tmp_path: Path,
) -> None:
    """A step of equal rewards: every advantage is 0, the samples are in the log as trained, no
    gradient is taken (their loss is exactly 0)."""

    def same(sample: Any) -> Score:
        return Score((Metric("same", 1.0, weight=1.0),))

    result = await _train(_config(tmp_path), score=same)
    metrics = result.steps[0].metrics
    assert metrics["trained_samples"] == 8 and metrics["nonzero_advantage_samples"] == 0
    assert metrics["grad_norm"] == 0.0 and metrics["loss"] == 0.0


# -- 3: the benchmark's held-out set is held out ------------------------------------------------


def _benchmark_module() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "grpo.py"
    spec = importlib.util.spec_from_file_location("grpo_benchmark", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defect3_the_grpo_benchmarks_heldout_sets_share_no_unordered_pair_with_training() -> None:
    bench = _benchmark_module()
    for heldout, seed, example in ((32, 0, bench.EXAMPLE_PAIR), (8, 1, bench.MULTI_EXAMPLE_PAIR)):
        train, held = bench.arithmetic_split(10, heldout, seed=seed, example=example)
        pairs = {frozenset((r["a"], r["b"])) for r in train}
        assert not [r for r in held if frozenset((r["a"], r["b"])) in pairs]  # no commuted twin in training
        assert frozenset(example) not in {frozenset((r["a"], r["b"])) for r in held}  # nor the worked example
        assert len(train) + len(held) == 100 and len(held) >= heldout
    # the prompt's worked example is the pair the split keeps out of the held-out set
    assert bench.EXAMPLE == (("What is 2 + 3?", "5"),) and bench.MULTI_EXAMPLE_PAIR == (2, 1)
