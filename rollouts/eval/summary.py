"""Summaries of evaluated samples: per-metric statistics, reward, counts, tokens, cost, turns.

    summary = summarize(samples)
    summary["reward"]["mean"]            # mean reward over scored (completed) samples
    summary["metrics"]["correct"]["std"] # population std of one metric
    by_level = summarize_groups(samples, "level")   # group by an input field (or a function)

Statistics use the population standard deviation. Rewards and metrics are taken from samples
that were scored; `reward_all` also counts every unscored sample (failed, provider error) as 0.
`tokens` and `cost_usd` are the agents' own; what score functions spent on model calls (an LLM
judge's `judge_usage` metadata) is in `scoring`, and `total_cost_usd` is both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from rollouts.dtypes import Usage
from rollouts.eval.sample import Sample

GroupKey = str | Callable[[Sample], Hashable]


def stats(values: Sequence[float]) -> dict[str, float | int | None]:
    """`n`, `mean`, `min`, `max`, `std` (population) of `values`; None for an empty sequence."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "min": None, "max": None, "std": None}
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / n
    return {"n": n, "mean": mean, "min": min(values), "max": max(values), "std": math.sqrt(var)}


def sample_usage(sample: Sample) -> Usage:
    """Token usage and cost of one sample (from its trajectory, else its recorded metadata)."""
    if sample.trajectory is not None:
        return sample.trajectory.total_usage()
    recorded = sample.metadata.get("usage")
    return Usage.from_dict(recorded) if isinstance(recorded, Mapping) else Usage()


def sample_turns(sample: Sample) -> int:
    """Model turns the sample took (recorded metadata, else assistant messages counted)."""
    turns = sample.metadata.get("turns")
    if isinstance(turns, int):
        return turns
    if sample.trajectory is None:
        return 0
    return sum(1 for m in sample.trajectory.messages if m.role == "assistant")


def scoring_usage(sample: Sample) -> Usage:
    """Tokens and cost the score function spent on this sample (metrics' `judge_usage`)."""
    usage = Usage()
    if sample.score is not None:
        for m in sample.score.metrics:
            recorded = m.metadata.get("judge_usage")
            if isinstance(recorded, Mapping):
                usage = usage + Usage.from_dict(recorded)
    return usage


def summarize(samples: Iterable[Sample]) -> dict[str, Any]:
    """Aggregate statistics of `samples` (a JSON-safe dict). See the module docstring."""
    items = list(samples)
    counts = {"total": len(items), "completed": 0, "failed": 0, "provider_error": 0, "pending": 0}
    rewards: list[float] = []
    reward_all: list[float] = []
    metric_values: dict[str, list[float]] = {}
    stop_reasons: dict[str, int] = {}
    turns: list[float] = []
    durations: list[float] = []
    usage = Usage()
    scoring = Usage()
    for s in items:
        counts[s.status] = counts.get(s.status, 0) + 1
        if s.stop_reason:
            stop_reasons[s.stop_reason] = stop_reasons.get(s.stop_reason, 0) + 1
        if s.score is not None:
            rewards.append(s.score.reward)
            judged = False
            for m in s.score.metrics:
                metric_values.setdefault(m.name, []).append(float(m.value))
                judged = judged or "judge_usage" in m.metadata
            if judged:
                scoring = scoring + scoring_usage(s)
        reward_all.append(s.score.reward if s.score is not None else 0.0)
        usage = usage + sample_usage(s)
        turns.append(float(sample_turns(s)))
        duration = s.metadata.get("duration_s")
        if isinstance(duration, int | float):
            durations.append(float(duration))
    return {
        "counts": counts,
        "reward": stats(rewards),
        "reward_all": stats(reward_all),
        "metrics": {name: stats(vals) for name, vals in sorted(metric_values.items())},
        "tokens": {
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "cache_read": usage.cache_read_tokens,
            "cache_write": usage.cache_write_tokens,
            "reasoning": usage.reasoning_tokens,
            "total": usage.total_tokens,
        },
        "cost_usd": usage.cost_usd,
        "scoring": {
            "input_tokens": scoring.input_tokens,
            "output_tokens": scoring.output_tokens,
            "total_tokens": scoring.total_tokens,
            "cost_usd": scoring.cost_usd,
        },
        "total_cost_usd": usage.cost_usd + scoring.cost_usd,
        "turns": {**stats(turns), "total": int(sum(turns))},
        "duration_s": stats(durations),
        "stop_reasons": dict(sorted(stop_reasons.items())),
    }


def flat_summary(summary: Mapping[str, Any]) -> dict[str, float]:
    """A flat `name -> number` view of a summary: `mean_reward`, `<metric>_mean`, counts, tokens..."""
    out: dict[str, float] = {}
    for key, value in summary["counts"].items():
        out[f"n_{key}"] = value
    for stat in ("mean", "min", "max", "std"):
        if summary["reward"][stat] is not None:
            out[f"{stat}_reward"] = summary["reward"][stat]
    for name, st in summary["metrics"].items():
        for stat in ("mean", "min", "max", "std"):
            if st[stat] is not None:
                out[f"{name}_{stat}"] = st[stat]
    out["total_tokens"] = summary["tokens"]["total"]
    out["cost_usd"] = summary["cost_usd"]
    if summary["turns"]["mean"] is not None:
        out["mean_turns"] = summary["turns"]["mean"]
    return out


def _key_fn(key: GroupKey) -> Callable[[Sample], Hashable]:
    if callable(key):
        return key
    field_name = key

    def by_field(sample: Sample) -> Hashable:
        value = sample.input.get(field_name)
        return value if isinstance(value, Hashable) else repr(value)

    return by_field


def group_samples(samples: Iterable[Sample], key: GroupKey) -> dict[Hashable, list[Sample]]:
    """Samples grouped by an input field name or by `key(sample)`, groups in first-seen order."""
    fn = _key_fn(key)
    groups: dict[Hashable, list[Sample]] = {}
    for s in samples:
        groups.setdefault(fn(s), []).append(s)
    return groups


def summarize_groups(samples: Iterable[Sample], key: GroupKey) -> dict[Hashable, dict[str, Any]]:
    """`summarize()` of each group of `group_samples(samples, key)`."""
    return {k: summarize(v) for k, v in group_samples(samples, key).items()}


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few human-readable lines."""
    c = summary["counts"]
    r = summary["reward"]
    lines = [
        f"samples: {c['total']} (completed {c['completed']}, failed {c['failed']}, "
        f"provider errors {c['provider_error']})",
    ]
    if r["mean"] is not None:
        lines.append(f"reward: mean {r['mean']:.4f}  min {r['min']:.4f}  max {r['max']:.4f}  std {r['std']:.4f}")
    for name, st in summary["metrics"].items():
        if st["mean"] is not None:
            lines.append(
                f"  {name}: mean {st['mean']:.4f}  min {st['min']:.4f}  max {st['max']:.4f}  std {st['std']:.4f}"
            )
    t = summary["tokens"]
    lines.append(f"tokens: {t['total']} (in {t['input']}, out {t['output']})  cost ${summary['cost_usd']:.4f}")
    scoring = summary.get("scoring") or {}
    if scoring.get("total_tokens"):
        lines.append(f"scoring (judge): tokens {scoring['total_tokens']}  cost ${scoring['cost_usd']:.4f}")
    if summary["turns"]["mean"] is not None:
        lines.append(f"turns per sample: mean {summary['turns']['mean']:.2f}, max {summary['turns']['max']:.0f}")
    return "\n".join(lines)
