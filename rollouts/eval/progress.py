"""Progress of an evaluation on stderr: a live bar on a terminal, a line at intervals elsewhere.

    [####------]  412/1000  41%  83.1/s  err 2  reward 0.731  ETA 7s

On a terminal the bar is redrawn in place at most every `min_interval_s` seconds as samples
finish, once a second by evaluate()'s timer while none does, and once at the end; it costs
nothing measurable per sample. When the stream is not a TTY (CI logs, pipes, a notebook's
captured stderr) the same line is written as a plain line every `log_interval_s` seconds (30 by
default, or $ROLLOUTS_PROGRESS_INTERVAL), so a long run is never silent; a run shorter than
that writes nothing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from rollouts.eval.sample import Sample

_WIDTH = 20
INTERVAL_ENV = "ROLLOUTS_PROGRESS_INTERVAL"
_DEFAULT_INTERVAL_S = 30.0


def _env_interval() -> float:
    """Seconds between progress lines off a terminal: $ROLLOUTS_PROGRESS_INTERVAL, else 30."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, _DEFAULT_INTERVAL_S))
    except ValueError:
        return _DEFAULT_INTERVAL_S
    return value if value >= 0 else _DEFAULT_INTERVAL_S


def _fmt_duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class ProgressBar:
    """Counts finished samples and draws a progress line.

    `total` may be None (a streamed dataset of unknown length): then no bar, percentage or ETA
    is shown. `enabled=None` means: a live bar if `stream` is a TTY, else a plain line every
    `log_interval_s` seconds (`live` says which)."""

    def __init__(
        self,
        total: int | None,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        min_interval_s: float = 0.1,
        label: str = "",
        log_interval_s: float | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.live = bool(isatty and isatty())  # a terminal: redrawn in place; else lines at intervals
        self.enabled = True if enabled is None else enabled
        self.log_interval_s = log_interval_s if log_interval_s is not None else _env_interval()
        self.total = total
        self.label = label
        self.min_interval_s = min_interval_s
        self.done = 0
        self.errors = 0
        self.reused = 0
        self._reward_sum = 0.0
        self._scored = 0
        self._start = time.monotonic()
        self._last_draw = 0.0 if self.live else self._start
        self._drawn = False

    def update(self, sample: Sample, *, reused: bool = False) -> None:
        """Count one finished sample (`reused`: taken from a previous run's results)."""
        self.done += 1
        if reused:
            self.reused += 1
        if sample.status != "completed":
            self.errors += 1
        if sample.score is not None:
            self._scored += 1
            self._reward_sum += sample.score.reward
        if self.enabled:
            self.redraw(force=False)

    def redraw(self, *, force: bool = True) -> None:
        """Draw the line (if enabled), e.g. from a timer while no sample finishes: on a terminal
        now (`force`) or after `min_interval_s`; elsewhere once `log_interval_s` has passed."""
        if not self.enabled:
            return
        now = time.monotonic()
        interval = (0.0 if force else self.min_interval_s) if self.live else self.log_interval_s
        if now - self._last_draw >= interval:
            self._last_draw = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The current progress line (without carriage return)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        ran = self.done - self.reused
        rate = ran / elapsed
        parts = []
        if self.label:
            parts.append(self.label)
        if self.total:
            filled = int(_WIDTH * min(self.done, self.total) / self.total)
            parts.append(f"[{'#' * filled}{'-' * (_WIDTH - filled)}]")
            parts.append(f"{self.done}/{self.total}")
            parts.append(f"{100 * self.done / self.total:3.0f}%")
        else:
            parts.append(f"{self.done} done")
        parts.append(f"{rate:.1f}/s")
        parts.append(f"err {self.errors}")
        if self._scored:
            parts.append(f"reward {self._reward_sum / self._scored:.3f}")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {_fmt_duration((self.total - self.done) / rate)}")
        else:
            parts.append(f"elapsed {_fmt_duration(elapsed)}")
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        if self.live:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Draw the final line and end it with a newline (on a terminal, if anything was
        drawn or done; elsewhere only after interval lines, so a short run writes nothing)."""
        if self.enabled and (self._drawn or (self.done and self.live)):
            self._draw(time.monotonic())
            if self.live:
                self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
