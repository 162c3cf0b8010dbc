"""Held-out evaluation during GRPO (issue 31 item 4): `heldout_reward` in the log on the right
steps, the policy's greedy figure at that step, no change to what training does; and the
multi-turn benchmark's held-out episodes, disjoint from its training episodes."""

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

from test_training_defects import _benchmark_module  # (benchmarks/grpo.py loaded as a module)

from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.training import GRPOConfig, HeldOut, evaluate_heldout, grpo_train, local_policy
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)
PROMPTS = [{"prompt": "say seven"}, {"prompt": "a number?"}, {"prompt": "digits"}]
HELDOUT = [{"prompt": "seven please", "w": 0.25}, {"prompt": "one digit", "w": 1.0}]


def sevens(sample: Sample) -> Score:
    """Training reward: the share of the reply's characters that are '7'."""
    reply = sample.response
    return Score((Metric("sevens", reply.count("7") / max(len(reply), 1), weight=1.0),))


def row_weight(sample: Sample) -> Score:
    """A scripted held-out score: the row's own `w`, whatever the reply (its mean is known)."""
    return Score((Metric("w", float(sample.input["w"]), weight=1.0),))


def _config(out: Path, **changes: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(
        output_dir=out,
        num_steps=5,
        batch_size=2,
        n_samples_per_prompt=4,
        max_tokens=6,
        lr=3e-2,
        lr_schedule="constant",
        checkpoint_every=100,
        seed=3,
        # strict alternation: with max_policy_lag >= 1 a held-out step is a drain point of the
        # overlap, so held-out evaluation changes which steps overlap (tests/test_training_overlap.py)
        max_policy_lag=0,
    )
    base.update(changes)
    return GRPOConfig(**base)


def _log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


async def test_heldout_reward_is_logged_every_k_steps_and_after_the_last(tmp_path: Path) -> None:
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-heldout-every")
    heldout = HeldOut(HELDOUT, row_weight, every=2)
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, heldout=heldout)
    log = _log(tmp_path)
    assert [e["step"] for e in log] == [0, 1, 2, 3, 4]
    assert [e["step"] for e in log if "heldout_reward" in e] == [1, 3, 4]  # every 2nd step, and the last
    for entry in log:
        if "heldout_reward" in entry:
            assert entry["heldout_reward"] == pytest.approx(0.625)  # the mean of the rows' scripted scores
            assert entry["heldout_failed"] == 0.0 and entry["heldout_seconds"] > 0
        else:
            assert not any(k.startswith("heldout") and not k.endswith("_start") for k in entry)
    # and once before the first update, in step 0's line (HeldOut.at_start)
    assert [e["step"] for e in log if any(k.endswith("_start") for k in e)] == [0]
    assert log[0]["heldout_reward_start"] == pytest.approx(0.625) and log[0]["heldout_failed_start"] == 0.0
    assert [s.step for s in result.steps if "heldout_reward" in s.metrics] == [1, 3, 4]


async def test_the_figure_before_training_is_the_untrained_policys_and_a_resume_does_not_redo_it(
    tmp_path: Path,
) -> None:
    scored: list[str] = []

    def reply_code(sample: Sample) -> Score:  # a number that changes with the reply's characters
        scored.append(sample.response)
        return Score((Metric("code", sum(map(ord, sample.response)) % 97 / 97, weight=1.0),))

    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, num_steps=2, checkpoint_every=1, lr=1e-1)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-heldout-start")
    before = await evaluate_heldout(HeldOut(HELDOUT, reply_code), policy, config)
    scored.clear()
    heldout = HeldOut(HELDOUT, reply_code, every=2)
    await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, heldout=heldout)
    log = _log(tmp_path)
    assert log[0]["heldout_reward_start"] == pytest.approx(before.reward)
    assert len(scored) == 2 * len(HELDOUT)  # before the first update, and after step 1
    assert sorted(scored[:2]) == sorted(s.response for s in before.samples)  # the untrained policy's replies
    assert log[1]["heldout_reward"] != pytest.approx(before.reward)  # lr 0.1 moved the greedy replies
    # extended by a step: resumes after step 1 and evaluates only after the new last step
    scored.clear()
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path, num_steps=3, checkpoint_every=1, lr=1e-1)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-heldout-start-2")
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, heldout=heldout)
    assert result.resumed_from == 1 and len(scored) == len(HELDOUT)
    resumed = _log(tmp_path)
    assert resumed[:2] == log and not any(k.endswith("_start") for k in resumed[2])
    # at_start=False: no figure before training
    model, tokenizer = tiny_chat_model(seed=0)
    config = _config(tmp_path / "off", num_steps=1)
    backend, policy = local_policy(model, tokenizer, config, name="tiny-heldout-start-off")
    await grpo_train(
        config, PROMPTS, sevens, backend=backend, inference=policy, heldout=HeldOut(HELDOUT, sevens, at_start=False)
    )
    assert not any(k.endswith("_start") for k in _log(tmp_path / "off")[0])


async def test_heldout_evaluation_leaves_the_trained_weights_and_rollouts_unchanged(tmp_path: Path) -> None:
    """The same run with and without held-out evaluation ends with the same weights and the same
    training rewards (the evaluation draws no sampling seed or random state of the training's),
    and the last step's `heldout_reward` is the trained policy's greedy score on the rows."""
    runs = {}
    for name, heldout in (("plain", None), ("with-heldout", HeldOut(HELDOUT, sevens, every=1))):
        model, tokenizer = tiny_chat_model(seed=0)
        config = _config(tmp_path / name)
        backend, policy = local_policy(model, tokenizer, config, name=f"tiny-heldout-{name}")
        await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, heldout=heldout)
        runs[name] = (model, policy, config, _log(tmp_path / name))
    plain, with_heldout = runs["plain"], runs["with-heldout"]
    expected, got = plain[0].state_dict(), with_heldout[0].state_dict()
    assert set(got) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key
    assert [e["reward_mean"] for e in with_heldout[3]] == [e["reward_mean"] for e in plain[3]]
    assert all("heldout_reward" in e for e in with_heldout[3])
    # the figure logged after the last step is the final policy's, evaluated again now
    again = await evaluate_heldout(HeldOut(HELDOUT, sevens), with_heldout[1], with_heldout[2])
    assert with_heldout[3][-1]["heldout_reward"] == pytest.approx(again.reward)
    assert len(again.samples) == len(HELDOUT) and again.failed == 0


def test_heldout_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"HeldOut\.every must be >= 1"):
        HeldOut(HELDOUT, sevens, every=0)
    with pytest.raises(ConfigurationError, match="no rows"):
        HeldOut([], sevens)
    with pytest.raises(ConfigurationError, match="row 1 is a str"):
        HeldOut([{"prompt": "x"}, "y"], sevens)  # type: ignore[list-item]


def test_the_multiturn_benchmarks_heldout_episodes_are_disjoint_from_training() -> None:
    """At least 16 held-out calculator episodes; none shares its operand pair (in either order)
    with a training episode, and none is the prompt's worked episode."""
    bench = _benchmark_module()
    args = bench.parse_args([])
    train, held = bench.multiturn_split(args)
    assert len(held) >= 16
    pairs = lambda rows: {frozenset((r["a"], r["b"])) for r in rows}  # noqa: E731
    assert not pairs(held) & pairs(train)
    assert frozenset(bench.MULTI_EXAMPLE_PAIR) not in pairs(held)
    assert {(r["a"], r["b"]) for r in held}.isdisjoint({(r["a"], r["b"]) for r in train})
    assert all(r["answer"] == str(r["a"] + r["b"]) for r in train + held)


def test_the_multiturn_benchmarks_success_is_strict_and_its_training_reward_shaped() -> None:
    """Held-out success needs the calculator at the sum AND the sum reported by complete_task;
    the training rewards add partial credit: for the calculator reaching the sum (reached, the
    default), or for the steps the task asks for (shaped: add a, add b)."""
    from rollouts.dtypes import Message, ToolCallContent, Trajectory

    bench = _benchmark_module()
    row = {"a": 4, "b": 7, "answer": "11"}

    def episode(calls: list[tuple[str, dict[str, Any]]], value: float, stop: str) -> Sample:
        messages = list(bench.multiturn_messages(row))
        for i, (name, arguments) in enumerate(calls):
            call = ToolCallContent(f"c{i}", name, arguments)
            messages += [Message("assistant", (call,)), Message.tool_result(call, "ok")]
        return Sample(
            "s", row, Trajectory(tuple(messages)), stop_reason=stop, environment_state={"current_value": value}
        )

    add4, add7, add11 = ("add", {"value": 4}), ("add", {"value": 7}), ("add", {"value": 11})
    cases = [  # (calls, calculator value, stop reason) -> (success, shaped reward, reached reward)
        ([add4, add7, ("complete_task", {"final_result": "11"})], 11.0, "task_completed", 1.0, 1.0, 1.0),
        ([add4, add7, ("complete_task", {"final_result": 11})], 11.0, "task_completed", 1.0, 1.0, 1.0),
        ([add4, add7, ("complete_task", {"final_result": "12"})], 11.0, "task_completed", 0.0, 0.5, 0.5),
        ([add11, ("complete_task", {"final_result": "11"})], 11.0, "task_completed", 1.0, 0.5, 1.0),
        ([add4, ("complete_task", {"final_result": "4"})], 4.0, "task_completed", 0.0, 0.25, 0.0),
        ([add4, ("add", {"value": 4}), ("add", {"value": 8})], 16.0, "max_turns", 0.0, 0.25, 0.0),
        ([add4, add7], 11.0, "max_turns", 0.0, 0.5, 0.5),
        ([add7, add4, ("complete_task", {"final_result": "11"})], 11.0, "task_completed", 1.0, 0.5, 1.0),
        ([add4, add7, ("add", {"value": 1})], 12.0, "max_turns", 0.0, 0.5, 0.0),
    ]
    for calls, value, stop, success, shaped, reached in cases:
        sample = episode(calls, value, stop)
        assert bench.calculator_success(sample).reward == success, calls
        assert bench.calculator_shaped(sample).reward == shaped, calls
        assert bench.calculator_reached(sample).reward == reached, calls
    # the worked episode's own calls never count: the prompt alone is no success and no credit
    prompt_only = Sample("p", row, Trajectory(tuple(bench.multiturn_messages(row))), stop_reason="no_tool_called")
    for score in (bench.calculator_success, bench.calculator_shaped, bench.calculator_reached):
        assert score(prompt_only).reward == 0.0
