"""The evaluation cache: a (candidate texts, row, scoring fingerprint) already evaluated is not
evaluated again and costs no metric call.

GEPA evaluates the same candidate on the same instance again and again: a candidate chosen as
parent is re-run on its minibatch although its validation evaluation (or an earlier minibatch)
already scored those rows, and with `valset` defaulting to `trainset` every accepted child's
minibatch rows come back in its validation evaluation. The cache answers those from what was
recorded, trajectories included (an adapter with `encode_trajectory` / `decode_trajectory`
keeps them; `RolloutsAdapter` does), so reflection reads the same records.

Determinism. Which lookups hit must not depend on timing, or the result would. An entry is
*visible* to a lookup when it was recorded before the run's last checkpoint or finished in this
process, and, with `proposals_in_flight` = w > 1 (iterations evaluating at once), when it comes
from the same iteration or one at least w older (those are committed whenever the lookup can
run). With w = 1 every evaluation runs after the previous one has finished, so every finished
entry is visible.

Resume. The cache lives in the run directory (`evaluations.jsonl`, one record per evaluated
(candidate, row)); the checkpoint stores how many records it covered. A record written after it
(by work the resumed run redoes) is visible only once its own evaluation (same `eval_id`) has
been replayed from it; a replay counts as the metric call it was, so a resumed run reaches the
same budget figures, decisions and result as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rollouts.gepa.adapter import Candidate, EvaluationBatch
from rollouts.gepa.checkpoint import JsonlLog

__all__ = ["CACHE_FILE", "CacheEntry", "CachedEvaluation", "EvaluationCache", "row_digest"]

CACHE_FILE = "evaluations.jsonl"

AdapterCall = Callable[[Sequence[Mapping[str, Any]]], Awaitable[EvaluationBatch]]


def row_digest(row: Mapping[str, Any]) -> str:
    """A stable digest of a dataset row (its canonical JSON; values JSON lacks as their repr)."""
    text = json.dumps(dict(row), sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _json_exact(value: Any) -> bool:
    try:
        return bool(json.loads(json.dumps(value, allow_nan=False)) == value)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class CacheEntry:
    """One evaluated (candidate, row): what the adapter returned for it. `output` is kept only
    when it survives JSON exactly and `trajectory` (encoded) only when the adapter can encode
    it: an entry without them answers evaluations without traces only."""

    index: int
    key: str
    eval_id: str
    iteration: int
    score: float
    output: Any = None
    output_kept: bool = False
    objectives: Mapping[str, float] | None = None
    feedback: str | None = None
    trajectory: Any = None
    has_trajectory: bool = False

    def usable(self, capture: bool) -> bool:
        return not capture or (self.has_trajectory and self.output_kept)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "eval": self.eval_id,
            "iteration": self.iteration,
            "score": self.score,
            "output": self.output if self.output_kept else None,
            "output_kept": self.output_kept,
            "objectives": dict(self.objectives) if self.objectives is not None else None,
            "feedback": self.feedback,
            "trajectory": self.trajectory if self.has_trajectory else None,
            "has_trajectory": self.has_trajectory,
        }

    @classmethod
    def from_dict(cls, index: int, d: Mapping[str, Any]) -> CacheEntry:
        return cls(
            index=index,
            key=d["key"],
            eval_id=d["eval"],
            iteration=d["iteration"],
            score=float(d["score"]),
            output=d.get("output"),
            output_kept=bool(d.get("output_kept")),
            objectives=d.get("objectives"),
            feedback=d.get("feedback"),
            trajectory=d.get("trajectory"),
            has_trajectory=bool(d.get("has_trajectory")),
        )


@dataclass(frozen=True)
class CachedEvaluation:
    """An evaluation through the cache: the batch, the metric calls it counts (rows evaluated
    by the adapter, plus rows replayed from this evaluation's own earlier records) and the calls
    it saved (rows answered by other evaluations' records, or repeated within the batch)."""

    batch: EvaluationBatch
    calls: int
    saved: int


Lookup = Literal["hit", "replay", "miss"]


class EvaluationCache:
    """Entries by key, in memory and (with `path`) in an append-only file. `enabled=False`
    evaluates everything (and records nothing). `scoring` is the scoring fingerprint: entries
    made under another one never match. `window` is the engine's `proposals_in_flight`."""

    def __init__(
        self,
        path: Path | None,
        *,
        scoring: str,
        window: int = 1,
        enabled: bool = True,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
    ) -> None:
        self.enabled = enabled
        self.scoring = scoring
        self.window = window
        self._encode, self._decode = encode, decode
        self._entries: list[CacheEntry] = []
        self._by_key: dict[str, list[CacheEntry]] = {}
        self._horizon = 0
        self._finished: set[int] = set()
        self._path = path if enabled else None
        self._log: JsonlLog | None = None

    def open(self) -> None:
        """Read the records already in the file and open it for appending (the engine calls this
        once it holds the run directory's lock: opening drops a torn last line)."""
        if self._path is not None and self._log is None:
            self._log = JsonlLog(self._path)
            for n, rec in enumerate(self._log):
                self._index(CacheEntry.from_dict(n, rec))

    # ---- bookkeeping --------------------------------------------------------------------------

    def _index(self, entry: CacheEntry) -> None:
        self._entries.append(entry)
        self._by_key.setdefault(entry.key, []).append(entry)

    @property
    def count(self) -> int:
        """Records so far (what a checkpoint stores as its horizon)."""
        return len(self._entries)

    def set_horizon(self, n: int) -> None:
        """The records covered by the checkpoint resumed from: visible at once."""
        self._horizon = min(n, len(self._entries))

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def key(self, candidate: Mapping[str, str], row: Mapping[str, Any]) -> str:
        text = json.dumps([dict(sorted(candidate.items())), row_digest(row), self.scoring], ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def _visible(self, e: CacheEntry, iteration: int) -> bool:
        if e.index >= self._horizon and e.index not in self._finished:
            return False
        w = self.window
        return w == 1 or e.iteration == iteration or e.iteration <= iteration - w

    def lookup(self, key: str, *, eval_id: str, iteration: int, capture: bool) -> tuple[Lookup, CacheEntry | None]:
        """Whether a record answers: "replay": this evaluation's own earlier record (a resumed run redoing it; it counts);
        "hit": another evaluation's visible record (free); "miss": evaluate it."""
        if not self.enabled:
            return "miss", None
        entries = self._by_key.get(key, ())
        for e in entries:
            if e.eval_id == eval_id and e.usable(capture):
                return "replay", e
        for e in entries:  # (the oldest visible record: the same one whatever ran since)
            if e.eval_id != eval_id and e.usable(capture) and self._visible(e, iteration):
                return "hit", e
        return "miss", None

    def would_cost(self, candidate: Candidate, row: Mapping[str, Any], *, eval_id: str, iteration: int) -> bool:
        """Whether evaluating `candidate` on `row` (without traces) would count a metric call now."""
        return self.lookup(self.key(candidate, row), eval_id=eval_id, iteration=iteration, capture=False)[0] != "hit"

    def _record(self, key: str, eval_id: str, iteration: int, batch: EvaluationBatch, pos: int) -> CacheEntry:
        output = batch.outputs[pos]
        kept = _json_exact(output)
        trajectory, has = None, False
        if batch.trajectories is not None and self._encode is not None:
            trajectory, has = self._encode(batch.trajectories[pos]), True
        entry = CacheEntry(
            index=len(self._entries),
            key=key,
            eval_id=eval_id,
            iteration=iteration,
            score=float(batch.scores[pos]),
            output=output if kept else None,
            output_kept=kept,
            objectives=dict(batch.objective_scores[pos]) if batch.objective_scores is not None else None,
            feedback=batch.feedback[pos] if batch.feedback is not None else None,
            trajectory=trajectory,
            has_trajectory=has,
        )
        self._index(entry)
        self._finished.add(entry.index)
        if self._log is not None:
            self._log.append(entry.to_dict())
        return entry

    # ---- evaluating ---------------------------------------------------------------------------

    async def evaluate(
        self,
        run: AdapterCall,
        rows: Sequence[Mapping[str, Any]],
        candidate: Candidate,
        *,
        capture: bool,
        eval_id: str,
        iteration: int,
    ) -> CachedEvaluation:
        """Evaluate `candidate` on `rows`, running through `run` only the rows the cache cannot
        answer (each distinct one once)."""
        if not self.enabled or (capture and self._decode is None):
            batch = await run(rows)
            if self.enabled:
                for pos, row in enumerate(rows):
                    self._record(self.key(candidate, row), eval_id, iteration, batch, pos)
            return CachedEvaluation(batch, len(rows), 0)
        keys = [self.key(candidate, row) for row in rows]
        found: list[CacheEntry | int | None] = [None] * len(rows)  # an entry, or a position in `todo`
        first: dict[str, int] = {}  # key -> its position in `todo`
        todo: list[int] = []
        calls = saved = 0
        for pos, key in enumerate(keys):
            kind, entry = self.lookup(key, eval_id=eval_id, iteration=iteration, capture=capture)
            if kind != "miss":
                assert entry is not None
                found[pos] = entry
                if kind == "replay":
                    calls += 1
                    self._finished.add(entry.index)
                else:
                    saved += 1
            elif key in first:  # the same (candidate, row) twice in one batch
                found[pos] = first[key]
                saved += 1
            else:
                found[pos] = first[key] = len(todo)
                todo.append(pos)
        fresh: EvaluationBatch | None = None
        if todo:
            fresh = await run([rows[p] for p in todo])
            calls += len(todo)
            for n, pos in enumerate(todo):
                self._record(keys[pos], eval_id, iteration, fresh, n)
        return CachedEvaluation(self._batch(found, fresh, capture), calls, saved)

    def _batch(
        self, found: Sequence[CacheEntry | int | None], fresh: EvaluationBatch | None, capture: bool
    ) -> EvaluationBatch:
        """The batch in row order: fresh rows as the adapter returned them, the others from
        their entries."""
        outputs: list[Any] = []
        scores: list[float] = []
        trajectories: list[Any] = []
        objectives: list[Mapping[str, float] | None] = []
        feedback: list[str | None] = []
        for src in found:
            if isinstance(src, CacheEntry):
                outputs.append(src.output)
                scores.append(src.score)
                trajectories.append(self._decode(src.trajectory) if capture and self._decode is not None else None)
                objectives.append(src.objectives)
                feedback.append(src.feedback)
            else:
                assert fresh is not None and src is not None
                outputs.append(fresh.outputs[src])
                scores.append(float(fresh.scores[src]))
                trajectories.append(fresh.trajectories[src] if fresh.trajectories is not None else None)
                objectives.append(fresh.objective_scores[src] if fresh.objective_scores is not None else None)
                feedback.append(fresh.feedback[src] if fresh.feedback is not None else None)
        return EvaluationBatch(
            outputs=outputs,
            scores=scores,
            trajectories=trajectories if capture else None,
            objective_scores=None if all(o is None for o in objectives) else [o or {} for o in objectives],
            feedback=None if all(f is None for f in feedback) else [f or "" for f in feedback],
        )
