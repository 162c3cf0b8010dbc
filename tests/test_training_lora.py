"""LoRA (peft), bf16 and gradient checkpointing in the in-process trainer, on the tiny model:
only adapters train, merged weights give the adapted logits, the KL reference is the base model
(adapters disabled), rollouts sample from the adapted model, resume, and the CLI's adapter
output and `rollouts train merge`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from _training_helpers import PROMPTS, sevens
from test_training_cli import SCORE, _cli, _save_tiny, _write

from rollouts.dtypes import Endpoint, Message, Trajectory
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Score
from rollouts.providers.transformers_local import load_causal_lm, stream_transformers
from rollouts.training import GRPOConfig, grpo_train, local_policy, sequence_logprobs
from rollouts.training.lora import adapters_disabled, is_adapted, merged_model
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)
TOKENS = (1, 12, 30, 7, 22, 41, 9, 3, 17, 28, 5, 33)


def _config(out: Path, **changes: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(
        output_dir=out,
        num_steps=2,
        batch_size=2,
        n_samples_per_prompt=4,
        max_tokens=6,
        lr=5e-2,
        lr_schedule="constant",
        checkpoint_every=1,
        seed=3,
        lora_r=4,
        lora_alpha=8.0,
    )
    base.update(changes)
    return GRPOConfig(**base)


def reply_length(sample: Any) -> Score:
    """A reward that differs within almost every group (so a single step has a gradient)."""
    return Score((Metric("length", float(len(sample.response)), weight=1.0),))


async def _lora_run(out: Path, name: str, score: Any = sevens, **changes: Any) -> tuple[Any, Any, Any]:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(out, **changes)
    backend, policy = local_policy(model, tokenizer, config, name=name)
    result = await grpo_train(config, PROMPTS, score, backend=backend, inference=policy)
    return backend, tokenizer, result


def _lora_params(model: Any) -> dict[str, Any]:
    return {n: p for n, p in model.named_parameters() if "lora_" in n}


async def test_lora_trains_only_the_adapters_and_leaves_the_base_weights_bit_identical(tmp_path: Path) -> None:
    start, _ = tiny_chat_model(seed=0)
    backend, _, result = await _lora_run(tmp_path, "lora-only-adapters")
    model = backend.model
    assert is_adapted(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(_lora_params(model)) and trainable  # all-linear: q, k, v, o, gate, up, down
    assert {n.split(".")[-4] for n in trainable} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    base = model.get_base_model().state_dict()
    for name, tensor in start.state_dict().items():
        key = (
            name.replace(".weight", ".base_layer.weight")
            if name.replace(".weight", ".base_layer.weight") in base
            else name
        )
        assert torch.equal(base[key], tensor), name
    assert any(float(p.abs().max()) > 0 for n, p in _lora_params(model).items() if "lora_B" in n)  # B moved from 0
    assert result.steps[-1].metrics["grad_norm"] > 0
    # the checkpoint holds the adapters alone: as `save_pretrained` writes them, and in trainer.pt
    last = tmp_path / "checkpoints" / "step_000001"
    assert (last / "adapter" / "adapter_config.json").is_file()
    assert (last / "adapter" / "adapter_model.safetensors").is_file()
    state = torch.load(last / "trainer.pt", weights_only=False)
    assert set(state["model"]) == set(_lora_params(model))
    assert len(state["optimizer"]["state"]) == len(trainable)


async def test_merged_weights_give_the_logits_of_base_plus_adapter(tmp_path: Path) -> None:
    backend, _, _ = await _lora_run(tmp_path, "lora-merge")
    ids = torch.tensor([TOKENS])
    with torch.inference_mode():
        adapted = backend.model(input_ids=ids).logits
        merged = merged_model(backend.model)(input_ids=ids).logits
        with adapters_disabled(backend.model) as base:
            plain = base(input_ids=ids).logits
    assert not is_adapted(merged_model(backend.model))
    # fp32: W + (alpha/r) B A summed once instead of x W + (alpha/r) (x A) B: rounding only
    assert torch.allclose(adapted, merged, atol=1e-5, rtol=1e-5), float((adapted - merged).abs().max())
    assert float((adapted - plain).abs().max()) > 1e-3  # the adapters did change the logits
    # what a served policy is sent: whole weights, merged
    await backend.save_weights(tmp_path / "served")
    from transformers import AutoModelForCausalLM

    served = AutoModelForCausalLM.from_pretrained(str(tmp_path / "served")).eval()
    with torch.inference_mode():
        assert torch.allclose(served(input_ids=ids).logits, adapted, atol=1e-5, rtol=1e-5)


async def test_kl_reference_with_adapters_disabled_is_the_base_models_logprobs(tmp_path: Path) -> None:
    backend, _, result = await _lora_run(tmp_path, "lora-kl", kl_coef=0.1, num_steps=3)
    assert backend.reference_model is None  # no second copy of the weights
    base, _ = tiny_chat_model(seed=0)
    want = sequence_logprobs(base, TOKENS)
    with backend._reference() as reference:
        got = sequence_logprobs(reference, TOKENS)
    assert got == want  # bit-identical: the base layers alone
    assert sequence_logprobs(backend.model, TOKENS) != want  # outside the context the adapters are on again
    assert result.steps[0].metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # B starts at 0: policy = reference
    assert result.steps[-1].metrics["kl"] > 0


async def test_the_in_process_policy_samples_from_the_adapted_model(tmp_path: Path) -> None:
    backend, _, _ = await _lora_run(tmp_path, "lora-sampling")
    actor_traj = Trajectory((Message("user", "say seven"),))
    from rollouts.dtypes import Actor

    async def quiet(_: Any) -> None:
        return None

    actor = Actor(
        trajectory=actor_traj, endpoint=Endpoint("transformers", "lora-sampling", max_tokens=6, temperature=1.0)
    )
    done = await stream_transformers(actor, quiet)
    record = done.trajectory.completions[-1].tokens
    assert record is not None and record.completion_ids
    tokens = (*record.prompt_ids, *record.completion_ids)
    n = len(record.prompt_ids)
    adapted = sequence_logprobs(backend.model, tokens)[n:]
    with adapters_disabled(backend.model) as base:
        plain = sequence_logprobs(base, tokens)[n:]
    assert list(record.logprobs) == pytest.approx(adapted, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(record.logprobs, plain, strict=True)) > 1e-3


async def test_lora_run_resumes_to_the_uninterrupted_runs_adapters_and_refuses_other_lora_settings(
    tmp_path: Path,
) -> None:
    straight, _, _ = await _lora_run(tmp_path / "straight", "lora-straight", num_steps=4)
    await _lora_run(tmp_path / "resumed", "lora-first", num_steps=2)
    resumed, _, result = await _lora_run(tmp_path / "resumed", "lora-second", num_steps=4)
    assert result.resumed_from == 1 and [s.step for s in result.steps] == [2, 3]
    want = _lora_params(straight.model)
    got = _lora_params(resumed.model)
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    with pytest.raises(ConfigurationError, match=r"another configuration.*setting lora_r \(4 -> 8\)"):
        await _lora_run(tmp_path / "resumed", "lora-other-r", num_steps=5, lora_r=8)
    with pytest.raises(ConfigurationError, match=r"setting lora_targets \(\['all-linear'\] -> \['q_proj'\]\)"):
        await _lora_run(tmp_path / "resumed", "lora-other-targets", num_steps=5, lora_targets=("q_proj",))


async def _layer_calls_and_weights(out: Path, checkpointing: bool) -> tuple[int, dict[str, Any]]:
    """How often one decoder layer's MLP ran in a training step, and the weights after it."""
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(out, num_steps=1, lora_r=0, gradient_checkpointing=checkpointing)
    backend, policy = local_policy(model, tokenizer, config, name=f"gc-{checkpointing}")
    seen = [0]
    calls = [0]

    def count(*_: Any) -> None:
        seen[0] += 1

    handle = model.model.layers[0].mlp.register_forward_pre_hook(count)  # (early-stopped recomputes end mid-MLP)
    original = backend.train_step

    async def train_step(batch: Any, lr: float) -> Any:
        seen[0] = 0
        metrics = await original(batch, lr)
        calls[0] = seen[0]
        return metrics

    backend.train_step = train_step  # type: ignore[method-assign]
    await grpo_train(config, PROMPTS, reply_length, backend=backend, inference=policy)
    handle.remove()
    return calls[0], {k: v.clone() for k, v in model.state_dict().items()}


async def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_step(tmp_path: Path) -> None:
    plain_calls, plain = await _layer_calls_and_weights(tmp_path / "plain", False)
    checkpointed_calls, checkpointed = await _layer_calls_and_weights(tmp_path / "checkpointed", True)
    # each minibatch's forward runs the layer once; checkpointing runs it again in the backward pass
    assert plain_calls >= 1 and checkpointed_calls == 2 * plain_calls
    for name, tensor in plain.items():
        assert torch.equal(checkpointed[name], tensor), name
    # a memory option, not a different run: resuming with it changed is allowed
    assert "gradient_checkpointing" not in _config(tmp_path, gradient_checkpointing=True).settings()


async def test_bf16_weights_train_and_lora_keeps_its_adapters_in_fp32(tmp_path: Path) -> None:
    backend, _, result = await _lora_run(tmp_path / "lora", "bf16-lora", reply_length, dtype="bf16", num_steps=1)
    dtypes = {n: p.dtype for n, p in backend.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    assert result.steps[0].metrics["grad_norm"] > 0
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path / "full", num_steps=1, lora_r=0, dtype="bf16")
    full, policy = local_policy(model, tokenizer, config, name="bf16-full")
    result = await grpo_train(config, PROMPTS, reply_length, backend=full, inference=policy)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert config.settings()["dtype"] == "bf16"
    assert result.steps[0].metrics["grad_norm"] > 0


@pytest.mark.slow
async def test_cli_lora_run_writes_adapters_that_merge_to_the_adapted_model(tmp_path: Path) -> None:
    await trio.to_thread.run_sync(_save_tiny, tmp_path / "tiny")
    _write(tmp_path / "prompts.jsonl", "".join(json.dumps({"prompt": p}) + "\n" for p in ("say seven", "a number?")))
    _write(tmp_path / "task.py", SCORE)
    args = ["train", "grpo", "--model", str(tmp_path / "tiny"), "--data", "prompts.jsonl", "--score", "task.py:sevens"]
    args += ["--output", "run", "--batch-size", "2", "--group", "4", "--max-tokens", "6", "--lr", "0.05"]
    args += ["--steps", "2", "--threads", "1", "--lora-r", "4", "--lora-alpha", "8", "--lora-targets", "q_proj,v_proj"]
    code, out, err = await _cli(*args, cwd=tmp_path)
    assert code == 0, err[-3000:]
    final = tmp_path / "run" / "final"
    adapter_config = json.loads((final / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str((tmp_path / "tiny").resolve())
    assert sorted(adapter_config["target_modules"]) == ["q_proj", "v_proj"]
    assert not (final / "model.safetensors").exists()  # the adapters alone

    code, out, err = await _cli("train", "merge", "run/final", "--output", "merged", cwd=tmp_path)
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["merged"] == "merged"
    from peft import PeftModel

    base, _ = load_causal_lm(str(tmp_path / "tiny"))
    adapted = PeftModel.from_pretrained(base, str(final)).eval()
    merged, _ = load_causal_lm(str(tmp_path / "merged"))
    via_adapter_dir, _ = load_causal_lm(str(final))  # an adapter directory loads merged into its base
    ids = torch.tensor([TOKENS])
    with torch.inference_mode():
        want = adapted(input_ids=ids).logits
        for model in (merged, via_adapter_dir):
            assert torch.allclose(model(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)

    code, out, err = await _cli("train", "merge", "run", "--output", "x", cwd=tmp_path)
    assert code != 0 and "no adapter_config.json" in err
