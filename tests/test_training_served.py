"""Issue 26 defect 4: `ServedPolicy` end to end, and the pairs it refuses.

The server here is a small vLLM stand-in that really serves a model: `/tokenize` (the chat
template, or text), `/detokenize`, streamed `/v1/completions` with a token-id prompt and
`return_tokens_as_token_ids` (what the `vllm` token path sends, as vLLM answers it), each token
sampled from a real tiny torch model with its log-prob, and a reload route that loads
`save_pretrained` weights from the path it is given — the route a vLLM deployment adds for RL
(vLLM has none of its own). So a `grpo_train` step really goes trainer -> disk -> server ->
rollouts -> trainer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Score
from rollouts.testing import open_fake_server
from rollouts.testing.fake_server import RecordedRequest, RenderContext, sse
from rollouts.training import GRPOConfig, ServedPolicy, TorchBackend, grpo_train
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


class ServedTinyModel:
    """vLLM's token endpoints over a real tiny model, plus `POST /reload_weights {"model_path"}`."""

    name = "vllm-tiny"

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.reloaded: list[str] = []

    def matches(self, method: str, path: str) -> bool:
        return path in ("/tokenize", "/detokenize", "/v1/completions", "/reload_weights")

    def static_response(self, request: RecordedRequest) -> Any | None:
        body = request.body if isinstance(request.body, dict) else {}
        if request.path == "/tokenize":
            if "messages" in body:
                text = self.tokenizer.apply_chat_template(
                    body["messages"], tokenize=False, add_generation_prompt=body["add_generation_prompt"]
                )
            else:
                text = body["prompt"]
            return {"tokens": self.tokenizer.encode(text, add_special_tokens=False)}
        if request.path == "/detokenize":
            return {"prompt": self.tokenizer.decode(body["tokens"], skip_special_tokens=False)}
        if request.path == "/reload_weights":
            from transformers import AutoModelForCausalLM

            self.model = AutoModelForCausalLM.from_pretrained(body["model_path"]).float().eval()
            self.reloaded.append(body["model_path"])
            return {"success": True}
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return bool(request.json.get("stream"))

    def stream_events(self, reply: Any, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        body = request.json
        assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 0
        ids = list(body["prompt"])
        gen = torch.Generator().manual_seed(int(body.get("seed", 0)))
        eos = self.tokenizer.eos_token_id
        events = []
        with torch.inference_mode():
            for n in range(body["max_tokens"]):
                logits = self.model(input_ids=torch.tensor([ids])).logits[0, -1].float() / body["temperature"]
                logp = torch.log_softmax(logits, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=gen))
                ids.append(token)
                finish = "stop" if token == eos else "length" if n + 1 == body["max_tokens"] else None
                text = "" if token == eos else self.tokenizer.decode([token])
                choice = {
                    "index": 0,
                    "text": text,
                    "logprobs": {"tokens": [f"token_id:{token}"], "token_logprobs": [float(logp[token])]},
                    "finish_reason": finish,
                }
                events.append(sse({"id": "cmpl-1", "object": "text_completion", "choices": [choice]}))
                if finish:
                    break
        return [*events, b"data: [DONE]\n\n"]

    def complete_response(self, reply: Any, request: RecordedRequest, ctx: RenderContext) -> Any:
        raise AssertionError("the token path streams")

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        return {"error": {"code": status, "message": message}}


def sevens(sample: Any) -> Score:
    reply = sample.response
    return Score((Metric("sevens", reply.count("7") / max(len(reply), 1), weight=1.0),))


async def test_defect4_served_policy_trains_end_to_end_against_a_vllm_server_and_keeps_only_the_last_copy(
    tmp_path: Path,
) -> None:
    trainer_model, tokenizer = tiny_chat_model(seed=0)
    served_model, _ = tiny_chat_model(seed=0)  # the server starts from the same weights
    server = ServedTinyModel(served_model, tokenizer)
    config = GRPOConfig(
        output_dir=tmp_path / "run",
        num_steps=3,
        batch_size=2,
        n_samples_per_prompt=4,
        max_tokens=5,
        lr=3e-2,
        max_policy_lag=0,  # a reload after every step (with a lag: tests/test_training_overlap.py)
    )
    backend = TorchBackend(trainer_model)
    prompts = [{"prompt": "say seven"}, {"prompt": "digits"}]
    async with open_fake_server(lambda request: "unused", formats=[server]) as srv:
        policy = ServedPolicy(srv.base_url, "policy", weights_dir=tmp_path / "weights", reload_route="/reload_weights")
        result = await grpo_train(config, prompts, sevens, backend=backend, inference=policy)
        completions = [r for r in srv.requests if r.path == "/v1/completions"]
    assert [s.failed for s in result.steps] == [0, 0, 0]
    assert all(s.metrics["trained_samples"] == 8 for s in result.steps)
    assert len(completions) == 3 * 8
    # the server reloaded the trainer's weights after every step, from the path it was given
    assert server.reloaded == [str(tmp_path / "weights" / f"step_{k:06d}") for k in range(3)]
    served = server.model.state_dict()
    for name, tensor in trainer_model.state_dict().items():
        assert torch.equal(served[name], tensor), name
    # at most the last copy stays on disk (~0.5 GB a step for SmolLM2 before)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step_000002"]
    # the rollouts' log-probs are the served model's: the trainer recomputes them at ratio 1 on
    # the first step (same weights), so nothing was clipped
    first = json.loads((tmp_path / "run" / "log.jsonl").read_text().splitlines()[0])
    assert first["clip_fraction"] == 0.0 and math.isfinite(first["loss"])


@pytest.mark.parametrize(
    ("provider", "words"),
    [
        ("llamacpp", "cannot reload weights"),
        ("local", "cannot reload weights"),
        ("transformers", "local_policy"),
        ("sglang", "cannot give the token ids"),
        ("openai", "cannot give the token ids"),
    ],
)
def test_defect4_served_policy_refuses_a_server_that_cannot_reload_or_a_provider_without_token_ids(
    tmp_path: Path, provider: str, words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words) as info:
        ServedPolicy("http://127.0.0.1:1/v1", "m", weights_dir=tmp_path, reload_route="/reload", provider=provider)
    assert "provider='vllm'" in str(info.value)
    with pytest.raises(ConfigurationError, match="reload_route must be a path"):
        ServedPolicy("http://127.0.0.1:1/v1", "m", weights_dir=tmp_path, reload_route="reload")
