"""One compiler from the viewer's queries to SQL, for every place samples are stored.

The files catalog keeps a run's samples in an SQLite index (rollouts.view._index); the rollout
service keeps a batch's tasks in its database (SQLite or PostgreSQL). Both answer the same
`SampleQuery` through `compile_samples`, given a `SampleColumns`: the SQL expression of each
field of a sample in that layout. So a filter means the same thing in `rollouts view` and in
the service's `/ui`:

* `status` is a status or a group: "completed", "failed" (every stored status that ended
  without a result: failed, timeout, cancelled, provider_error) or "pending" (not finished);
  `failed` is "status is not completed";
* `metric` "reward" is the score's reward; any other name is a metric of the score (any text,
  quotes included: names reach SQL as bound parameters, never as text of the statement);
* `text` is a case-insensitive (ASCII letters) substring of the sample's input or response;
* sorting puts samples without a value (NULL) first ascending and last descending, and breaks
  ties by position in the run, in the same direction (so an index on (column, seq) serves both).

Every value reaches the database as a bound parameter (`?`); the only text put into SQL comes
from the layout's fixed expressions and the fixed tables here (sort names, operators).
The compare query (two runs side by side on one metric) is built here too (`compile_compare`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CompiledCompare", "CompiledSamples", "SampleColumns", "ascii_lower", "compile_compare", "compile_samples",
           "sample_order", "sample_where", "sort_expression"]  # fmt: skip

from rollouts.view.catalog import METRIC_OPS, SAMPLE_SORTS, SampleQuery

_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASCII_LOWER = str.maketrans(_UPPER, _UPPER.lower())


def ascii_lower(text: str) -> str:
    """`text` with ASCII letters lowercased (what SQLite's LOWER does, on every database)."""
    return text.translate(_ASCII_LOWER)


@dataclass(frozen=True)
class SampleColumns:
    """Where a sample's fields are in one storage layout: SQL expressions over its row.

    `metric` and `meta` read the metric / metadata value named by their one `?` placeholder;
    `search` are texts the `text` filter looks in (`search_lowered`: already ASCII-lowercased);
    `groups` maps a status group to the stored statuses it covers."""

    id: str
    seq: str
    status: str
    reward: str
    turns: str
    tokens: str
    cost: str
    time: str
    metric: str
    meta: str
    search: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]
    postgres: bool = False
    search_lowered: bool = False


def _lower(c: SampleColumns, expr: str) -> str:
    if c.search_lowered:
        return expr
    if c.postgres:  # (PostgreSQL's lower() follows the locale; the viewer's search folds ASCII only)
        return f"translate({expr}, '{_UPPER}', '{_UPPER.lower()}')"
    return f"LOWER({expr})"


def _contains(c: SampleColumns, expr: str) -> str:
    # a substring test with no pattern characters (LIKE would need its %, _ and \ escaped)
    return f"strpos({expr}, ?) > 0" if c.postgres else f"instr({expr}, ?) > 0"


def sample_where(c: SampleColumns, q: SampleQuery) -> tuple[list[str], list[Any]]:
    """The WHERE conditions of `q` (joined with AND by the caller) and their parameters."""
    clauses: list[str] = []
    args: list[Any] = []
    if q.text:
        needle = ascii_lower(q.text)
        clauses.append("(" + " OR ".join(_contains(c, _lower(c, f"COALESCE({e}, '')")) for e in c.search) + ")")
        args += [needle] * len(c.search)
    if q.status:
        statuses = c.groups.get(q.status, (q.status,))
        clauses.append(f"{c.status} IN ({', '.join('?' for _ in statuses)})")
        args += list(statuses)
    if q.failed is not None:
        clauses.append(f"{c.status} <> 'completed'" if q.failed else f"{c.status} = 'completed'")
    if q.metric and q.value is not None:
        if q.op not in METRIC_OPS:
            raise ValueError(f"op must be one of {' '.join(METRIC_OPS)}, got {q.op!r}")
        if q.metric == "reward":
            clauses.append(f"{c.reward} {q.op} ?")
        else:
            clauses.append(f"{c.metric} {q.op} ?")
            args.append(q.metric)
        args.append(float(q.value))
    if q.meta is not None:
        clauses.append(f"{c.meta} = ?")
        args += [q.meta[0], q.meta[1]]
    return clauses, args


def sort_expression(c: SampleColumns, sort: str) -> tuple[str, list[Any]]:
    """The SQL of sort key `sort` (one of SAMPLE_SORTS or metric:<name>) and its parameters."""
    if sort.startswith("metric:"):
        name = sort[len("metric:") :]
        return (c.reward, []) if name == "reward" else (c.metric, [name])
    exprs = {"seq": c.seq, "id": c.id, "reward": c.reward, "status": c.status, "turns": c.turns,
             "tokens": c.tokens, "cost": c.cost, "time": c.time}  # fmt: skip
    if sort not in exprs:
        raise ValueError(f"sort must be one of {', '.join(SAMPLE_SORTS)} or metric:<name>, got {sort!r}")
    return exprs[sort], []


def sample_order(c: SampleColumns, q: SampleQuery) -> tuple[str, list[Any]]:
    """The ORDER BY of `q` (without the keywords) and its parameters."""
    expr, args = sort_expression(c, q.sort)
    direction = "DESC" if q.descending else "ASC"
    nulls = ""
    if c.postgres:  # SQLite's order: NULL is the smallest value
        nulls = " NULLS LAST" if q.descending else " NULLS FIRST"
    if q.sort in ("seq",):
        return f"{c.seq} {direction}", []
    return f"{expr} {direction}{nulls}, {c.seq} {direction}", args


@dataclass(frozen=True)
class CompiledSamples:
    """`count` and `page` statements of a sample query (`page` ends with LIMIT ? OFFSET ?)."""

    count: str
    count_args: list[Any]
    page: str
    page_args: list[Any]


def compile_samples(
    c: SampleColumns,
    q: SampleQuery,
    *,
    select: str,
    source: str,
    scope: Sequence[str] = (),
    scope_args: Sequence[Any] = (),
) -> CompiledSamples:
    """The statements counting and listing the samples of `q`: `select` is the column list,
    `source` the FROM clause, `scope` conditions always applied (e.g. the batch's id)."""
    clauses, args = sample_where(c, q)
    conds = [*scope, *clauses]
    where = (" WHERE " + " AND ".join(conds)) if conds else ""
    order, order_args = sample_order(c, q)
    base = [*scope_args, *args]
    return CompiledSamples(
        count=f"SELECT COUNT(*) FROM {source}{where}",
        count_args=base,
        page=f"SELECT {select} FROM {source}{where} ORDER BY {order} LIMIT ? OFFSET ?",
        page_args=[*base, *order_args],
    )


@dataclass(frozen=True)
class CompiledCompare:
    """Two runs joined on sample id: `counts` gives (shared, regressed, improved); `rows` gives
    (id, reward a, reward b, status a, status b), regressions first, then LIMIT ? OFFSET ?."""

    counts: str
    rows: str
    args: list[Any]


def compile_compare(x: SampleColumns, y: SampleColumns, *, join: str, join_args: Sequence[Any] = ()) -> CompiledCompare:
    """The compare statements; `x` and `y` are the two runs' columns (over the aliases the
    `join` clause gives them: `FROM ... x JOIN ... y ON <same id> WHERE ...`)."""
    delta = f"(COALESCE({y.reward}, 0) - COALESCE({x.reward}, 0))"
    return CompiledCompare(
        counts=f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN {delta} < 0 THEN 1 ELSE 0 END), 0), "
        f"COALESCE(SUM(CASE WHEN {delta} > 0 THEN 1 ELSE 0 END), 0) {join}",
        rows=f"SELECT {x.id}, {x.reward}, {y.reward}, {x.status}, {y.status} {join} "
        f"ORDER BY {delta} ASC, {x.seq} ASC LIMIT ? OFFSET ?",
        args=list(join_args),
    )
