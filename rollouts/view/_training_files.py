"""Training run directories on disk (`rollouts.training.grpo`): `log.jsonl` (one JSON object a
step: step, reward_mean, reward_std, loss, kl, entropy, grad_norm, lr, seconds, ... and
`heldout_reward` on steps with a held-out evaluation), `checkpoints/step_NNNNNN/`, and with
`GRPOConfig.keep_step_samples` each step's rollouts in `steps/step_NNNNNN/` (eval output
directories).

The names are the training package's (`LOG_FILE`, `CHECKPOINTS`, `STEPS_DIR`), spelled here so
the viewer does not import the training package (and torch with it); a test checks they agree.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

from rollouts.view._file_state import written_recently
from rollouts.view.catalog import NotFound, TrainingRunDetail, TrainingRunRow, TrainingStep

LOG_FILE = "log.jsonl"
CHECKPOINTS = "checkpoints"
STEPS_DIR = "steps"
LOG_MAX_BYTES = 256 * 1024 * 1024  # a longer log is read up to here (about 500,000 steps)
STEP_DIRS_MAX = 20_000
_FIRST_LINE_MAX = 64 * 1024


def is_training_dir(path: Path) -> bool:
    """Whether `path` holds a training log (its first line a step record with a reward)."""
    try:
        with open(path / LOG_FILE, "rb") as f:
            first = f.readline(_FIRST_LINE_MAX)
    except OSError:
        return False
    if not first.strip():
        return (path / CHECKPOINTS).is_dir()  # (a run that has not finished its first step)
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and "step" in record and "reward_mean" in record


def step_dirs(path: Path) -> list[Path]:
    """The step sample directories (`steps/step_NNNNNN`), in step order."""
    root = path / STEPS_DIR
    try:
        with os.scandir(root) as it:
            names = [e.name for _, e in zip(range(STEP_DIRS_MAX), it, strict=False) if e.name.startswith("step_")]
    except OSError:
        return []
    return [root / n for n in sorted(names) if n[5:].isdigit()]


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def read_training_run(path: Path, run_id: str, samples_run_id: Callable[[Path], str | None]) -> TrainingRunDetail:
    """The run at `path`; `samples_run_id(step directory)` is the eval run of a step's samples
    in the viewer, or None. A torn last line (a run killed mid-write) is left out."""
    try:
        with open(path / LOG_FILE, "rb") as f:
            data = f.read(LOG_MAX_BYTES)
        mtime = (path / LOG_FILE).stat().st_mtime
    except OSError as e:
        raise NotFound(f"training run {run_id} has no readable {LOG_FILE} ({e.strerror})") from None
    by_step: dict[int, dict[str, float]] = {}
    keys: dict[str, None] = {}
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or _finite(record.get("step")) is None:
            continue
        values = {str(k): x for k, v in record.items() if k != "step" and (x := _finite(v)) is not None}
        keys.update(dict.fromkeys(values))
        by_step[int(record["step"])] = values  # (a step run again after a resume: the last line)
    dirs = {int(d.name[5:]): d for d in step_dirs(path)}
    steps = tuple(
        TrainingStep(n, v, samples_run_id(dirs[n]) if n in dirs else None) for n, v in sorted(by_step.items())
    )
    rewards = [s.values["reward_mean"] for s in steps if "reward_mean" in s.values]
    heldout = [s.values["heldout_reward"] for s in steps if "heldout_reward" in s.values]
    try:
        checkpoints = sum(1 for p in (path / CHECKPOINTS).iterdir() if p.name.startswith("step_"))
    except OSError:
        checkpoints = 0
    row = TrainingRunRow(
        run_id=run_id,
        name=path.name,
        location=str(path),
        steps=len(steps),
        last_step=steps[-1].step if steps else None,
        reward_first=rewards[0] if rewards else None,
        reward_last=rewards[-1] if rewards else None,
        heldout_start=steps[0].values.get("heldout_reward_start") if steps and steps[0].step == 0 else None,
        heldout_last=heldout[-1] if heldout else None,
        checkpoints=checkpoints,
        updated_at=dt.datetime.fromtimestamp(mtime, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        active=written_recently(mtime),  # (a step can take minutes)
    )
    return TrainingRunDetail(row, steps, tuple(keys))
