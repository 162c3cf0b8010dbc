"""A one-line live progress bar for evaluations, on stderr, only when it is a terminal.

    [####------]  412/1000  41%  83.1/s  err 2  reward 0.731  ETA 7s

Redrawn at most every `min_interval_s` seconds as samples finish, once a second by evaluate()'s
timer while none does, and once at the end; it costs nothing measurable per sample. When the
stream is not a TTY (CI logs, pipes) it draws nothing.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from rollouts.eval.sample import Sample

_WIDTH = 20


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
    is shown. `enabled=None` means "only if `stream` is a TTY"."""

    def __init__(
        self,
        total: int | None,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        min_interval_s: float = 0.1,
        label: str = "",
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = total
        self.label = label
        self.min_interval_s = min_interval_s
        self.done = 0
        self.errors = 0
        self.reused = 0
        self._reward_sum = 0.0
        self._scored = 0
        self._start = time.monotonic()
        self._last_draw = 0.0
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
            now = time.monotonic()
            if now - self._last_draw >= self.min_interval_s:
                self._last_draw = now
                self._draw(now)

    def redraw(self) -> None:
        """Draw the line now (if enabled), e.g. from a timer while no sample finishes."""
        if self.enabled:
            now = time.monotonic()
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
        self.stream.write("\r" + self.line(now) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Draw the final line and end it with a newline (if anything was drawn)."""
        if self.enabled and (self._drawn or self.done):
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
