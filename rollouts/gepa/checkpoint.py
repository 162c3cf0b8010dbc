"""The run directory: checkpoint, final result, and append-only logs.

    run_dir/
      state.json         the engine state after the last finished iteration (atomic: temp file,
                         fsync, rename), including the iterations planned but not finished
      result.json        the GEPAResult when the run ended
      best_candidate.json / best_<component>.txt   the best texts
      rollouts.jsonl     every rollout (sample with trajectory and score), one line each
      reflections.jsonl  every reflection: prompt, answer, new text

A restarted run loads state.json and redoes only the unfinished iterations; their rollouts and
reflections are taken from the logs instead of calling the models again, so the budget is not
spent twice and the result is the one an uninterrupted run gives.

Every file is written with known secret values masked (`rollouts.redaction`): the JSON files
through `eval.io.write_json_atomic`, the logs and the best_*.txt texts here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import trio

from rollouts._unicode import escape_lone_surrogates
from rollouts.eval.io import dumps_json, read_json, write_json_atomic
from rollouts.gepa.state import GEPAState
from rollouts.redaction import redact_json, redact_text

__all__ = [
    "JsonlLog",
    "REFLECTIONS_FILE",
    "RESULT_FILE",
    "ROLLOUTS_FILE",
    "STATE_FILE",
    "load_state",
    "save_state",
    "write_result_files",
]

STATE_FILE = "state.json"
RESULT_FILE = "result.json"
ROLLOUTS_FILE = "rollouts.jsonl"
REFLECTIONS_FILE = "reflections.jsonl"


def load_state(run_dir: Path) -> GEPAState | None:
    """The checkpointed state in `run_dir`, or None when there is none yet."""
    path = run_dir / STATE_FILE
    if not path.exists():
        return None
    try:
        return GEPAState.from_dict(read_json(path))
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a GEPA checkpoint ({type(e).__name__}: {e}); use another run_dir") from e


async def save_state(run_dir: Path, data: Mapping[str, Any]) -> None:
    """Write a state dict (from `GEPAState.to_dict()`) atomically, off the event loop."""
    await trio.to_thread.run_sync(write_json_atomic, run_dir / STATE_FILE, data)


def _valid_lines(path: Path) -> tuple[list[str], int]:
    """The complete lines of a JSONL file and the byte length they cover (a torn last line,
    from a crash mid-write, is left out)."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    return data[:end].decode("utf-8").splitlines(), end


class JsonlLog:
    """An append-only JSONL file: the records already in it are read on open (a torn last line
    is dropped), each new record is one flushed line. Any text is stored losslessly: a lone
    surrogate (from a dataset row or a reply) is written as its JSON escape, which UTF-8 can
    encode and which reads back as the same code point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            lines, end = _valid_lines(path)
            for n, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        self.records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: not a JSON record ({e.msg})") from e
            with path.open("r+b") as f:
                f.truncate(end)
        self._f: IO[str] | None = path.open("a", encoding="utf-8")

    def append(self, record: Mapping[str, Any]) -> None:
        assert self._f is not None, "JsonlLog.append after close"
        self._f.write(escape_lone_surrogates(redact_json(dumps_json(record, separators=(",", ":")))) + "\n")
        self._f.flush()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            f.close()


def write_result_files(run_dir: Path, result: Any) -> None:
    """result.json, best_candidate.json and best_<component>.txt (each written atomically; a
    lone surrogate, which UTF-8 cannot hold, is a JSON escape in the .json files and a
    backslash escape in the .txt ones)."""
    write_json_atomic(run_dir / RESULT_FILE, result.to_dict())
    write_json_atomic(run_dir / "best_candidate.json", result.best_candidate)
    for name, text in result.best_candidate.items():
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
        tmp = run_dir / f".best_{safe}.txt.tmp"
        text = redact_text(text)
        # (a lone surrogate is shown as its escape here; best_candidate.json keeps it exactly)
        tmp.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8", errors="backslashreplace")
        tmp.replace(run_dir / f"best_{safe}.txt")
