"""Token-exact rollouts (RunConfig.use_tito) through the in-process `transformers` provider, on a
tiny randomly initialised model with a character vocabulary built in the test (no download)."""

from __future__ import annotations

import json
from typing import Any

import pytest

try:
    import torch
    import transformers  # noqa: F401
except ImportError:  # never skipped: say what to install
    pytest.fail(
        "the training tests need torch and transformers: pip install torch==2.13.0 -e '.[train]'", pytrace=False
    )

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Tool, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import ConfigurationError
from rollouts.eval.config import EvalConfig
from rollouts.eval.run import evaluate
from rollouts.eval.sample import Metric, Score
from rollouts.events import StreamDone, StreamEvent, StreamStart, TextDelta, TextEnd, TextStart
from rollouts.providers.tito import get_token_provider_function, set_sampling_seed, tools_instruction
from rollouts.providers.transformers_local import register_transformers_model, unregister_transformers_model
from rollouts.run_config import RunConfig
from rollouts.training import TrainingSample, sequence_logprobs, token_view
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)


@pytest.fixture
def tiny() -> Any:
    model, tokenizer = tiny_chat_model(seed=0)
    register_transformers_model("tiny-tito", model, tokenizer)
    yield model, tokenizer
    unregister_transformers_model("tiny-tito")


def _score(sample: Any) -> Score:
    return Score((Metric("length", float(len(sample.response)), weight=1.0),))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_recorded_tokens_and_logprobs_equal_the_trainers_recomputation(tiny: Any, temperature: float) -> None:
    model, tokenizer = tiny
    rows = [{"prompt": f"what is {i}+{i}?"} for i in range(6)]
    config = EvalConfig(
        endpoint=Endpoint("transformers", "tiny-tito", max_tokens=24, temperature=temperature),
        score_fn=_score,
        run_config=RunConfig(use_tito=True),
        max_turns=1,
        max_concurrent=6,
        show_progress=False,
        on_sample_start=lambda sid, row: set_sampling_seed(int(sid)),
    )
    report = await evaluate(rows, config)
    assert [s.status for s in report.samples] == ["completed"] * 6
    for sample in report.samples:
        assert sample.trajectory is not None
        (completion,) = sample.trajectory.completions
        record = completion.tokens
        assert record is not None
        # the prompt ids are the chat template's rendering of the conversation
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": sample.input["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        assert list(record.prompt_ids) == tokenizer.encode(rendered, add_special_tokens=False)
        # the message text is exactly the sampled ids' text
        assert tokenizer.decode(list(record.completion_ids), skip_special_tokens=True) == sample.response
        tokens, mask, logprobs = token_view(sample.trajectory)
        recomputed = sequence_logprobs(model, tokens, temperature=temperature)
        diffs = [abs(a - b) for a, b, m in zip(logprobs, recomputed, mask, strict=True) if m]
        assert len(diffs) == len(record.completion_ids) > 0
        assert max(diffs) < 1e-5


async def test_a_samples_tokens_do_not_depend_on_what_it_was_batched_with(tiny: Any) -> None:
    endpoint = Endpoint("transformers", "tiny-tito", max_tokens=16, temperature=1.0)

    async def run(rows: list[dict[str, Any]]) -> dict[str, tuple[int, ...]]:
        config = EvalConfig(
            endpoint=endpoint,
            run_config=RunConfig(use_tito=True),
            max_turns=1,
            max_concurrent=len(rows),
            show_progress=False,
            on_sample_start=lambda sid, row: set_sampling_seed(row["seed"]),
        )
        report = await evaluate(rows, config)
        out = {}
        for s in report.samples:
            assert s.trajectory is not None and s.trajectory.completions[0].tokens is not None
            out[s.id] = s.trajectory.completions[0].tokens.completion_ids
        return out

    alone = await run([{"id": "a", "prompt": "hello there", "seed": 7}])
    batched = await run(
        [{"id": f"x{i}", "prompt": "x" * i, "seed": i} for i in range(5)]
        + [{"id": "a", "prompt": "hello there", "seed": 7}]
    )
    assert batched["a"] == alone["a"]
    assert len({batched[f"x{i}"] for i in range(1, 5)} | {batched["a"]}) > 1  # the seeds differ, so do samples


async def test_events_follow_the_stream_grammar(tiny: Any) -> None:
    events: list[StreamEvent] = []

    async def on_chunk(event: StreamEvent) -> None:
        events.append(event)

    state = AgentState(
        Actor(Trajectory((Message("user", "hi"),)), Endpoint("transformers", "tiny-tito", max_tokens=12))
    )
    states = await run_agent(state, RunConfig(on_chunk=on_chunk, max_turns=1))
    kinds = [type(e) for e in events]
    assert kinds[1] is StreamStart and kinds[-1] is StreamDone
    text = "".join(e.delta for e in events if isinstance(e, TextDelta))
    assert text == states[-1].actor.trajectory.messages[-1].text
    if text:
        assert TextStart in kinds and TextEnd in kinds
    done = events[-1]
    assert isinstance(done, StreamDone) and done.usage.output_tokens > 0
    # without use_tito the provider still records tokens (it has them anyway)
    assert states[-1].actor.trajectory.completions[-1].tokens is not None


def test_use_tito_on_a_provider_without_token_ids_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"use_tito.*'anthropic'.*transformers"):
        get_token_provider_function("anthropic")


def test_token_records_round_trip_through_json() -> None:
    from rollouts.dtypes import Completion, TokenRecord

    traj = Trajectory(
        (Message("user", "q"), Message("assistant", "a")),
        (Completion("transformers", "m", "stop", 1, tokens=TokenRecord((1, 2), (3, 4), (-0.5, -0.25))),),
    )
    again = Trajectory.from_jsonl(traj.to_jsonl())
    assert again == traj
    with pytest.raises(ValueError, match="2 completion ids but 1 log-probs"):
        TokenRecord((1,), (2, 3), (-1.0,))


# ---------------------------------------------------------------------------------------------
# Multi-turn: tool results enter as tokens with loss mask 0
# ---------------------------------------------------------------------------------------------

CALLS = [
    json.dumps({"name": "add", "arguments": {"value": 5}}),
    json.dumps({"name": "complete_task", "arguments": {"final_result": "5"}}),
]


class ShortCalculator(CalculatorEnvironment):
    """The calculator with two tools and short descriptions (a short prompt for the tiny model)."""

    def get_tools(self) -> tuple[Tool, ...]:
        number = {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}
        answer = {"type": "object", "properties": {"final_result": {"type": "string"}}, "required": ["final_result"]}
        return (Tool("add", "add", number), Tool("complete_task", "finish", answer))


def _teach_tool_calls(model: Any, tokenizer: Any) -> None:
    """Supervised steps until the tiny model answers the calculator task with two tool calls
    (so the test exercises real sampled tool turns)."""
    tools = ShortCalculator().get_tools()
    system = tools_instruction(tools)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": "add five"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    segments = [(text, 0), (CALLS[0] + "<|im_end|>", 1)]
    segments += [("\n<|im_start|>tool\nadded 5 to 0. current value: 5<|im_end|>\n<|im_start|>assistant\n", 0)]
    segments += [(CALLS[1] + "<|im_end|>", 1)]
    ids: list[int] = []
    weights: list[float] = []
    for seg, w in segments:
        seg_ids = tokenizer.encode(seg, add_special_tokens=False)
        ids += seg_ids
        weights += [float(w)] * len(seg_ids)
    x = torch.tensor([ids])
    target_mask = torch.tensor(weights[1:])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(300):
        logits = model(input_ids=x).logits[0, :-1]
        loss = (
            torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none") * target_mask
        ).sum() / target_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 1e-3:
            break
    model.eval()


async def test_loss_mask_covers_exactly_the_models_tokens_across_tool_turns() -> None:
    model, tokenizer = tiny_chat_model(seed=1, hidden_size=64)
    _teach_tool_calls(model, tokenizer)
    register_transformers_model("tiny-tools", model, tokenizer)
    try:
        config = EvalConfig(
            endpoint=Endpoint("transformers", "tiny-tools", max_tokens=80, temperature=0.0),
            environment_factory=ShortCalculator,
            run_config=RunConfig(use_tito=True),
            max_turns=4,
            show_progress=False,
        )
        report = await evaluate([{"prompt": "add five"}], config)
    finally:
        unregister_transformers_model("tiny-tools")
    (sample,) = report.samples
    assert sample.status == "completed" and sample.trajectory is not None
    traj = sample.trajectory
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert [c.name for m in traj.messages for c in m.get_tool_calls()] == ["add", "complete_task"]
    assert sample.stop_reason == "task_completed"

    training = TrainingSample.from_eval_sample(sample, group_index=0)
    records = [c.tokens for c in traj.completions]
    assert all(r is not None for r in records)
    # the second call's prompt extends the first call's prompt and completion unchanged
    first, second = records[0], records[1]
    assert first is not None and second is not None
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    # the mask's ones are exactly the sampled ids, in order, with their log-probs
    model_ids = [t for t, m in zip(training.tokens, training.loss_mask, strict=True) if m]
    assert model_ids == list(first.completion_ids + second.completion_ids)
    assert [lp for lp, m in zip(training.rollout_logprobs, training.loss_mask, strict=True) if m] == list(
        first.logprobs + second.logprobs
    )
    # the tool result is in the sequence, as text the model did not write
    masked_out = tokenizer.decode([t for t, m in zip(training.tokens, training.loss_mask, strict=True) if not m])
    assert "added 5 to 0. current value: 5" in masked_out
    sampled_text = tokenizer.decode(model_ids)
    assert "current value" not in sampled_text
    assert sampled_text == CALLS[0].lower() + "<|im_end|>" + CALLS[1].lower() + "<|im_end|>"
    # and the recomputation agrees on every sampled token
    recomputed = sequence_logprobs(model, training.tokens)
    diffs = [abs(a - b) for a, b, m in zip(training.rollout_logprobs, recomputed, training.loss_mask, strict=True) if m]
    assert max(diffs) < 1e-5


def test_shared_prefix_length_leaves_every_prompt_a_token_of_its_own() -> None:
    from rollouts.providers.transformers_local import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 5]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token stays each row's own
    assert shared_prefix_length([[1, 2], [1, 2, 3, 4]]) == 1  # one is the other's beginning
    assert shared_prefix_length([[7, 1], [8, 1]]) == 0


async def test_a_batch_sharing_a_long_prompt_prefix_samples_what_each_prompt_would_alone(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRPO group's samples (and an evaluation's rows under one system prompt) share most of
    their prompt: the engine runs that part once. Each sample must still get the tokens it would
    get alone and log-probs equal to the trainer's recomputation."""
    from rollouts.providers import transformers_local

    shared_calls: list[int] = []
    original = transformers_local.GenerationEngine._prefill_shared

    def spy(self: Any, requests: Any, shared: int) -> Any:
        shared_calls.append(shared)
        return original(self, requests, shared)

    monkeypatch.setattr(transformers_local.GenerationEngine, "_prefill_shared", spy)
    model, _ = tiny
    system = "you are a careful assistant who answers in few words. " * 2

    async def run(rows: list[dict[str, Any]]) -> dict[str, Any]:
        config = EvalConfig(
            endpoint=Endpoint("transformers", "tiny-tito", max_tokens=12, temperature=1.0),
            run_config=RunConfig(use_tito=True),
            prepare_messages=lambda row: [Message("system", system), Message("user", row["prompt"])],
            max_turns=1,
            max_concurrent=len(rows),
            show_progress=False,
            on_sample_start=lambda sid, row: set_sampling_seed(row["seed"]),
        )
        report = await evaluate(rows, config)
        return {s.id: s for s in report.samples}

    rows: list[dict[str, Any]] = [{"id": f"r{i}", "prompt": "q" * (i + 1), "seed": i} for i in range(5)]
    together = await run(rows)
    assert shared_calls and min(shared_calls) > 100  # the system prompt ran once for the batch
    shared_calls.clear()
    for row in rows:
        alone = (await run([row]))[row["id"]]
        sample = together[row["id"]]
        assert sample.trajectory is not None and alone.trajectory is not None
        ours, theirs = sample.trajectory.completions[0].tokens, alone.trajectory.completions[0].tokens
        assert ours is not None and theirs is not None
        assert ours.prompt_ids == theirs.prompt_ids and ours.completion_ids == theirs.completion_ids
        tokens, mask, logprobs = token_view(sample.trajectory)
        recomputed = sequence_logprobs(model, tokens, temperature=1.0)
        diffs = [abs(a - b) for a, b, m in zip(logprobs, recomputed, mask, strict=True) if m]
        assert diffs and max(diffs) < 1e-5
    assert not shared_calls  # one prompt alone has nothing to share
