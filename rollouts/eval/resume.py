"""Resuming an evaluation in its output_dir: which recorded samples may be reused, and a clear
error when they were made under other settings.

A recorded sample is reused only when it completed, its input is the row's, and its fingerprint
(rollouts.eval.fingerprint) matches the current one part for part. When only the score function
differs, `EvalConfig.rescore` re-scores the recorded trajectory instead; any other difference
is a ConfigurationError naming what changed and the ways out. `EvalConfig.overwrite` deletes
the previous results first.

The index holds, per recorded sample, only its file offset, input digest and fingerprint (not
its trajectory), so resuming a 100,000-sample run does not load 100,000 trajectories: a reused
sample is read back from its line when its row comes up.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from rollouts.errors import ConfigurationError
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.epochs import EPOCHS_FILE
from rollouts.eval.fingerprint import Fingerprint, describe_parts
from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, read_json, row_json
from rollouts.eval.sample import Sample

__all__ = ["Decision", "PreviousSamples", "ResumeMismatch", "check_report", "input_digest", "remove_previous"]

Decision = Literal["run", "reuse", "rescore"]


class ResumeMismatch(ConfigurationError):
    """Recorded samples were made under other settings than the current ones."""


def input_digest(row: Mapping[str, Any]) -> bytes:
    """A digest of a row as it is written to samples.jsonl (`row_json`), so the row of a recorded
    sample read back compares equal to the dataset's row it was made from: NaN (written as null),
    values JSON cannot hold (written as text) and lone surrogates (written as escapes) included."""
    data = row_json(row)
    text = json.dumps(data, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).digest()[:12]


def remove_previous(out: Path) -> None:
    """Delete the results of an earlier run in `out` (EvalConfig.overwrite)."""
    for name in (SAMPLES_FILE, REPORT_FILE, EPOCHS_FILE):
        (out / name).unlink(missing_ok=True)


def _ways_out(out: Path, parts: list[str]) -> str:
    rescore = (
        "rescore=True (--rescore) keeps the trajectories and runs only the new score function, or "
        if parts == ["score_fn"]
        else ""
    )
    return (
        f"use another output_dir (a new directory; the CLI's default directory name already differs per "
        f"setting), or choose explicitly: {rescore}overwrite=True (--overwrite) deletes the results in "
        f"{str(out)!r} and starts over"
    )


def mismatch_error(out: Path, parts: list[str], where: str) -> ResumeMismatch:
    return ResumeMismatch(
        f"output_dir {str(out)!r} holds {where} made with different {describe_parts(parts)}; reusing them "
        f"would mix results of two settings. To go on, {_ways_out(out, parts)}"
    )


def check_report(out: Path, config: EvalConfig) -> None:
    """Refuse at once an output_dir whose report.json names another eval, model or setting."""
    report = out / REPORT_FILE
    if not report.exists():
        return
    try:
        previous = read_json(report)
    except ValueError:
        return  # unreadable report: samples.jsonl is the source of truth
    name = previous.get("eval_name")  # (kept: an eval's name is part of what a directory holds)
    if name is not None and name != config.eval_name:
        raise ConfigurationError(
            f"output_dir {str(out)!r} holds results of eval {name!r}, not {config.eval_name!r}: "
            "use the same eval_name to resume it, or another output_dir"
        )
    prev_config = previous.get("config", {})
    prev_ep = prev_config.get("endpoint", {})
    for key in ("provider", "model"):
        if key in prev_ep and prev_ep[key] != getattr(config.endpoint, key):
            raise ResumeMismatch(
                f"output_dir {str(out)!r} holds results for {key} {prev_ep[key]!r}, not "
                f"{getattr(config.endpoint, key)!r}: use another output_dir for a different model, "
                "or overwrite=True (--overwrite) to start over"
            )
    recorded = prev_config.get("fingerprint")
    if isinstance(recorded, Mapping):
        try:
            parts = config.fingerprint.differences(Fingerprint.from_dict(recorded))
        except (KeyError, TypeError, ValueError):
            return
        # Only the scorer differs: whether rescoring is possible (same messages too) is decided
        # per sample, where the prepared messages are known.
        if parts and parts != ["score_fn"]:
            raise mismatch_error(out, parts, "results")


class _Recorded:
    """One recorded sample in the index: small (slots, a 12-byte input digest, the task-level
    fingerprint shared between records), so resuming 100,000 samples stays cheap."""

    __slots__ = ("fingerprint", "input", "messages", "offset")

    def __init__(self, offset: int, input: bytes, fingerprint: Fingerprint | None, messages: str | None) -> None:
        self.offset = offset
        self.input = input
        self.fingerprint = fingerprint  # task level (messages=None), one instance per setting
        self.messages = messages


class PreviousSamples:
    """The completed samples recorded in a samples log, indexed by id (latest record wins)."""

    def __init__(self, out: Path, config: EvalConfig) -> None:
        self.out = out
        self.path = out / SAMPLES_FILE
        self.config = config
        self._index: dict[str, _Recorded] = {}
        self._fingerprints: dict[tuple[Any, ...], Fingerprint] = {}  # shared instances: one per setting
        if self.path.exists():
            self._read_index()

    def __len__(self) -> int:
        return len(self._index)

    def _intern(self, data: Any) -> Fingerprint | None:
        if not isinstance(data, Mapping):
            return None
        try:
            fp = Fingerprint.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None
        task = fp.task
        return self._fingerprints.setdefault((task.endpoint, task.environment, task.max_turns, task.score_fn), task)

    def _read_index(self) -> None:
        with self.path.open("rb") as f:
            offset = 0
            for lineno, raw in enumerate(f, 1):
                start, offset = offset, offset + len(raw)
                if not raw.endswith(b"\n") or not raw.strip():
                    continue  # a torn last line (SampleLog truncates it) or a blank one
                try:
                    rec = json.loads(raw)
                    sid = str(rec["id"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{self.path}:{lineno}: not a sample record: {e}") from e
                if rec.get("status") != "completed":
                    self._index.pop(sid, None)  # a later failure replaces an earlier success
                    continue
                fp = rec.get("fingerprint")
                messages = fp.get("messages") if isinstance(fp, Mapping) else None
                self._index[sid] = _Recorded(
                    start,
                    input_digest(rec.get("input") or {}),
                    self._intern(fp),
                    sys.intern(messages) if messages else None,
                )

    def load(self, sample_id: str) -> Sample:
        """The recorded sample (read back from its line)."""
        rec = self._index[sample_id]
        with self.path.open("rb") as f:
            f.seek(rec.offset)
            return Sample.from_dict(json.loads(f.readline()))

    def decide(self, sample_id: str, row: Row, messages_hash: str | None) -> Decision:
        """Whether to run this row, reuse its recorded sample or re-score it (raises
        ResumeMismatch for a recording made under other settings). `messages_hash` is the hash
        of the messages the current config prepares for the row (None if that failed: it runs)."""
        rec = self._index.get(sample_id)
        if rec is None or rec.input != input_digest(row) or messages_hash is None:
            return "run"  # new, failed before, or its row changed since: it runs
        if rec.fingerprint is None:
            raise ResumeMismatch(
                f"output_dir {str(self.out)!r} holds samples recorded without a fingerprint (by an older "
                "version), so whether they match the current settings cannot be told. To go on, "
                + _ways_out(self.out, [])
            )
        current = Fingerprint(**{**self.config.fingerprint.to_dict(), "messages": messages_hash})
        parts = current.differences(replace(rec.fingerprint, messages=rec.messages))
        if not parts:
            return "reuse"
        if parts == ["score_fn"] and self.config.rescore:
            return "rescore"
        raise mismatch_error(self.out, parts, f"samples (e.g. {sample_id!r})")

    def needs_messages(self, sample_id: str, row: Row) -> bool:
        """Whether deciding about this row needs its prepared messages (it has a usable record)."""
        rec = self._index.get(sample_id)
        return rec is not None and rec.input == input_digest(row)
