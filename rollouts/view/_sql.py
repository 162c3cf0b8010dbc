"""The files catalog's sample and session indexes as SQL: where each field is (for the one
query compiler, rollouts.view.sql), and rows turned into catalog values."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rollouts.view.catalog import SampleRow, SessionQuery, SessionRow
from rollouts.view.sql import SampleColumns

# (read FROM sessions s; a session without a user message of its own, a branch, shows its parent's first one)
SESSION_COLS = (
    "s.id, s.status, s.model, s.provider, s.parent_id, s.branch_point, s.tags, s.created_at, s.updated_at, s.n_own, "
    "s.tokens, s.cost, s.errors, COALESCE(NULLIF(s.preview, ''), (SELECT p.preview FROM sessions p WHERE p.id = s.parent_id))"
)


# --------------------------------------------------------------------------------------------
# the files catalog's layout (rollouts.view._index)
# --------------------------------------------------------------------------------------------


def files_columns(alias: str = "") -> SampleColumns:
    """The columns of the files catalog's sample index (table `samples`), under `alias`."""
    a = f"{alias}." if alias else ""
    return SampleColumns(
        id=f"{a}id", seq=f"{a}seq", status=f"{a}status", reward=f"{a}reward", turns=f"{a}turns",
        tokens=f"{a}tokens", cost=f"{a}cost", time=f"{a}duration",
        metric=f"(SELECT value FROM json_each({a}metrics) WHERE key = ?)",
        meta=f"(SELECT value FROM json_each({a}metadata) WHERE key = ?)",
        search=(f"{a}search",), search_lowered=True,
        groups={"failed": ("failed", "provider_error"), "pending": ("pending",)},
    )  # fmt: skip


SAMPLE_COLS = "id, seq, status, reward, metrics, turns, tokens, cost, duration, error, input_text, response_text"


def sample_row(r: Sequence[Any]) -> SampleRow:
    return SampleRow(
        sample_id=r[0], seq=r[1], status=r[2], reward=r[3], metrics=json.loads(r[4] or "{}"), turns=r[5],
        tokens=r[6], cost_usd=r[7], duration_s=r[8], error=r[9], input_preview=(r[10] or "")[:300],
        response_preview=(r[11] or "")[:300],
    )  # fmt: skip


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
        clauses.append("(SELECT value FROM json_each(tags) WHERE key = ?) = ?")
        args.extend([q.tag[0], q.tag[1]])
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args
