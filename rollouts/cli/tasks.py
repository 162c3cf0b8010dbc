"""What `rollouts eval` and `rollouts gepa` share: datasets, scorers, per-sample environments and
the results directory."""

from __future__ import annotations

import argparse
import csv
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollouts.cli.common import ENVIRONMENTS, CLIError, environment_class, load_callable, make_environment
from rollouts.config import RolloutsConfig
from rollouts.dtypes import Message
from rollouts.eval import scorers
from rollouts.eval.config import DEFAULT_MAX_CONCURRENT

if TYPE_CHECKING:
    from rollouts.environments.base import Environment

RESULTS_DIR_ENV = "ROLLOUTS_RESULTS_DIR"
DEFAULT_RESULTS_DIR = "results"


def add_task_args(group: Any, *, system_prompt_help: str) -> None:
    """The flags `eval` and `gepa` share: how each row is prepared, run and scored."""
    group.add_argument("--prepare", metavar="MODULE:FUNCTION", help="row -> list of Messages (sync or async)")
    group.add_argument(
        "--score", metavar="NAME|MODULE:FUNCTION", help="built-in scorer name or Sample -> Score function"
    )
    group.add_argument("--system-prompt", metavar="TEXT", help=system_prompt_help)
    group.add_argument("--system-prompt-file", metavar="FILE", help="read the system prompt from FILE")
    group.add_argument(
        "--max-concurrent", type=int, metavar="N", help=f"samples in flight at once (default {DEFAULT_MAX_CONCURRENT})"
    )
    group.add_argument("--max-turns", type=int, metavar="N", help="model turns per sample (default 10)")
    group.add_argument("--sample-timeout", type=float, metavar="SECONDS", help="time limit per sample")


def builtin_scorers() -> dict[str, str]:
    """Built-in scorer names and what they check. Combine several with commas:
    `--score exact_match,contains` (each metric weighted 1)."""
    return {name: doc for name, (_, doc) in scorers.BUILTIN_METRICS.items()}


def resolve_scorer(ref: str, flag: str = "--score") -> Callable[..., Any]:
    """`--score` (or `flag`): built-in scorer names (comma-separated) or `module:function`."""
    if ":" in ref:
        return load_callable(ref, flag)
    names = [n.strip() for n in ref.split(",") if n.strip()]
    builtin = scorers.BUILTIN_METRICS
    unknown = [n for n in names if n not in builtin]
    if unknown or not names:
        raise CLIError(
            f"{flag}: unknown scorer {', '.join(unknown) or ref!r}; built-in scorers: {', '.join(sorted(builtin))}; "
            "or pass module:function"
        )
    fn: Callable[..., Any] = scorers.builtin_score_fn(names)
    return fn


class DatasetFile:
    """The rows of a .jsonl or .csv (.tsv) file: read lazily on each iteration, and counted by
    `len()` (one pass that parses no JSON) so the progress bar can show a total and an ETA."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._len: int | None = None
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".ndjson", ".json"):
            self.format = "jsonl"
        elif suffix in (".csv", ".tsv"):
            self.format = "tsv" if suffix == ".tsv" else "csv"
        else:
            raise CLIError(f"dataset {str(path)!r}: unknown format {suffix or '(no extension)'}; use .jsonl or .csv")

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from rollouts.eval.io import load_csv, load_jsonl

        if self.format == "jsonl":
            return load_jsonl(self.path)
        return load_csv(self.path, delimiter="\t") if self.format == "tsv" else load_csv(self.path)

    def __len__(self) -> int:
        if self._len is None:
            if self.format == "jsonl":
                with self.path.open("rb") as f:
                    self._len = sum(1 for line in f if line.strip())
            else:
                with self.path.open(encoding="utf-8", newline="") as f:
                    rows = csv.reader(f, delimiter="\t" if self.format == "tsv" else ",")
                    self._len = max(0, sum(1 for row in rows if row) - 1)  # (the header)
        return self._len


def load_dataset(path: str) -> DatasetFile:
    """The dataset file at `path` (CLIError if it does not exist or has an unknown format)."""
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"dataset {path!r} does not exist")
    return DatasetFile(p)


def slug(text: str) -> str:
    """`text` as a directory name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")[:80] or "eval"


def results_root(config: RolloutsConfig) -> Path:
    """Where results go by default: $ROLLOUTS_RESULTS_DIR, [defaults] results_dir, or ./results."""
    chosen = os.environ.get(RESULTS_DIR_ENV) or config.defaults.get("results_dir") or DEFAULT_RESULTS_DIR
    return Path(str(chosen)).expanduser()


def environment_factory(name: str, cwd: str | None) -> Callable[..., Any]:
    """A factory of fresh `--env name` environments, one per sample (tool calls never ask: there
    is nobody to ask). Fails now, not once per sample, if the environment is unavailable. Your
    own `module:Class` is the factory itself, as in `EvalConfig(environment_factory=Class)`
    (called with the row if it takes an argument; its source is part of the fingerprint)."""
    cls = environment_class(name)
    if name not in ENVIRONMENTS:
        return cls  # type: ignore[no-any-return]

    async def factory() -> Environment:
        return await make_environment(name, cwd, confirm=False)

    factory.__qualname__ = f"cli_environment[{name}]"
    return factory


def with_system_prompt(
    prepare: Callable[..., Any], system_prompt: str, *, replace_existing: bool = False
) -> Callable[..., Any]:
    """`prepare` with `system_prompt` put first, unless its messages already start with one
    (which `replace_existing` replaces instead)."""

    async def prepare_with_system(row: Mapping[str, Any]) -> Sequence[Message]:
        out = prepare(row)
        if hasattr(out, "__await__"):
            out = await out
        msgs = list(out)
        if msgs and msgs[0].role == "system":
            return [Message("system", system_prompt), *msgs[1:]] if replace_existing else msgs
        return [Message("system", system_prompt), *msgs]

    prepare_with_system.__qualname__ = f"{getattr(prepare, '__qualname__', 'prepare')}+system_prompt"
    return prepare_with_system


def check_minimums(args: argparse.Namespace, minimums: Mapping[str, int]) -> None:
    """CLIError for a numeric flag below its minimum (`{"max_samples": 0, "max_turns": 1}`)."""
    for flag, minimum in minimums.items():
        value = getattr(args, flag)
        if value is not None and value < minimum:
            raise CLIError(f"--{flag.replace('_', '-')} must be at least {minimum}")


def given_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """The EvalConfig arguments the user set (a None is left out: EvalConfig's default applies,
    so defaults are written once, in the library)."""
    return {k: (int(v) if k == "max_concurrent" else v) for k, v in values.items() if v is not None}
