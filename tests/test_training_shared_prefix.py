"""The training forward runs the columns every row shares once (`selected_logits_module`):
it must give the logits and the gradient of running every row whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _training_helpers import PROMPTS, sevens

from rollouts.dtypes import Message
from rollouts.errors import ConfigurationError
from rollouts.training import GRPOConfig, distributed, grpo_train, local_policy
from rollouts.training.distributed import MIN_SHARED_COLUMNS, selected_logits_module, shared_columns
from rollouts.training.lora import enable_gradient_checkpointing
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


def _batch(shared: int, rests: list[int], seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """Right-padded rows: `shared` equal first tokens, then `rests[i]` tokens of row i's own."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(5, 40, (shared,), generator=g)
    width = shared + max(rests)
    ids = torch.zeros((len(rests), width), dtype=torch.long)
    attn = torch.zeros((len(rests), width), dtype=torch.long)
    for i, n in enumerate(rests):
        ids[i, :shared] = head
        ids[i, shared : shared + n] = torch.randint(5, 40, (n,), generator=g)
        attn[i, : shared + n] = 1
    mask = attn.clone()
    mask[:, : shared // 2] = 0  # only some positions are trained on, as a prompt's are not
    rows, cols = torch.nonzero(mask[:, 1:] > 0, as_tuple=True)
    return ids, attn, rows, cols


def test_shared_columns_counts_the_equal_unpadded_first_columns() -> None:
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 9, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    assert shared_columns(ids, attn) == 2
    assert shared_columns(ids[:1], attn[:1]) == 3  # one row: all but its last column
    assert shared_columns(torch.tensor([[1, 2, 0], [1, 2, 0]]), torch.tensor([[1, 1, 0], [1, 1, 0]])) == 2
    assert shared_columns(torch.tensor([[7, 2], [8, 2]]), torch.ones((2, 2), dtype=torch.long)) == 0


@pytest.mark.parametrize("rests", [[5, 9, 1, 7], [3, 3]])
def test_the_shared_prefix_forward_gives_the_logits_and_gradient_of_whole_rows(
    rests: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = tiny_chat_model(seed=0)
    model.train()
    ids, attn, rows, cols = _batch(MIN_SHARED_COLUMNS + 20, rests)
    results = []
    for share in (False, True):
        calls: list[int] = []
        decoder = model.get_decoder()
        original = type(decoder).forward

        def spy(self: Any, *args: Any, _calls: list[int] = calls, _original: Any = original, **kwargs: Any) -> Any:
            _calls.append(int(kwargs["input_ids"].shape[1]))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(type(decoder), "forward", spy)
        model.zero_grad(set_to_none=True)
        logits = selected_logits_module(model, share_prefix=share)(ids, attn, rows, cols)
        (logits.logsumexp(-1).sum() + logits[:, 7].sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logits.detach(), grads, calls))
        monkeypatch.setattr(type(decoder), "forward", original)
    (whole, whole_grads, whole_calls), (shared, shared_grads, shared_calls) = results
    assert whole_calls == [ids.shape[1]]
    assert shared_calls == [MIN_SHARED_COLUMNS + 20, ids.shape[1] - MIN_SHARED_COLUMNS - 20]  # the head ran once
    assert torch.allclose(whole, shared, atol=1e-5, rtol=0)
    assert whole_grads.keys() == shared_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, shared_grads[name], atol=1e-5, rtol=1e-4), name


def test_gradient_checkpointing_runs_whole_rows() -> None:
    """Checkpointed layers drop the cache the rows would attend to: no sharing then."""
    model, _ = tiny_chat_model(seed=0)
    enable_gradient_checkpointing(model)
    model.train()
    ids, attn, rows, cols = _batch(MIN_SHARED_COLUMNS + 4, [3, 6])
    assert distributed._checkpointing(model.get_decoder())
    logits = selected_logits_module(model, share_prefix=True)(ids, attn, rows, cols)
    reference = selected_logits_module(model, share_prefix=False)(ids, attn, rows, cols)
    assert torch.allclose(logits, reference, atol=1e-6, rtol=0)


def test_share_prefix_refuses_the_options_it_cannot_run_with(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="gradient_checkpointing"):
        GRPOConfig(output_dir=tmp_path, share_prefix=True, gradient_checkpointing=True)
    with pytest.raises(ConfigurationError, match="fsdp"):
        GRPOConfig(output_dir=tmp_path, share_prefix=True, parallel="fsdp")
    # a speed option: a run may resume with it changed
    assert GRPOConfig(output_dir=tmp_path, share_prefix=True).settings() == GRPOConfig(output_dir=tmp_path).settings()


async def test_a_grpo_step_with_share_prefix_computes_the_step_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 0 samples the same rollouts (the same weights) either way; its loss and gradient norm,
    computed before the optimizer moves anything, must agree — and the shared pass must have run
    (the system prompt every rollout starts with is far longer than MIN_SHARED_COLUMNS)."""
    heads: list[int] = []
    original = distributed.shared_columns

    def spy(ids: Any, attn: Any) -> int:
        heads.append(original(ids, attn))
        return heads[-1]

    monkeypatch.setattr(distributed, "shared_columns", spy)
    system = "you are a helpful assistant that answers with one number. " * 2

    async def step0(share: bool) -> dict[str, float]:
        model, tokenizer = tiny_chat_model(seed=0)
        config = GRPOConfig(
            output_dir=tmp_path / f"share-{share}",
            num_steps=1,
            batch_size=2,
            n_samples_per_prompt=4,
            max_tokens=6,
            lr=1e-2,
            seed=0,
            max_policy_lag=0,
            share_prefix=share,
            prepare_messages=lambda row: [Message("system", system), Message("user", row["prompt"])],
        )
        backend, policy = local_policy(model, tokenizer, config, name=f"tiny-share-{share}")
        result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy)
        return {**result.steps[0].metrics, "reward_mean": result.steps[0].reward_mean}

    plain = await step0(False)
    assert not heads
    shared = await step0(True)
    assert heads and min(heads) >= MIN_SHARED_COLUMNS
    assert plain["nonzero_advantage_samples"] == shared["nonzero_advantage_samples"] > 0
    assert plain["reward_mean"] == shared["reward_mean"]
    for key in ("loss", "grad_norm", "train_entropy"):
        assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key


def test_the_kv_cache_keyword_follows_the_installed_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from rollouts.providers import kv_cache

    for version, keyword in (("5.23.0", "past_key_values"), ("5.24.0.dev0", "cache"), ("5.40.1", "cache")):
        monkeypatch.setattr(transformers, "__version__", version)
        kv_cache.cache_keyword.cache_clear()
        assert kv_cache.with_cache("kv") == {keyword: "kv"}
    kv_cache.cache_keyword.cache_clear()  # (the installed version again for the other tests)
    monkeypatch.undo()
    assert kv_cache.cache_keyword() == "cache"  # 5.24 is what the test command installs
