"""`rollouts train grpo --heldout FILE`: the held-out rows, read and checked before any model loads.

The held-out file takes the formats and row shape of `--data` (.jsonl, .csv or .tsv; a `prompt`,
`question` or `messages` field, or whatever `--prepare` reads). Every held-out row is checked now,
not at the first evaluation (which would count a row that cannot be prepared as a failure, reward
0, many steps later): a line that is not a JSON object, a CSV line whose field count is not the
header's, or a row `--prepare` (or the default) cannot turn into messages is an error naming
`FILE:LINE`.

Leakage: a held-out row whose prompt — the messages the model is given, after `--prepare` and
`--system-prompt` — is also a training row's is refused, naming both lines, unless
`--allow-heldout-overlap` (then a warning counts them). Refused rather than warned by default
because `heldout_reward` is read later, from the log, by people who never see the warning: a
figure that contains training prompts measures memorisation, and nothing in the log would say
so. Only exact prompt matches are found; near-duplicates (the same question reworded, the same
operands in another order) are the dataset's author's to keep apart.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from rollouts.cli.common import CLIError
from rollouts.cli.tasks import DatasetFile, load_dataset
from rollouts.dtypes import Message
from rollouts.errors import ConfigurationError


@dataclass(frozen=True)
class NumberedRows:
    """A dataset file's rows with the line each starts on (CSV: the line it ends on)."""

    path: str
    rows: tuple[dict[str, Any], ...]
    lines: tuple[int, ...]

    def where(self, index: int) -> str:
        """`FILE:LINE` of row `index`."""
        return f"{self.path}:{self.lines[index]}"


def read_numbered(path: str, flag: str, *, strict: bool) -> NumberedRows:
    """The rows of the dataset file `path` (given as `flag`), numbered by line. `strict`: a CSV
    line with more or fewer fields than the header is an error (the held-out rows are checked
    this way; the training rows are read as `--data` always read them)."""
    try:
        dataset = load_dataset(path)
    except CLIError as e:
        raise CLIError(f"{flag}: {e}") from None
    if dataset.format == "jsonl":
        from rollouts.eval.io import load_jsonl

        with dataset.path.open(encoding="utf-8") as f:  # (as load_jsonl counts them)
            lines = [n for n, line in enumerate(f, 1) if line.strip()]
        try:
            rows = list(load_jsonl(dataset.path))
        except ConfigurationError as e:  # (a bad line: the message names FILE:LINE)
            raise CLIError(f"{flag} {e}") from None
        return NumberedRows(path, tuple(rows), tuple(lines))
    return _read_csv(dataset, path, flag, strict=strict)


def _read_csv(dataset: DatasetFile, path: str, flag: str, *, strict: bool) -> NumberedRows:
    rows: list[dict[str, Any]] = []
    lines: list[int] = []
    with dataset.path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter="\t" if dataset.format == "tsv" else ",")
        for row in reader:
            header = len(reader.fieldnames or ())
            extra = len(row.get(None) or ())  # (DictReader's restkey)
            missing = sum(v is None for v in row.values())  # (its restval)
            if strict and (extra or missing):
                raise CLIError(
                    f"{flag} {path}:{reader.line_num}: {header - missing + extra} fields where the header has "
                    f"{header}; quote values that hold the delimiter"
                )
            rows.append(dict(row))
            lines.append(reader.line_num)
    return NumberedRows(path, tuple(rows), tuple(lines))


def _prompt_key(messages: Sequence[Message]) -> str:
    """What the model is given, as a digest: roles and contents (not timestamps)."""
    parts = [{k: v for k, v in m.to_dict().items() if k in ("role", "content", "tool_call_id")} for m in messages]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


async def _prepared(prepare: Callable[..., Any], row: Mapping[str, Any]) -> list[Message]:
    out = prepare(row)
    if hasattr(out, "__await__"):
        out = await out
    messages = list(out)
    if not messages or not all(isinstance(m, Message) for m in messages):
        raise CLIError("prepare gave no messages, or something other than Messages")
    return messages


async def _check(heldout: NumberedRows, training: NumberedRows, prepare: Callable[..., Any]) -> list[tuple[int, int]]:
    """CLIError naming FILE:LINE for a held-out row that cannot be prepared; the (held-out,
    training) index pairs with the same prompt (a training row that cannot be prepared fails
    in training, as it does without --heldout: it is skipped here)."""
    keys: dict[str, int] = {}
    for i, row in enumerate(heldout.rows):
        try:
            keys.setdefault(_prompt_key(await _prepared(prepare, row)), i)
        except Exception as e:
            # (the default prepare's error names the fields it reads; a --prepare's is its own)
            raise CLIError(f"--heldout {heldout.where(i)}: the row cannot be turned into messages: {e}") from None
    overlap: list[tuple[int, int]] = []
    for j, row in enumerate(training.rows):
        try:
            key = _prompt_key(await _prepared(prepare, row))
        except Exception:
            continue
        if key in keys:
            overlap.append((keys[key], j))
    return overlap


def checked_heldout_rows(
    heldout_path: str, data_path: str, prepare: Callable[..., Any], *, allow_overlap: bool, warn: bool = True
) -> tuple[dict[str, Any], ...]:
    """The held-out rows of `heldout_path`, checked against the training rows of `data_path`
    (module docstring): CLIError for a missing or empty file, a bad row, or prompts shared with
    the training data (a warning on stderr instead with `allow_overlap`, if `warn`)."""
    heldout = read_numbered(heldout_path, "--heldout", strict=True)
    if not heldout.rows:
        raise CLIError(f"--heldout {heldout_path}: no rows; give at least one held-out row")
    training = read_numbered(data_path, "--data", strict=False)
    overlap = trio.run(_check, heldout, training, prepare)
    if not overlap:
        return heldout.rows
    shared = sorted({i for i, _ in overlap})
    first_i, first_j = overlap[0]
    detail = (
        f"{len(shared)} of {len(heldout.rows)} held-out rows have the prompt of a training row (the first: "
        f"{heldout.where(first_i)} and {training.where(first_j)})"
    )
    if not allow_overlap:
        raise CLIError(
            f"--heldout: {detail}; heldout_reward would measure prompts the model trains on. Remove them from one "
            "of the files, or pass --allow-heldout-overlap to evaluate them anyway"
        )
    if warn:
        print(f"warning: --heldout: {detail}; evaluated anyway (--allow-heldout-overlap)", file=sys.stderr, flush=True)
    return heldout.rows
