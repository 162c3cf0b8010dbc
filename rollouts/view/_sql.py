"""The SQL the files catalog runs over its indexes: columns, WHERE clauses and ORDER BY for the
queries pages make, and rows turned into catalog values. Every value reaches SQLite as a bound
parameter; the only text put into SQL is from fixed tables (sort columns, operators) or a JSON
path built from a key that cannot hold quotes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rollouts.view.catalog import METRIC_OPS, SAMPLE_SORTS, SampleQuery, SampleRow, SessionQuery, SessionRow

SESSION_COLS = "id, status, model, provider, parent_id, branch_point, tags, created_at, updated_at, n_own, tokens, cost, errors, preview"
SAMPLE_COLS = "id, seq, status, reward, metrics, turns, tokens, cost, duration, error, input_text, response_text"
SORT_COLUMNS = {"seq": "seq", "id": "id", "reward": "reward", "status": "status", "turns": "turns",
                 "tokens": "tokens", "cost": "cost", "time": "duration"}  # fmt: skip


def json_path(key: str) -> str:
    if '"' in key or "\\" in key:
        raise ValueError(f"{key!r}: a metric or metadata key for filtering cannot contain quotes or backslashes")
    return f'$."{key}"'


def session_row(r: Sequence[Any]) -> SessionRow:
    try:
        tags = json.loads(r[6] or "{}")
    except ValueError:
        tags = {}
    return SessionRow(
        session_id=r[0], status=r[1], model=r[2], provider=r[3], parent_id=r[4], branch_point=r[5],
        tags={str(k): str(v) for k, v in tags.items()}, created_at=r[7], updated_at=r[8],
        n_messages=(r[5] or 0) + r[9], tokens=r[10], cost_usd=r[11], errors=r[12], preview=r[13],
    )  # fmt: skip


def sample_row(r: Sequence[Any]) -> SampleRow:
    return SampleRow(
        sample_id=r[0], seq=r[1], status=r[2], reward=r[3], metrics=json.loads(r[4] or "{}"), turns=r[5],
        tokens=r[6], cost_usd=r[7], duration_s=r[8], error=r[9], input_preview=(r[10] or "")[:300],
        response_preview=(r[11] or "")[:300],
    )  # fmt: skip


def sample_where(q: SampleQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if q.text:
        clauses.append("instr(search, ?) > 0")
        args.append(q.text.lower())
    if q.status:
        clauses.append("status = ?")
        args.append(q.status)
    if q.failed is not None:
        clauses.append("failed = ?")
        args.append(int(q.failed))
    if q.metric and q.value is not None:
        if q.op not in METRIC_OPS:
            raise ValueError(f"op must be one of {METRIC_OPS}, got {q.op!r}")
        if q.metric == "reward":
            clauses.append(f"reward {q.op} ?")
        else:
            clauses.append(f"json_extract(metrics, ?) {q.op} ?")
            args.append(json_path(q.metric))
        args.append(q.value)
    if q.meta is not None:
        clauses.append("json_extract(metadata, ?) = ?")
        args.extend([json_path(q.meta[0]), q.meta[1]])
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def sample_order(q: SampleQuery) -> str:
    # ties in the same direction, so an index on (column, seq) serves the order both ways
    direction = "DESC" if q.descending else "ASC"
    if q.sort.startswith("metric:"):
        name = q.sort.split(":", 1)[1]
        path = json_path(name).replace("'", "''")
        return f"json_extract(metrics, '{path}') {direction}, seq {direction}"
    if q.sort not in SAMPLE_SORTS:
        raise ValueError(f"sort must be one of {SAMPLE_SORTS} or metric:<name>, got {q.sort!r}")
    if q.sort in ("seq", "id"):
        return f"{SORT_COLUMNS[q.sort]} {direction}"
    return f"{SORT_COLUMNS[q.sort]} {direction}, seq {direction}"


def session_where(q: SessionQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    args: list[Any] = []
    if q.text:
        clauses.append("instr(text, ?) > 0")  # the index keeps text lowercased
        args.append(q.text.lower())
    if q.status:
        clauses.append("status = ?")
        args.append(q.status)
    if q.model:
        clauses.append("model = ?")
        args.append(q.model)
    if q.tag is not None:
        clauses.append("json_extract(tags, ?) = ?")
        args.extend([json_path(q.tag[0]), q.tag[1]])
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args
