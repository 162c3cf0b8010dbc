"""What the viewer reads, and from where: the `Catalog` protocol and the values it returns.

The pages only talk to a `Catalog`. `FilesCatalog` (rollouts.view.files) reads what rollouts
writes on disk (session stores, eval output directories, GEPA run directories) through small
SQLite indexes kept in a cache directory; a database catalog (the rollout service's batches,
agents and GEPA jobs) implements the same protocol over its tables.

Every list is a `Page`: the caller asks for `offset`/`limit`, filters and sort order, and the
catalog does the work (in SQL or an index), so a page of a 100,000-sample run costs the same as
a page of a 100-sample one. `complete` is False while a source is still being indexed: the
page then shows what has been indexed so far.

Ids are opaque strings chosen by the catalog (a run id is never a path); anything not known to
it raises `NotFound`, which the app turns into a 404 page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

from rollouts.dtypes import Message
from rollouts.eval.sample import Sample
from rollouts.gepa.result import CandidateRecord, IterationRecord

T = TypeVar("T")

PAGE_LIMIT_MAX = 500


class NotFound(LookupError):
    """No item with this id (the message names it)."""


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list: `items` from position `offset`, `total` matching items in all
    (counted over what is indexed so far when `complete` is False)."""

    items: tuple[T, ...]
    total: int
    offset: int
    limit: int
    complete: bool = True

    @property
    def has_next(self) -> bool:
        return self.offset + len(self.items) < self.total

    @property
    def has_prev(self) -> bool:
        return self.offset > 0


OFFSET_MAX = 2**62  # (SQL integers are 64-bit: a bigger offset would overflow)


def clamp_page(offset: int, limit: int) -> tuple[int, int]:
    """`offset` >= 0 and 1 <= `limit` <= PAGE_LIMIT_MAX; ValueError for an offset past OFFSET_MAX."""
    if int(offset) > OFFSET_MAX:
        raise ValueError(f"offset must be at most {OFFSET_MAX}, got {offset}")
    return max(0, int(offset)), max(1, min(PAGE_LIMIT_MAX, int(limit)))


# --------------------------------------------------------------------------------------------
# sessions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionQuery:
    """Filters for the sessions list (newest first). `text` searches message text; `tag` is
    (key, value); empty strings mean "any"."""

    text: str = ""
    status: str = ""
    model: str = ""
    tag: tuple[str, str] | None = None
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class SessionRow:
    """A session as the list shows it."""

    session_id: str
    status: str
    model: str
    provider: str
    parent_id: str | None = None
    branch_point: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    created_at: str = ""
    updated_at: str = ""
    n_messages: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    errors: int = 0
    preview: str = ""


@dataclass(frozen=True)
class SessionNode:
    """A session in a branch tree, with its branches."""

    session_id: str
    status: str
    branch_point: int | None
    n_messages: int
    children: tuple[SessionNode, ...] = ()


@dataclass(frozen=True)
class SessionDetail:
    """A session with one window of its history (`messages` are history[offset:offset+len])."""

    row: SessionRow
    metadata: Mapping[str, Any]
    messages: tuple[Message, ...]
    offset: int
    n_messages: int
    tree: SessionNode


# --------------------------------------------------------------------------------------------
# evaluations
# --------------------------------------------------------------------------------------------

SampleSort = Literal["seq", "id", "reward", "status", "turns", "tokens", "cost", "time"]
SAMPLE_SORTS: tuple[str, ...] = ("seq", "id", "reward", "status", "turns", "tokens", "cost", "time")
METRIC_OPS: tuple[str, ...] = ("<", "<=", "=", ">=", ">")


@dataclass(frozen=True)
class SampleQuery:
    """Filters and order for a run's samples. `sort` is one of SAMPLE_SORTS or `metric:<name>`;
    `metric`/`op`/`value` keep samples whose metric compares so; `meta` is (key, value) over
    the sample's metadata; `text` searches input and response."""

    text: str = ""
    status: str = ""
    failed: bool | None = None
    metric: str = ""
    op: str = ">="
    value: float | None = None
    meta: tuple[str, str] | None = None
    sort: str = "seq"
    descending: bool = False
    offset: int = 0
    limit: int = 50


@dataclass(frozen=True)
class EvalRunRow:
    """An eval run as the list shows it. `status` is report.json's status, or "running" while
    there is no report yet."""

    run_id: str
    name: str
    location: str
    status: str
    n_samples: int = 0
    n_failed: int = 0
    mean_reward: float | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    started_at: str = ""
    duration_s: float | None = None
    indexed: bool = True
    model: str = ""  # the endpoint's provider/model, when the run says
    task: str = ""  # what was evaluated (the run's task or dataset, else its scorer), when it says


@dataclass(frozen=True)
class EvalRunDetail:
    row: EvalRunRow
    report: Mapping[str, Any]
    metric_names: tuple[str, ...]


@dataclass(frozen=True)
class SampleRow:
    """A sample as the per-sample table shows it."""

    sample_id: str
    seq: int
    status: str
    reward: float | None
    metrics: Mapping[str, float]
    turns: int
    tokens: int
    cost_usd: float
    duration_s: float
    error: str | None
    input_preview: str
    response_preview: str


@dataclass(frozen=True)
class CompareRow:
    sample_id: str
    reward_a: float | None
    reward_b: float | None
    status_a: str
    status_b: str

    @property
    def delta(self) -> float:
        return (self.reward_b or 0.0) - (self.reward_a or 0.0)


@dataclass(frozen=True)
class Comparison:
    """Two runs side by side: rows ordered regressions first, and counts over all shared ids."""

    a: EvalRunRow
    b: EvalRunRow
    rows: Page[CompareRow]
    shared: int
    only_a: int
    only_b: int
    regressed: int
    improved: int


# --------------------------------------------------------------------------------------------
# eval sets (rollouts.eval.sets: every task x model pair in one directory, with an index.json)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSetCell:
    """One task x model pair of an eval set, as the set's comparison holds it: `mean` reward
    over `n` units with its `ci` (bootstrap, or normal past the draw limit: `ci_method`), and
    `run_id` the pair's run in this viewer (None until its directory exists)."""

    task: str
    model: str
    status: str
    n: int = 0
    mean: float | None = None
    ci: tuple[float, float] | None = None
    ci_method: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    samples: int = 0
    failed: int = 0
    epochs: Mapping[str, float] = field(default_factory=dict)
    error: str = ""
    run_id: str | None = None


@dataclass(frozen=True)
class EvalSetRow:
    set_id: str
    name: str
    location: str
    tasks: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    completed: int = 0
    failed: int = 0
    pending: int = 0  # pending, running or cancelled pairs
    confidence: float = 0.95


@dataclass(frozen=True)
class EvalSetDetail:
    row: EvalSetRow
    cells: tuple[EvalSetCell, ...]  # task by task, each task's models in the set's order

    def by_task(self) -> list[tuple[str, list[EvalSetCell]]]:
        """(task, its cells) in the set's task order."""
        out: dict[str, list[EvalSetCell]] = {}
        for c in self.cells:
            out.setdefault(c.task, []).append(c)
        return list(out.items())


# --------------------------------------------------------------------------------------------
# training runs (rollouts.training.grpo: <output_dir>/log.jsonl, checkpoints/, steps/)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingStep:
    """One line of a training log: its numbers by name, and the eval run holding the step's
    rollouts when the run kept them (`GRPOConfig.keep_step_samples`)."""

    step: int
    values: Mapping[str, float]
    samples_run_id: str | None = None


@dataclass(frozen=True)
class TrainingRunRow:
    run_id: str
    name: str
    location: str
    steps: int = 0
    last_step: int | None = None
    reward_first: float | None = None
    reward_last: float | None = None
    heldout_start: float | None = None  # before the first update (step 0's heldout_reward_start)
    heldout_last: float | None = None
    checkpoints: int = 0
    updated_at: str = ""
    active: bool = False  # its log was written in the last few minutes (live pages keep listening)


@dataclass(frozen=True)
class TrainingRunDetail:
    row: TrainingRunRow
    steps: tuple[TrainingStep, ...]
    keys: tuple[str, ...]  # every number a step of the log has, in first-seen order

    def series(self, key: str) -> list[tuple[float, float]]:
        """(step, value) of every step that has `key`; first, at step -1, step 0's `key`_start
        when it has one (the figure before the first update: `heldout_reward_start`)."""
        points = [(float(s.step), s.values[key]) for s in self.steps if key in s.values]
        first = self.steps[0] if self.steps else None
        if first is not None and first.step == 0 and f"{key}_start" in first.values:
            points.insert(0, (-1.0, first.values[f"{key}_start"]))
        return points


# --------------------------------------------------------------------------------------------
# GEPA
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GepaRunRow:
    run_id: str
    name: str
    location: str
    status: str  # "running" (state.json only) or the result's stop reason
    n_candidates: int = 0
    best_idx: int = 0
    best_score: float = 0.0
    seed_score: float = 0.0
    metric_calls: int = 0
    max_metric_calls: int | None = None
    iterations: int = 0


@dataclass(frozen=True)
class GepaRunDetail:
    row: GepaRunRow
    candidates: tuple[CandidateRecord, ...]
    history: tuple[IterationRecord, ...]
    pareto_front: tuple[tuple[int, ...], ...]
    valset_size: int

    @property
    def on_front(self) -> frozenset[int]:
        """Candidates that are best on at least one validation instance."""
        return frozenset(i for front in self.pareto_front for i in front)


@dataclass(frozen=True)
class Reflection:
    """One reflection call: the prompt shown to the reflection model and its answer."""

    iteration: int
    component: str
    prompt: str
    answer: str


# --------------------------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------------------------


@runtime_checkable
class Catalog(Protocol):
    """Where the viewer's data comes from. All methods are async (trio); blocking work runs in
    worker threads. Unknown ids raise NotFound; a bad query value raises ValueError."""

    async def list_sessions(self, query: SessionQuery) -> Page[SessionRow]: ...

    async def get_session(self, session_id: str, *, offset: int = 0, limit: int = 200) -> SessionDetail: ...

    async def list_eval_runs(self) -> Sequence[EvalRunRow]: ...

    async def get_eval_run(self, run_id: str) -> EvalRunDetail: ...

    async def list_samples(self, run_id: str, query: SampleQuery) -> Page[SampleRow]: ...

    async def get_sample(self, run_id: str, sample_id: str) -> Sample: ...

    async def compare_runs(self, run_a: str, run_b: str, *, offset: int = 0, limit: int = 50) -> Comparison: ...

    async def runs_sharing_samples(self, run_id: str) -> Sequence[str]:
        """The other runs that share at least one sample id with `run_id` (the ones worth
        comparing with it), in the order of `list_eval_runs`."""
        ...

    async def list_eval_sets(self) -> Sequence[EvalSetRow]: ...

    async def get_eval_set(self, set_id: str) -> EvalSetDetail: ...

    async def list_training_runs(self) -> Sequence[TrainingRunRow]: ...

    async def get_training_run(self, run_id: str) -> TrainingRunDetail: ...

    async def list_gepa_runs(self) -> Sequence[GepaRunRow]: ...

    async def get_gepa_run(self, run_id: str) -> GepaRunDetail: ...

    async def gepa_reflections(self, run_id: str, iteration: int) -> Sequence[Reflection]: ...

    async def version(self, kind: Literal["session", "eval", "gepa", "training"], item_id: str) -> str:
        """A token that changes whenever the item changes (live pages poll it)."""
        ...
