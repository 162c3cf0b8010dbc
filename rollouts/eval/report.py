"""EvalReport: the outcome of evaluate(), and reading one back from its output_dir."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, overload

from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, read_json, read_sample_log
from rollouts.eval.sample import Sample
from rollouts.eval.summary import flat_summary, format_summary, summarize

ReportStatus = Literal["completed", "cancelled", "failed"]
T = TypeVar("T")


class _ComputedOnFirstRead(Generic[T]):
    """A dataclass field (data descriptor) whose value may be given as a zero-argument function,
    called on first read; left out, `default(report)` is used. evaluate() relies on it so a
    caller that never reads `summary` or `config` (GEPA evaluates thousands of 3-row
    minibatches) does not pay for them; report.json, which needs both, reads them at once.
    `samples` uses it too: a run with an output_dir hands a function reading samples.jsonl back,
    so the run itself never holds every trajectory."""

    def __init__(self, default: Callable[[EvalReport], T]) -> None:
        self._default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> None: ...

    @overload
    def __get__(self, obj: EvalReport, owner: type | None = None) -> T: ...

    def __get__(self, obj: EvalReport | None, owner: type | None = None) -> T | None:
        if obj is None:
            return None  # the dataclass default: "not given"
        value = obj.__dict__[self._name]
        if value is None:
            value = self._default(obj)
        elif callable(value):
            value = value()
        else:
            return value  # type: ignore[no-any-return]
        obj.__dict__[self._name] = value
        return value  # type: ignore[no-any-return]

    def __set__(self, obj: EvalReport, value: T | Callable[[], T] | None) -> None:
        obj.__dict__[self._name] = value


@dataclass(frozen=True)
class EvalReport:
    """The outcome of `evaluate()`: every sample in dataset order and their summary.

    `status` is "completed", "cancelled" (Ctrl-C / cancellation: samples in flight are missing)
    or "failed" (the evaluation itself raised, e.g. a bad dataset line). `reused` counts samples
    taken from an earlier run in the same output_dir.

    `summary` defaults to `summarize(samples)` and `config` to `{}`; these and `samples` may also
    be given as a zero-argument function, called the first time it is read (evaluate() with an
    output_dir reads the samples back from samples.jsonl that way)."""

    eval_name: str
    samples: _ComputedOnFirstRead[tuple[Sample, ...]] = _ComputedOnFirstRead(lambda report: ())
    summary: _ComputedOnFirstRead[Mapping[str, Any]] = _ComputedOnFirstRead(lambda report: summarize(report.samples))
    config: _ComputedOnFirstRead[Mapping[str, Any]] = _ComputedOnFirstRead(lambda report: {})
    status: ReportStatus = "completed"
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    reused: int = 0
    error: str | None = None
    output_dir: str | None = None
    sample_ids: Sequence[str] | None = None  # in dataset order (default: the samples' ids)
    rescored: int = 0  # recorded samples scored again (EvalConfig.rescore)

    @property
    def summary_metrics(self) -> dict[str, float]:
        """A flat view: `mean_reward`, `<metric>_mean`, `n_completed`, `total_tokens`, ..."""
        return flat_summary(self.summary)

    @property
    def ids(self) -> Sequence[str]:
        """The sample ids in dataset order (without reading the samples)."""
        return self.sample_ids if self.sample_ids is not None else tuple(s.id for s in self.samples)

    @property
    def rewards(self) -> tuple[float, ...]:
        """Each sample's reward in dataset order (0.0 for unscored samples)."""
        return tuple(s.reward for s in self.samples)

    def get(self, sample_id: str) -> Sample | None:
        """The sample with this id, or None."""
        for s in self.samples:
            if s.id == sample_id:
                return s
        return None

    def format(self) -> str:
        """A short human-readable summary."""
        return f"{self.eval_name} [{self.status}] in {self.duration_s:.2f}s\n{format_summary(self.summary)}"

    def to_dict(self, include_samples: bool = False, include_ids: bool = True) -> dict[str, Any]:
        """What report.json holds (sample ids only, unless `include_samples`; no ids either with
        `include_ids=False`)."""
        d: dict[str, Any] = {
            "eval_name": self.eval_name,
            "status": self.status,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "reused": self.reused,
            "rescored": self.rescored,
            "error": self.error,
            "output_dir": self.output_dir,
            "config": dict(self.config),
            "summary": dict(self.summary),
        }
        if include_ids:
            d["sample_ids"] = list(self.ids)
        if include_samples:
            d["samples"] = [s.to_dict() for s in self.samples]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], samples: Iterable[Sample] = ()) -> EvalReport:
        """A report from `to_dict()` output, with `samples` (else the dict's own `samples`)."""
        given = tuple(samples) or tuple(Sample.from_dict(s) for s in data.get("samples", ()))
        return cls(
            eval_name=data["eval_name"],
            samples=given,
            summary=data.get("summary", {}),
            config=data.get("config", {}),
            status=data.get("status", "completed"),
            started_at=data.get("started_at", ""),
            finished_at=data.get("finished_at", ""),
            duration_s=data.get("duration_s", 0.0),
            reused=data.get("reused", 0),
            rescored=data.get("rescored", 0),
            error=data.get("error"),
            output_dir=data.get("output_dir"),
        )


def read_samples(output_dir: str | Path, ids: Iterable[str]) -> tuple[Sample, ...]:
    """The latest recorded sample of each of `ids` (in that order) from output_dir's samples.jsonl."""
    by_id = read_sample_log(Path(output_dir) / SAMPLES_FILE)
    return tuple(by_id[i] for i in ids if i in by_id)


def load_report(output_dir: str | Path) -> EvalReport:
    """Read `report.json` and the samples it lists (latest records) from `output_dir`."""
    out = Path(output_dir)
    data = read_json(out / REPORT_FILE)
    return EvalReport.from_dict(data, read_samples(out, data.get("sample_ids", ())))
