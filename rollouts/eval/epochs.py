"""Epochs: every row run k times, and reducers that combine a row's k samples.

    config = EvalConfig(endpoint, score_fn=..., epochs=5, pass_at=(1, 5), output_dir="runs/he")
    report = await evaluate(rows, config)
    report.summary["epochs"]["reducers"]      # {"mean": .., "max": .., "majority": .., "pass@1": .., "pass@5": ..}

With `EvalConfig.epochs = k > 1` each row becomes k samples with ids `<row id>#1` ... `<row id>#k`
(the row's own id, or its index), run like any others (concurrently, each recorded as it
finishes), so a killed run resumes per sample: a rerun runs only the epochs that are missing,
failed or hit a provider error. Going from k to more epochs reuses the first k.

Per row, over its scored epochs (samples that completed or failed; provider errors are not
attempts of the model and are left out):

* `mean` — the mean reward;
* `max` — the best reward;
* `majority` — majority vote over the extracted answer (`EvalConfig.answer_fn(sample)`, by
  default the stripped response text; samples with no answer do not vote): the row scores the
  reward of the first epoch giving the winning answer. Ties go to the answer that was given
  first (lowest epoch number), so the result does not depend on the order samples finished in;
* `pass@k` for each k of `EvalConfig.pass_at` (default: 1 and `epochs`) — the unbiased estimator of
  Chen et al. 2021 ("Evaluating Large Language Models Trained on Code"): with n scored epochs of
  which c passed (reward >= `EvalConfig.pass_threshold`, default 1.0),
  pass@k = 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1..n} (1 - k/i). A row with
  fewer than k scored epochs has no pass@k (counted in `rows_per_k`).

`summary["epochs"]` holds the means of these over the rows (`reducers`), how many rows each
covers, and the settings; `epochs.jsonl` in the output directory holds one line per row
(`row`, `n`, `correct`, `rewards` by epoch, `answers`, `majority_answer`, and the row's reducers)
for viewers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollouts.eval.io import dumps_json
from rollouts.eval.sample import Sample
from rollouts.eval.summary import summarize
from rollouts.redaction import redact_json

if TYPE_CHECKING:
    from rollouts.eval.config import EvalConfig

__all__ = [
    "EPOCHS_FILE",
    "EpochReducer",
    "EpochRow",
    "default_answer",
    "epoch_reducer",
    "epoch_rows",
    "epoch_sample_id",
    "majority_vote",
    "pass_at_k",
    "split_epoch_id",
    "tag_answer",
    "with_epochs",
    "write_epochs",
]

EPOCHS_FILE = "epochs.jsonl"

AnswerFn = Callable[[Sample], "str | None"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n samples of which c are correct (Chen et al. 2021):
    1 - C(n-c, k) / C(n, k). ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """The index of the first occurrence of the most frequent non-None answer (ties: the answer
    that occurs first wins); None when there is no answer."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, i)
    if not counts:
        return None
    best = max(counts.values())
    return min(first[a] for a, n in counts.items() if n == best)


def default_answer(sample: Sample) -> str | None:
    """The sample's response with whitespace collapsed (None when it is empty)."""
    text = " ".join(sample.response.split())
    return text or None


def tag_answer(tag: str) -> AnswerFn:
    """An `answer_fn`: the stripped text of the last `<tag>...</tag>` of the response (None if absent)."""
    from rollouts.eval.scorers import extract_tag

    extract = extract_tag(tag)

    def answer(sample: Sample) -> str | None:
        return extract(sample.response)

    answer.__qualname__ = f"tag_answer({tag!r})"
    return answer


# ---- ids ------------------------------------------------------------------------------------


def epoch_sample_id(row_id: str, epoch: int) -> str:
    """The sample id of `row_id`'s epoch `epoch` (1-based): `row_id#epoch`."""
    return f"{row_id}#{epoch}"


def split_epoch_id(sample_id: str) -> tuple[str, int]:
    """`(row id, epoch)` of a sample id made by `epoch_sample_id`."""
    row, sep, epoch = sample_id.rpartition("#")
    if not sep or not epoch.isdigit():
        raise ValueError(f"{sample_id!r} is not an epoch sample id (row#epoch)")
    return row, int(epoch)


class EpochRow(dict[str, Any]):
    """A dataset row as one epoch of it: the row's own fields (so prepare_messages, scorers,
    fingerprints and samples.jsonl see exactly the row), plus the sample id it runs under."""

    __slots__ = ("epoch", "sample_id")

    def __init__(self, row: Mapping[str, Any], sample_id: str, epoch: int) -> None:
        super().__init__(row)
        self.sample_id = sample_id
        self.epoch = epoch


def _row_id(row: Any, index: int) -> str:
    rid = row.get("id") if isinstance(row, Mapping) else None
    return str(rid) if rid is not None and rid != "" else str(index)


def _expand(row: Any, index: int, epochs: int) -> Iterator[Any]:
    if not isinstance(row, Mapping):  # (evaluate() reports the bad row)
        yield row
        return
    rid = _row_id(row, index)
    for e in range(1, epochs + 1):
        yield EpochRow(row, epoch_sample_id(rid, e), e)


def epoch_rows(dataset: Any, epochs: int, max_rows: int | None) -> Any:
    """`dataset` (sync or async iterable of rows) with each of its first `max_rows` rows repeated
    `epochs` times as `EpochRow`s, read lazily."""
    if hasattr(dataset, "__aiter__"):

        async def agen() -> Any:
            index = 0
            async for row in dataset:
                if max_rows is not None and index >= max_rows:
                    return
                for r in _expand(row, index, epochs):
                    yield r
                index += 1

        return agen()

    def gen() -> Iterator[Any]:
        for index, row in enumerate(dataset):
            if max_rows is not None and index >= max_rows:
                return
            yield from _expand(row, index, epochs)

    return gen()


# ---- reducers -------------------------------------------------------------------------------


class _RowEpochs:
    __slots__ = ("answers", "rewards")

    def __init__(self) -> None:
        self.rewards: dict[int, float] = {}  # epoch -> reward, scored epochs only
        self.answers: dict[int, str | None] = {}


class EpochReducer:
    """Collects each row's epochs as samples are recorded (in any order; a sample recorded again
    replaces its earlier record) and reduces them (see the module docstring)."""

    def __init__(
        self,
        epochs: int,
        pass_at: Sequence[int],
        pass_threshold: float = 1.0,
        answer_fn: AnswerFn | None = None,
    ) -> None:
        self.epochs = epochs
        self.pass_at = tuple(pass_at)
        self.pass_threshold = pass_threshold
        self.answer_fn = answer_fn or default_answer
        self._rows: dict[str, _RowEpochs] = {}

    def add(self, sample: Sample) -> None:
        """Count one recorded sample (its id must be an epoch id)."""
        row, epoch = split_epoch_id(sample.id)
        entry = self._rows.get(row)
        if entry is None:
            entry = self._rows[row] = _RowEpochs()
        if sample.status in ("completed", "failed"):
            entry.rewards[epoch] = sample.reward
            entry.answers[epoch] = self.answer_fn(sample) if sample.status == "completed" else None
        else:  # a provider error (or pending): not an attempt of the model
            entry.rewards.pop(epoch, None)
            entry.answers.pop(epoch, None)

    def row_result(self, row: str) -> dict[str, Any]:
        """One row's reductions (as written to epochs.jsonl)."""
        entry = self._rows[row]
        epochs = sorted(entry.rewards)
        rewards = [entry.rewards[e] for e in epochs]
        answers = [entry.answers.get(e) for e in epochs]
        n = len(rewards)
        c = sum(1 for r in rewards if r >= self.pass_threshold)
        out: dict[str, Any] = {
            "row": row,
            "n": n,
            "correct": c,
            "rewards": {str(e): r for e, r in zip(epochs, rewards, strict=True)},
            "answers": {str(e): a for e, a in zip(epochs, answers, strict=True)},
        }
        if n == 0:
            return out
        winner = majority_vote(answers)
        out["mean"] = math.fsum(rewards) / n
        out["max"] = max(rewards)
        out["majority_answer"] = answers[winner] if winner is not None else None
        out["majority"] = rewards[winner] if winner is not None else 0.0
        for k in self.pass_at:
            if k <= n:
                out[f"pass@{k}"] = pass_at_k(n, c, k)
        return out

    def rows(self) -> Iterable[dict[str, Any]]:
        """Every row's reductions, in the order rows were first seen."""
        return (self.row_result(r) for r in self._rows)

    def result(self) -> dict[str, Any]:
        """The summary: each reducer's mean over the rows it covers (see the module docstring)."""
        names = ["mean", "max", "majority", *(f"pass@{k}" for k in self.pass_at)]
        values: dict[str, list[float]] = {n: [] for n in names}
        complete = 0
        for r in self.rows():
            complete += r["n"] >= self.epochs
            for name in names:
                if name in r:
                    values[name].append(r[name])
        counts = {n: len(v) for n, v in values.items()}
        return {
            "epochs": self.epochs,
            "rows": len(self._rows),
            "complete_rows": complete,
            "pass_at": list(self.pass_at),
            "pass_threshold": self.pass_threshold,
            "reducers": {n: (math.fsum(v) / len(v) if v else None) for n, v in values.items()},
            "rows_per_reducer": counts,
        }


# ---- in evaluate() --------------------------------------------------------------------------


def epoch_reducer(config: EvalConfig) -> EpochReducer | None:
    """The reducer for `config`'s epochs (None for a single epoch)."""
    if config.epochs <= 1:
        return None
    return EpochReducer(config.epochs, config.pass_at_k, config.pass_threshold, config.answer_fn)


def with_epochs(summary: Mapping[str, Any] | None, samples: Any, reducer: EpochReducer) -> Any:
    """The run's summary with `epochs` added (a function computing both, when the summary is
    computed from kept samples on first read)."""
    if summary is None:
        return lambda: {**summarize(samples), "epochs": reducer.result()}
    return {**summary, "epochs": reducer.result()}


def write_epochs(out: Path, reducer: EpochReducer) -> None:
    """`epochs.jsonl`: one line per row (atomically replaced; known secrets masked)."""
    path = out / EPOCHS_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for row in reducer.rows():
                f.write(redact_json(dumps_json(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
