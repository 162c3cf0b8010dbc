"""Events a GEPA run reports to callbacks, and the progress printer built on them.

    def on_event(event: GEPAEvent) -> None:
        if event.kind == "new_best":
            print(event.iteration, event.best_score)

    await optimize(..., callbacks=[on_event])

Kinds: "run_start", "seed_evaluated", "iteration_start", "evaluation" (one batch evaluated),
"reflection" (new text proposed), "iteration_end" (with the IterationRecord in `data["record"]`),
"iteration_dropped" (a speculative iteration the selection did not confirm: `data["reason"]`,
`data["calls"]` spent), "new_best", "checkpoint", "run_end". A callback may be sync or async; an
exception it raises ends the run (the last checkpoint stays, so the run can be resumed).

Every event names its iteration (`event.iteration`; 0 for the seed), and an iteration's
"evaluation" and "reflection" events come between its "iteration_start" and its "iteration_end"
(or "iteration_dropped"). With speculation (GEPAConfig.speculative, the default) the next
iteration starts while the accepted child of the current one is scored on the validation set:
its events are held back and told right after the current iteration's end (its start marked
`data["speculative"] = True`), so with proposals_in_flight=1 the events read as one iteration
after another. A dropped speculative iteration is followed by a new "iteration_start" with the
same number (the chosen parent on the same minibatch).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO, TypeAlias

from rollouts.redaction import redact_text

__all__ = ["EventKind", "GEPACallback", "GEPAEvent", "ProgressPrinter", "emit_event"]

EventKind = Literal[
    "run_start",
    "seed_evaluated",
    "iteration_start",
    "evaluation",
    "reflection",
    "iteration_end",
    "iteration_dropped",
    "new_best",
    "checkpoint",
    "run_end",
]


@dataclass(frozen=True)
class GEPAEvent:
    """Something that happened, with the run's progress at that moment.

    metric_calls: budget used (committed iterations, plus the evaluations in flight that have
    finished). data: details of this kind of event."""

    kind: EventKind
    iteration: int
    metric_calls: int
    max_metric_calls: int | None
    best_score: float
    best_idx: int
    candidates: int
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)


GEPACallback: TypeAlias = Callable[[GEPAEvent], Awaitable[None] | None]


async def emit_event(callbacks: tuple[GEPACallback, ...], event: GEPAEvent) -> None:
    for cb in callbacks:
        out = cb(event)
        if inspect.isawaitable(out):
            await out


class ProgressPrinter:
    """Prints one line per iteration (and the start and end of the run) to `stream`
    (default: stderr), such as

        [gepa] it   4  calls    86/200  cands   3  best 0.650 (#2)  | #2 on 3: 0.33 -> 0.67 accepted ...

    a callback for `optimize(callbacks=[...])`; `optimize(show_progress=True)` adds one."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _head(self, e: GEPAEvent) -> str:
        budget = f"{e.metric_calls}/{e.max_metric_calls}" if e.max_metric_calls is not None else f"{e.metric_calls}"
        return f"[gepa] it {e.iteration:>3}  calls {budget:>9}  cands {e.candidates:>3}  best {e.best_score:.3f} (#{e.best_idx})"

    def __call__(self, e: GEPAEvent) -> None:
        if e.kind == "run_start" and e.message:
            line = f"[gepa] {e.message}"
        elif e.kind == "seed_evaluated":
            line = f"{self._head(e)}  | seed valset {e.data.get('score', 0.0):.3f}"
        elif e.kind in ("iteration_end", "iteration_dropped"):
            line = f"{self._head(e)}  | {e.message}"
        elif e.kind == "run_end":
            line = f"[gepa] done: {e.message}"
        else:
            return
        print(redact_text(line), file=self._out(), flush=True)  # (a failure message may quote a key)
