"""Eval sets: every task x model pair into one directory, resumable as a whole, compared.

    tasks = [EvalTask("gsm8k", rows, EvalConfig(endpoint=..., score_fn=...)), EvalTask("arith", ...)]
    models = [Endpoint("openai", "gpt-4.1-mini"), Endpoint("anthropic", "claude-haiku-4-5")]
    result = await evaluate_set(tasks, models, "runs/compare", max_concurrent=32)
    print(result.format())                 # per task: each model's n, mean reward [95% CI], metrics

Each pair is one `evaluate()` of the task's config with the model's endpoint, in
`<output_dir>/<task>/<model>/` (its own samples.jsonl, report.json, epochs.jsonl). All pairs run
at once, and one limit is shared by all of them: at most `max_concurrent` samples run at a time
across the whole set (and as many model calls and tool runs). Running the same set again resumes
every pair in its directory, so only what is missing runs (a pair that had finished makes no
model call); a pair that fails (a bad key, a broken dataset) is recorded as failed in the index
and the others go on.

`<output_dir>/index.json` (written when the set starts, after each pair and at the end) holds
the tasks, the models, each pair's directory, status, error and summary, and the `comparison`:
per task, per model, `n` (scored samples; rows when the task has epochs > 1), `mean` reward,
`ci` (a percentile bootstrap interval on the mean: `bootstrap_samples` resamples of the units
with a fixed seed, so the same results give the same interval; past 20 million draws, i.e.
20,000 units at 1,000 resamples, the normal interval mean +- z*s/sqrt(n) it converges to, and
`ci_method` says which), the metrics' means and the epoch reducers. With epochs, the bootstrap resamples rows (each row's mean over its epochs), not
samples, as the epochs of one row are not independent.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError
from rollouts.eval.config import Dataset, EvalConfig
from rollouts.eval.epochs import split_epoch_id
from rollouts.eval.executor import InProcess
from rollouts.eval.io import SAMPLES_FILE, iter_sample_log, read_json, write_json_atomic
from rollouts.eval.report import EvalReport
from rollouts.eval.run import evaluate
from rollouts.eval.run_sample import error_text
from rollouts.run_config import RunConfig

__all__ = [
    "INDEX_FILE",
    "EvalSetResult",
    "EvalTask",
    "PairResult",
    "bootstrap_mean_interval",
    "evaluate_set",
    "model_label",
]

INDEX_FILE = "index.json"


@dataclass(frozen=True)
class EvalTask:
    """One task of a set: a name (its directory), its rows and the EvalConfig to run them with
    (its endpoint is replaced by each model's). `dataset` is read once per model, so it must be
    re-iterable (a list, a tuple) or a zero-argument function returning the rows."""

    name: str
    dataset: Dataset | Callable[[], Dataset]
    config: EvalConfig

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"EvalTask name {self.name!r} must be letters, digits, '.', '_' or '-' (it names a directory)"
            )

    def rows(self) -> Dataset:
        """The rows for one model (the function's result, or the dataset itself)."""
        return self.dataset() if callable(self.dataset) else self.dataset


_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def model_label(endpoint: Endpoint) -> str:
    """`provider/model`, as the index and the table name a model."""
    return f"{endpoint.provider}/{endpoint.model}"


def _model_dir(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:100] or "model"


@dataclass(frozen=True)
class PairResult:
    """One task x model evaluation of a set."""

    task: str
    model: str
    dir: str  # relative to the set's directory
    status: str  # "pending", "completed", "cancelled" or "failed"
    report: EvalReport | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "model": self.model,
            "dir": self.dir,
            "status": self.status,
            "error": self.error,
            "summary": dict(self.report.summary) if self.report is not None else None,
        }


@dataclass(frozen=True)
class EvalSetResult:
    """What `evaluate_set` returns: every pair, and the comparison (as in index.json)."""

    output_dir: str
    tasks: tuple[str, ...]
    models: tuple[str, ...]
    pairs: tuple[PairResult, ...]
    comparison: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    confidence: float = 0.95

    def pair(self, task: str, model: str) -> PairResult:
        return next(p for p in self.pairs if p.task == task and p.model == model)

    def format(self) -> str:
        """The comparison table, one block per task."""
        return format_comparison(self.comparison, self.confidence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "rollouts.eval_set",
            "version": 1,
            "tasks": list(self.tasks),
            "models": list(self.models),
            "confidence": self.confidence,
            "pairs": [p.to_dict() for p in self.pairs],
            "comparison": {t: dict(by_model) for t, by_model in self.comparison.items()},
        }


# ---- the interval -----------------------------------------------------------------------------


def bootstrap_mean_interval(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float] | None:
    """A percentile bootstrap interval on the mean of `values`: the mean of `resamples`
    resamples (with replacement, of the same size) drawn with a `seed`ed generator; the interval
    holds the central `confidence` of them. None for no values."""
    n = len(values)
    if n == 0:
        return None
    if not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"confidence must be in (0, 1) and resamples >= 1, got {confidence}, {resamples}")
    rng = random.Random(seed)
    data = list(values)
    means = sorted(math.fsum(rng.choices(data, k=n)) / n for _ in range(resamples))
    alpha = (1 - confidence) / 2
    lo = means[max(0, math.floor(alpha * resamples))]
    hi = means[min(resamples - 1, math.ceil((1 - alpha) * resamples) - 1)]
    return lo, hi


_MAX_DRAWS = 20_000_000  # resamples x units above which the normal interval is used (seconds of CPU)


def _normal(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """mean +- z * s / sqrt(n): what the bootstrap interval converges to for many units."""
    n = len(values)
    if n == 0:
        return None
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    return mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)


# ---- the set -------------------------------------------------------------------------------------


def _units(report: EvalReport, epochs: int) -> list[float]:
    """The rewards the interval is over: each scored sample's, or with epochs each row's mean.
    Read from the pair's samples.jsonl one record at a time (the latest record of each of the
    report's samples), so a big pair's trajectories are never all in memory."""
    wanted = set(report.ids)
    rewards: dict[str, float | None] = {}
    if report.output_dir is not None:
        for s in iter_sample_log(Path(report.output_dir) / SAMPLES_FILE):
            if s.id in wanted:
                rewards[s.id] = s.reward if s.score is not None else None
    else:
        rewards = {s.id: (s.reward if s.score is not None else None) for s in report.samples}
    scored = [(sid, r) for sid in report.ids if (r := rewards.get(sid)) is not None]
    if epochs <= 1:
        return [r for _, r in scored]
    rows: dict[str, list[float]] = {}
    for sid, r in scored:
        rows.setdefault(split_epoch_id(sid)[0], []).append(r)
    return [math.fsum(v) / len(v) for v in rows.values()]


def _compare(pair: PairResult, epochs: int, confidence: float, resamples: int, seed: int) -> dict[str, Any]:
    if pair.report is None:
        return {"status": pair.status, "error": pair.error, "n": 0, "mean": None, "ci": None, "metrics": {}}
    summary = pair.report.summary
    units = _units(pair.report, epochs)
    method = "bootstrap" if len(units) * resamples <= _MAX_DRAWS else "normal"
    ci = (
        bootstrap_mean_interval(units, confidence, resamples, seed)
        if method == "bootstrap"
        else _normal(units, confidence)
    )
    out: dict[str, Any] = {
        "status": pair.status,
        "error": pair.error,
        "n": len(units),
        "mean": math.fsum(units) / len(units) if units else None,
        "ci": list(ci) if ci is not None else None,
        "ci_method": method,
        "metrics": {name: st["mean"] for name, st in summary["metrics"].items()},
        "samples": summary["counts"]["total"],
        "failed": summary["counts"]["failed"] + summary["counts"]["provider_error"],
    }
    if "epochs" in summary:
        out["epochs"] = dict(summary["epochs"]["reducers"])
    return out


def _check_rows(tasks: Sequence[EvalTask], models: int) -> None:
    for t in tasks:
        d = t.dataset
        one_shot = not callable(d) and (hasattr(d, "__next__") or hasattr(d, "__anext__"))
        if one_shot and models > 1:
            raise ConfigurationError(
                f"task {t.name!r}: its dataset is an iterator, read once, but {models} models need it: "
                "give a list of rows or a function returning them"
            )


async def evaluate_set(
    tasks: Sequence[EvalTask],
    models: Sequence[Endpoint],
    output_dir: str | Path,
    *,
    max_concurrent: int = 8,
    confidence: float = 0.95,
    bootstrap_samples: int = 1000,
    seed: int = 0,
    on_pair_end: Callable[[PairResult], None] | None = None,
) -> EvalSetResult:
    """Evaluate every task with every model into `output_dir` (see the module docstring)."""
    if not tasks or not models:
        raise ConfigurationError("evaluate_set needs at least one task and one model")
    if max_concurrent < 1:
        raise ConfigurationError(f"evaluate_set: max_concurrent must be >= 1, got {max_concurrent}")
    names = [t.name for t in tasks]
    labels = [model_label(m) for m in models]
    for what, items in (("task names", names), ("models", labels)):
        if len(set(items)) != len(items):
            raise ConfigurationError(f"evaluate_set: {what} must be unique, got {items}")
    _check_rows(tasks, len(models))
    out = Path(output_dir)
    _prepare_dir(out)
    limiter = trio.CapacityLimiter(max_concurrent)
    shared = RunConfig(
        model_limiter=trio.CapacityLimiter(max_concurrent), tool_limiter=trio.CapacityLimiter(max_concurrent)
    )
    executor = InProcess(limiter=limiter)
    pairs: dict[tuple[str, str], PairResult] = {
        (t.name, label): PairResult(t.name, label, f"{t.name}/{_model_dir(label)}", "pending")
        for t in tasks
        for label in labels
    }
    epochs = {t.name: t.config.epochs for t in tasks}
    compared: dict[tuple[str, str], dict[str, Any]] = {}  # each pair's row, made once when it ends

    def result() -> EvalSetResult:
        comparison: dict[str, dict[str, Any]] = {}
        for key, p in pairs.items():
            row = compared.get(key) or _compare(p, epochs[key[0]], confidence, bootstrap_samples, seed)
            comparison.setdefault(key[0], {})[key[1]] = row
        return EvalSetResult(str(out), tuple(names), tuple(labels), tuple(pairs.values()), comparison, confidence)

    def write_index() -> None:
        write_json_atomic(
            out / INDEX_FILE, {**result().to_dict(), "bootstrap_samples": bootstrap_samples, "seed": seed}
        )

    async def run_pair(task: EvalTask, endpoint: Endpoint) -> None:
        label = model_label(endpoint)
        key = (task.name, label)
        base = task.config.run_config or RunConfig()
        config = replace(
            task.config,
            endpoint=endpoint,
            output_dir=out / pairs[key].dir,
            run_config=replace(base, model_limiter=shared.model_limiter, tool_limiter=shared.tool_limiter),
            max_concurrent=max_concurrent,
            show_progress=False,
        )
        try:
            report = await evaluate(task.rows(), config, executor=executor)
            pairs[key] = replace(pairs[key], status=report.status, report=report, error=report.error)
        except Exception as e:  # this pair only: the others go on
            pairs[key] = replace(pairs[key], status="failed", error=error_text("evaluate", e).splitlines()[0])
        # (reads the pair's samples.jsonl and resamples: off the event loop, the other pairs go on)
        compared[key] = await trio.to_thread.run_sync(
            _compare, pairs[key], epochs[task.name], confidence, bootstrap_samples, seed
        )
        write_index()
        if on_pair_end is not None:
            on_pair_end(pairs[key])

    write_index()
    try:
        async with trio.open_nursery() as nursery:
            for task in tasks:
                for endpoint in models:
                    nursery.start_soon(run_pair, task, endpoint)
    finally:
        write_index()  # (also when cancelled: what finished is in the index)
    return result()


def _prepare_dir(out: Path) -> None:
    """Make the set's directory; an index already there must be a set's (resuming may add tasks
    and models)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / INDEX_FILE
    if not path.exists():
        return
    try:
        data = read_json(path)
    except ValueError:
        return
    if not isinstance(data, Mapping) or data.get("kind") != "rollouts.eval_set":
        raise ConfigurationError(f"{str(path)!r} is not an eval set's index: use another output directory")


# ---- the table ----------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def format_comparison(comparison: Mapping[str, Mapping[str, Any]], confidence: float = 0.95) -> str:
    """Per task, one row per model: n, mean reward with its bootstrap interval, each metric's
    mean and the epoch reducers."""
    blocks = []
    for task, by_model in comparison.items():
        metric_names = sorted({m for c in by_model.values() for m in c.get("metrics", {})})
        reducer_names = list(dict.fromkeys(r for c in by_model.values() for r in c.get("epochs", {})))
        head = ["model", "n", "reward", f"{round(confidence * 100)}% CI", *metric_names, *reducer_names]
        rows = [head]
        for label, c in by_model.items():
            ci = c.get("ci")
            interval = f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-"
            if c.get("status") == "failed":
                interval = f"failed: {(c.get('error') or '')[:60]}"
            rows.append(
                [
                    label,
                    str(c.get("n", 0)),
                    _fmt(c.get("mean")),
                    interval,
                    *(_fmt(c.get("metrics", {}).get(m)) for m in metric_names),
                    *(_fmt(c.get("epochs", {}).get(r)) for r in reducer_names),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"task {task}"]
        for n, r in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
