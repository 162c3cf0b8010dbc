"""The training Sample: one rollout as the trainer sees it (tokens, loss mask, log-probs, reward).

Built from an evaluated `rollouts.eval.sample.Sample` whose trajectory was recorded token-exact
(`RunConfig.use_tito`): the tokens are the last model call's prompt ids followed by its
completion ids; since every call's prompt extends the previous call's prompt and completion,
that sequence holds every turn. The loss mask is 1 exactly on the ids the model sampled (every
call's completion) and 0 on the prompt, tool results and environment messages in between;
`rollout_logprobs` holds the sampler's log-prob of each sampled id (0.0 where the mask is 0).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollouts.dtypes import Message, Trajectory
from rollouts.eval.sample import Sample, SampleStatus, Score


@dataclass(frozen=True)
class TrainingSample:
    """One rollout for training. `tokens`, `loss_mask` and `rollout_logprobs` have equal length;
    `rollout_logprobs[i]` is the sampler's log-prob of `tokens[i]` given `tokens[:i]`."""

    id: str
    group_index: int
    input: Mapping[str, Any] = field(default_factory=dict)
    prompt: tuple[Message, ...] = ()
    trajectory: Trajectory | None = None
    tokens: tuple[int, ...] = ()
    loss_mask: tuple[int, ...] = ()
    rollout_logprobs: tuple[float, ...] = ()
    reward: float = 0.0
    advantage: float = 0.0
    score: Score | None = None
    status: SampleStatus = "pending"
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.loss_mask) == len(self.rollout_logprobs):
            raise ValueError(
                f"TrainingSample {self.id!r}: tokens ({len(self.tokens)}), loss_mask ({len(self.loss_mask)}) "
                f"and rollout_logprobs ({len(self.rollout_logprobs)}) must have the same length"
            )

    @property
    def num_model_tokens(self) -> int:
        """How many tokens the model sampled (the mask's ones)."""
        return sum(self.loss_mask)

    @classmethod
    def from_eval_sample(cls, sample: Sample, group_index: int) -> TrainingSample:
        """The training view of an evaluated sample recorded with `use_tito`. A sample that did
        not complete gets empty tokens (it is not trained on); a completed one without token
        records is a ValueError (the run was not token-exact)."""
        traj = sample.trajectory
        prompt: tuple[Message, ...] = ()
        if traj is not None:
            first = next((i for i, m in enumerate(traj.messages) if m.role == "assistant"), len(traj.messages))
            prompt = traj.messages[:first]
        base = cls(
            id=sample.id,
            group_index=group_index,
            input=sample.input,
            prompt=prompt,
            trajectory=traj,
            reward=sample.reward,
            score=sample.score,
            status=sample.status,
        )
        if sample.status != "completed" or traj is None:
            return base
        tokens, mask, logprobs = token_view(traj)
        if not tokens:
            raise ValueError(
                f"sample {sample.id!r} has no token records: run it with RunConfig(use_tito=True) "
                "on a token-exact provider (see rollouts.providers.tito)"
            )
        return replace(base, tokens=tokens, loss_mask=mask, rollout_logprobs=logprobs)


def token_view(trajectory: Trajectory) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """`(tokens, loss_mask, rollout_logprobs)` of a token-exact trajectory (empty if it has no
    token records). ValueError if a call's prompt does not extend the previous call's tokens."""
    records = [c.tokens for c in trajectory.completions if c.tokens is not None]
    if not records:
        return (), (), ()
    tokens: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for k, rec in enumerate(records):
        if tuple(rec.prompt_ids[: len(tokens)]) != tuple(tokens):
            raise ValueError(
                f"model call {k} of the trajectory does not extend the previous calls' tokens; "
                "it was not recorded token-exact"
            )
        extra = rec.prompt_ids[len(tokens) :]
        tokens.extend(extra)
        mask.extend([0] * len(extra))
        logprobs.extend([0.0] * len(extra))
        tokens.extend(rec.completion_ids)
        mask.extend([1] * len(rec.completion_ids))
        logprobs.extend(rec.logprobs)
    return tuple(tokens), tuple(mask), tuple(logprobs)


STD_EPS = 1e-4  # trl's: advantages are (r - mean) / (std + 1e-4)


def _std(values: Sequence[float]) -> float:
    """The unbiased (Bessel-corrected) standard deviation, as torch.std and trl compute it; 0.0
    for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def group_advantages(rewards: Sequence[float], *, scale: bool = True, std: float | None = None) -> list[float]:
    """GRPO advantages of one group: reward minus the group mean, divided by `std + 1e-4` when
    `scale` (`std` defaults to the group's unbiased standard deviation). A group whose rewards are
    all equal gets zeros."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    divisor = (_std(rewards) if std is None else std) + STD_EPS
    return [c / divisor for c in centred]


def with_group_advantages(
    samples: Sequence[TrainingSample], *, scale_rewards: str = "group", batch_rewards: Sequence[float] | None = None
) -> list[TrainingSample]:
    """`samples` with `advantage` set per group (`group_index`): reward minus the group's mean,
    divided by the group's ("group") or all trainable samples' ("batch") unbiased standard
    deviation + 1e-4, or not divided ("none"). Samples without tokens (failed rollouts) are left
    out of the statistics and get advantage 0. `batch_rewards`: the rewards the "batch" standard
    deviation is over when `samples` are one process's part of the step (default: theirs)."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be group, batch or none, got {scale_rewards!r}")
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(samples):
        if s.tokens:
            groups.setdefault(s.group_index, []).append(i)
    if batch_rewards is None:
        batch_rewards = [samples[i].reward for members in groups.values() for i in members]
    batch_std = _std(batch_rewards)
    out = [replace(s, advantage=0.0) for s in samples]
    for members in groups.values():
        rewards = [samples[i].reward for i in members]
        advs = group_advantages(
            rewards, scale=scale_rewards != "none", std=batch_std if scale_rewards == "batch" else None
        )
        for i, a in zip(members, advs, strict=True):
            out[i] = replace(out[i], advantage=a)
    return out
