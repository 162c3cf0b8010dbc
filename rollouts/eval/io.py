"""Files of an evaluation: dataset loaders, the append-only samples log, the atomic report.

* `load_jsonl` / `load_csv` stream rows one at a time (never the whole file in memory).
* `SampleLog` appends one finished `Sample` per line to `samples.jsonl` and flushes it, so a
  crash loses at most the line being written; `read_sample_log` reads it back (last record per
  id wins; a torn final line from a crash is ignored).
* `write_json_atomic` writes through a temporary file and `os.replace`, so a reader never sees
  a half-written `report.json`.
* Every record is written through `rollouts.redaction.redact_json` (known secret values masked);
  `redact_secrets` (re-exported from there) is for configuration-like records.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from rollouts._unicode import escape_lone_surrogates
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Sample
from rollouts.redaction import redact_json
from rollouts.redaction import redact_secrets as redact_secrets  # (its former home)

SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.json"


# --------------------------------------------------------------------------------------------
# Dataset loaders
# --------------------------------------------------------------------------------------------


def load_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield one dict per non-empty line of a JSONL file, lazily.

    Raises ConfigurationError naming `file:line` for a line that is not a JSON object."""
    p = Path(path)
    if not p.is_file():
        raise ConfigurationError(f"dataset file {str(p)!r} does not exist")
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigurationError(f"{p}:{lineno}: not valid JSON ({e.msg}); each line must be one object") from e
            if not isinstance(row, dict):
                raise ConfigurationError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield row


def load_csv(path: str | Path, **reader_kwargs: Any) -> Iterator[dict[str, Any]]:
    """Yield one dict per CSV row (keys from the header line), lazily. Values stay strings.

    `reader_kwargs` go to `csv.DictReader` (e.g. `delimiter="\\t"`)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigurationError(f"dataset file {str(p)!r} does not exist")
    with p.open(encoding="utf-8", newline="") as f:
        yield from csv.DictReader(f, **reader_kwargs)


# --------------------------------------------------------------------------------------------
# samples.jsonl
# --------------------------------------------------------------------------------------------


def dumps_json(data: Any, **kwargs: Any) -> str:
    """`json.dumps` that always writes valid JSON: values JSON cannot encode become strings and
    NaN/Infinity (which `json` would write as bare, invalid tokens) become null. (A Metric
    refuses a non-finite value, so this only concerns free-form metadata.)"""
    kwargs.setdefault("ensure_ascii", False)
    try:
        return json.dumps(data, allow_nan=False, default=str, **kwargs)
    except ValueError:
        return json.dumps(finite_json(data), allow_nan=False, default=str, **kwargs)


def finite_json(value: Any) -> Any:
    """A copy of `value` with NaN and infinite floats replaced by None (recursing into dicts/lists)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def row_json(row: Mapping[str, Any]) -> Any:
    """A dataset row as samples.jsonl stores it (and resume compares it): NaN and infinities as
    null, values JSON cannot hold as their text (`str`), lone surrogates kept (written as JSON
    escapes). A row JSON cannot hold at all (a tuple key, a cycle) is stored as its `repr`."""
    try:
        return json.loads(escape_lone_surrogates(dumps_json(dict(row))))
    except (TypeError, ValueError, RecursionError):
        return {"unstorable_row": repr(row)}


def sample_to_line(sample: Sample) -> str:
    """One JSON line (with trailing newline), always valid JSON (see `dumps_json`), any text kept
    (lone surrogates as escapes), the row as `row_json` stores it, known secrets masked. Raises
    (TypeError, ValueError) only for a trajectory, score or metadata JSON cannot hold."""
    data = sample.to_dict()
    data["input"] = row_json(sample.input)
    return escape_lone_surrogates(redact_json(dumps_json(data, separators=(",", ":")))) + "\n"


def recordable(sample: Sample) -> tuple[Sample, str]:
    """`sample` and its samples.jsonl line; if the sample cannot be written (its trajectory,
    score or metadata hold something JSON cannot), that sample failed, naming why: a failure
    marks only its own sample."""
    try:
        return sample, sample_to_line(sample)
    except (TypeError, ValueError, RecursionError) as e:
        failed = Sample(
            id=sample.id,
            input=sample.input,
            status="failed",
            error=f"recording the sample: {type(e).__name__}: {e}",
            stop_reason=sample.stop_reason,
            fingerprint=sample.fingerprint,
        )
        return failed, sample_to_line(failed)


class SampleLog:
    """Appends finished samples to `samples.jsonl`, one flushed line each."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            _drop_torn_tail(self.path)  # a crash mid-write left half a line: that sample reruns
        self._f: IO[str] | None = self.path.open("a", encoding="utf-8")
        self.written = 0

    def write(self, sample: Sample) -> Sample:
        """Append `sample`; returns it as recorded (failed, naming why, if it cannot be written:
        see `recordable`)."""
        assert self._f is not None, "SampleLog.write after close"
        sample, line = recordable(sample)
        self._f.write(line)
        self._f.flush()
        self.written += 1
        return sample

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()


def _drop_torn_tail(path: Path, chunk: int = 1 << 16) -> None:
    """Truncate `path` after its last newline (removing a partial last line, if any)."""
    with path.open("r+b") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            block = f.read(pos - start)
            nl = block.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            pos = start
        else:
            cut = 0
        if cut != end:
            f.truncate(cut)


def iter_sample_log(path: str | Path) -> Iterator[Sample]:
    """Every record in a samples log, in write order. A torn last line (crash mid-write) is
    skipped; a bad line elsewhere raises ValueError naming `file:line`."""
    p = Path(path)
    if not p.exists():
        return
    with p.open(encoding="utf-8") as f:
        pending: tuple[int, str] | None = None
        for lineno, line in enumerate(f, 1):
            if pending is not None:
                yield _parse_sample_line(p, *pending)
            pending = (lineno, line) if line.strip() else None
        # Every record is written with its newline in one write, so a last line without one was
        # torn by a crash mid-write: it is skipped (and SampleLog truncates it); that sample reruns.
        if pending is not None and pending[1].endswith("\n"):
            yield _parse_sample_line(p, *pending)


def _parse_sample_line(path: Path, lineno: int, line: str) -> Sample:
    try:
        return Sample.from_dict(json.loads(line))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}:{lineno}: not a sample record: {e}") from e


def read_sample_log(path: str | Path) -> dict[str, Sample]:
    """The latest record of each sample id in a samples log (later lines win)."""
    return {s.id: s for s in iter_sample_log(path)}


# --------------------------------------------------------------------------------------------
# report.json
# --------------------------------------------------------------------------------------------


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as pretty JSON to `path` atomically (temp file + fsync + os.replace), known
    secrets masked."""
    text = escape_lone_surrogates(redact_json(dumps_json(data, indent=2)))  # NaN as null, secrets masked
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()


class StreamedList(list):  # type: ignore[type-arg]
    """A list `json.dump` writes item by item from `items` (re-iterable), without holding them:
    report.json's 100,000 sample ids need not be a 100,000-string list at the end of a run.
    Only for writing (it compares as an empty list)."""

    def __init__(self, items: Any) -> None:
        super().__init__()
        self._items = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return len(self._items) > 0


def read_json(path: str | Path) -> Any:
    """The JSON value in the file at `path`."""
    with Path(path).open(encoding="utf-8") as f:
        return json.load(f)
