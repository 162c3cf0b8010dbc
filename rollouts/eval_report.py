"""EvalReport: the outcome of evaluate(), and reading one back from its output_dir."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollouts.eval_io import REPORT_FILE, SAMPLES_FILE, read_json, read_sample_log
from rollouts.eval_summary import flat_summary, format_summary
from rollouts.scoring import Sample

ReportStatus = Literal["completed", "cancelled", "failed"]


@dataclass(frozen=True)
class EvalReport:
    """The outcome of `evaluate()`: every sample in dataset order and their summary.

    `status` is "completed", "cancelled" (Ctrl-C / cancellation: samples in flight are missing)
    or "failed" (the evaluation itself raised, e.g. a bad dataset line). `reused` counts samples
    taken from an earlier run in the same output_dir."""

    eval_name: str
    samples: tuple[Sample, ...]
    summary: Mapping[str, Any]
    config: Mapping[str, Any]
    status: ReportStatus = "completed"
    started_at: str = ""
    finished_at: str = ""
    duration_s: float = 0.0
    reused: int = 0
    error: str | None = None
    output_dir: str | None = None

    @property
    def summary_metrics(self) -> dict[str, float]:
        """A flat view: `mean_reward`, `<metric>_mean`, `n_completed`, `total_tokens`, ..."""
        return flat_summary(self.summary)

    @property
    def rewards(self) -> tuple[float, ...]:
        """Each sample's reward in dataset order (0.0 for unscored samples)."""
        return tuple(s.reward for s in self.samples)

    def get(self, sample_id: str) -> Sample | None:
        for s in self.samples:
            if s.id == sample_id:
                return s
        return None

    def format(self) -> str:
        """A short human-readable summary."""
        return f"{self.eval_name} [{self.status}] in {self.duration_s:.2f}s\n{format_summary(self.summary)}"

    def to_dict(self, include_samples: bool = False) -> dict[str, Any]:
        d: dict[str, Any] = {
            "eval_name": self.eval_name,
            "status": self.status,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_s": self.duration_s,
            "reused": self.reused,
            "error": self.error,
            "output_dir": self.output_dir,
            "config": dict(self.config),
            "summary": dict(self.summary),
            "sample_ids": [s.id for s in self.samples],
        }
        if include_samples:
            d["samples"] = [s.to_dict() for s in self.samples]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], samples: Iterable[Sample] = ()) -> EvalReport:
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
            error=data.get("error"),
            output_dir=data.get("output_dir"),
        )


def load_report(output_dir: str | Path) -> EvalReport:
    """Read `report.json` and the samples it lists (latest records) from `output_dir`."""
    out = Path(output_dir)
    data = read_json(out / REPORT_FILE)
    by_id = read_sample_log(out / SAMPLES_FILE)
    samples = tuple(by_id[i] for i in data.get("sample_ids", ()) if i in by_id)
    return EvalReport.from_dict(data, samples)
