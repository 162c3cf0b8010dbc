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
from fractions import Fraction
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


def _add_exact(partials: list[float], x: float) -> None:
    """Add `x` to the exact sum held in `partials` (non-overlapping floats: Shewchuk's
    algorithm, what math.fsum does over a whole sequence). The sum they hold is exact, so it
    is the same whatever order the values came in."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


_SPLIT = 134217729.0  # 2**27 + 1 (Veltkamp's split of a double into two halves)


def _square(v: float) -> tuple[float, float]:
    """v*v as hi + lo exactly (Dekker's product)."""
    hi = v * v
    t = _SPLIT * v
    vh = t - (t - v)
    vl = v - vh
    return hi, ((vh * vh - hi) + 2.0 * vh * vl) + vl * vl


def _exact(partials: list[float]) -> Fraction:
    return sum(map(Fraction, partials), Fraction(0))


class RunningStats:
    """`n`, mean, min, max and population std of a stream of numbers in constant memory, the
    same whatever order the numbers come in (evaluate() adds samples as they finish: with
    workers, in a different order each run; a running update such as Welford's differs in its
    last digits from one order to another). The sum and the sum of squares are kept exactly
    (a few floats each, see `_add_exact`, `_square`); the statistics are computed from them
    exactly and rounded once."""

    __slots__ = ("_nonfinite", "_squares", "_squares_overflow", "_sum", "max", "min", "n")

    def __init__(self) -> None:
        self.n = 0
        self._sum: list[float] = []
        self._squares: list[float] = []
        self._nonfinite = 0.0  # inf and nan added (then the mean and std are inf or nan)
        self._squares_overflow = False
        self.min = math.inf
        self.max = -math.inf

    def add(self, v: float) -> None:
        self.n += 1
        if not math.isfinite(v):
            self._nonfinite += v
        else:
            _add_exact(self._sum, v)
            hi, lo = _square(v)
            if not math.isfinite(hi):  # (a square beyond the floats: the std is too)
                self._squares_overflow = True
            else:
                _add_exact(self._squares, hi)
                if lo:
                    _add_exact(self._squares, lo)
        self.min = v if v < self.min else self.min
        self.max = v if v > self.max else self.max

    @property
    def total(self) -> float:
        return math.fsum(self._sum) + self._nonfinite

    def to_dict(self) -> dict[str, float | int | None]:
        if self.n == 0:
            return {"n": 0, "mean": None, "min": None, "max": None, "std": None}
        if self._nonfinite != 0.0 or math.isnan(self._nonfinite):
            return {"n": self.n, "mean": self.total / self.n, "min": self.min, "max": self.max, "std": math.nan}
        total = _exact(self._sum)
        if self._squares_overflow:
            std = math.inf
        else:
            std = math.sqrt(float((_exact(self._squares) - total * total / self.n) / self.n))
        return {"n": self.n, "mean": float(total / self.n), "min": self.min, "max": self.max, "std": std}


def finished_count(summary: Mapping[str, Any]) -> int:
    """Completed samples whose run ended the task itself: not those whose metadata says
    `unfinished` (a limit stopped them, or they had tools and ended in text: run_sample's
    `unfinished_stop`). Such a sample is "completed" (it ran and was scored) but the eval table
    counts it apart."""
    unfinished: Mapping[str, int] = summary.get("unfinished") or {}
    return int(summary["counts"]["completed"]) - sum(unfinished.values())


def unfinished_text(summary: Mapping[str, Any]) -> str:
    """`, max_turns 1, no_tool_called 2` (the completed samples that ended early), or ''."""
    return "".join(f", {reason} {n}" for reason, n in (summary.get("unfinished") or {}).items())


class SummaryBuilder:
    """`summarize()` one sample at a time, in memory that does not grow with the samples
    (evaluate() keeps one while a run goes, so a 100,000-row run needs no list of samples)."""

    def __init__(self) -> None:
        self.counts = {"total": 0, "completed": 0, "failed": 0, "provider_error": 0, "pending": 0}
        self.rewards = RunningStats()
        self.reward_all = RunningStats()
        self.metrics: dict[str, RunningStats] = {}
        self.stop_reasons: dict[str, int] = {}
        self.unfinished: dict[str, int] = {}  # completed samples whose run ended before the task did
        self.turns = RunningStats()
        self.durations = RunningStats()
        self.usage = Usage()
        self.scoring = Usage()

    def add(self, s: Sample) -> None:
        """Count one sample."""
        self.counts["total"] += 1
        self.counts[s.status] = self.counts.get(s.status, 0) + 1
        if s.stop_reason:
            self.stop_reasons[s.stop_reason] = self.stop_reasons.get(s.stop_reason, 0) + 1
        early = s.metadata.get("unfinished")
        if s.status == "completed" and isinstance(early, str):
            self.unfinished[early] = self.unfinished.get(early, 0) + 1
        if s.score is not None:
            self.rewards.add(s.score.reward)
            judged = False
            for m in s.score.metrics:
                stats_of = self.metrics.get(m.name)
                if stats_of is None:
                    stats_of = self.metrics[m.name] = RunningStats()
                stats_of.add(float(m.value))
                judged = judged or "judge_usage" in m.metadata
            if judged:
                self.scoring = self.scoring + scoring_usage(s)
        self.reward_all.add(s.score.reward if s.score is not None else 0.0)
        self.usage = self.usage + sample_usage(s)
        self.turns.add(float(sample_turns(s)))
        duration = s.metadata.get("duration_s")
        if isinstance(duration, int | float):
            self.durations.add(float(duration))

    def result(self) -> dict[str, Any]:
        """The summary so far (a JSON-safe dict). See the module docstring."""
        usage, scoring = self.usage, self.scoring
        return {
            "counts": dict(self.counts),
            "reward": self.rewards.to_dict(),
            "reward_all": self.reward_all.to_dict(),
            "metrics": {name: st.to_dict() for name, st in sorted(self.metrics.items())},
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
            "turns": {**self.turns.to_dict(), "total": int(self.turns.total)},
            "duration_s": self.durations.to_dict(),
            "stop_reasons": dict(sorted(self.stop_reasons.items())),
            "unfinished": dict(sorted(self.unfinished.items())),
        }


def summarize(samples: Iterable[Sample]) -> dict[str, Any]:
    """Aggregate statistics of `samples` (a JSON-safe dict). See the module docstring."""
    builder = SummaryBuilder()
    for s in samples:
        builder.add(s)
    return builder.result()


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
        f"samples: {c['total']} (completed {finished_count(summary)}{unfinished_text(summary)}, "
        f"failed {c['failed']}, provider errors {c['provider_error']})",
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
