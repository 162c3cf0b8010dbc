"""Where a sample's fields are in the service's `tasks` table: SQL over each task's result (JSON
text), per dialect (`json_extract` on SQLite, `jsonb` operators on PostgreSQL), for the viewer's
one query compiler (rollouts.view.sql): a batch's tasks filter and sort as a run's samples do."""

from __future__ import annotations

from rollouts.service import queue
from rollouts.service._db import Dialect
from rollouts.view.sql import SampleColumns

__all__ = ["metric", "reward", "sample_columns"]


def _jsonb(col: str) -> str:
    """The JSON text in `col` as jsonb, whatever text it holds: jsonb refuses the escapes `\\u0000`
    and lone surrogates, which a task's input or a model's reply may hold (the text column keeps
    them; here, for filtering and sorting only, they read as U+FFFD)."""
    return f"(regexp_replace({col}, '\\\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{{2}})', '\\\\ufffd', 'g'))::jsonb"


def _num(d: Dialect, col: str, *path: str) -> str:
    """A number inside the JSON text in `col` (NULL when absent)."""
    if d.is_postgres:
        return f"({_jsonb(col)} #>> '{{{','.join(path)}}}')::double precision"
    return f"json_extract({col}, '$.{'.'.join(path)}')"


def _text(d: Dialect, col: str, *path: str) -> str:
    if d.is_postgres:
        return f"({_jsonb(col)} #>> '{{{','.join(path)}}}')"
    return f"CAST(json_extract({col}, '$.{'.'.join(path)}') AS TEXT)"


def metric(d: Dialect, col: str) -> str:
    """The value of the metric named by the next placeholder, in a result's score."""
    if d.is_postgres:
        return (
            f"(SELECT (m->>'value')::double precision FROM jsonb_array_elements({_jsonb(col)} #> '{{score,metrics}}') m "
            "WHERE m->>'name' = ? LIMIT 1)"
        )
    return (
        f"(SELECT json_extract(m.value, '$.value') FROM json_each({col}, '$.score.metrics') m "
        "WHERE json_extract(m.value, '$.name') = ? LIMIT 1)"
    )


# Reward, tokens, turns and cost are columns written with each result (migration 4); rows
# written before it have NULLs there and are read from the result's JSON (COALESCE evaluates
# the JSON only for those).


def reward(d: Dialect, t: str = "t") -> str:
    return f"COALESCE({t}.reward, {_num(d, f'{t}.result', 'score', 'reward')})"


def _tokens(d: Dialect, t: str = "t") -> str:
    r = f"{t}.result"
    json_tokens = f"{_num(d, r, 'usage', 'input_tokens')} + COALESCE({_num(d, r, 'usage', 'output_tokens')}, 0)"
    return f"COALESCE({t}.tokens, {json_tokens})"


def _response(d: Dialect, col: str) -> str:
    """The text of the last assistant message of the result in `col` (its text blocks joined)."""
    if d.is_postgres:
        return (
            "(SELECT CASE jsonb_typeof(m.value -> 'content') WHEN 'string' THEN m.value ->> 'content' "
            "WHEN 'array' THEN (SELECT string_agg(b.value ->> 'text', '' ORDER BY b.i) "
            "FROM jsonb_array_elements(m.value -> 'content') WITH ORDINALITY AS b(value, i) "
            "WHERE b.value ->> 'type' = 'text') END "
            f"FROM jsonb_array_elements({_jsonb(col)} #> '{{trajectory,messages}}') WITH ORDINALITY AS m(value, i) "
            "WHERE m.value ->> 'role' = 'assistant' ORDER BY m.i DESC LIMIT 1)"
        )
    return (
        "(SELECT CASE json_type(m.value, '$.content') WHEN 'text' THEN json_extract(m.value, '$.content') "
        "WHEN 'array' THEN (SELECT group_concat(json_extract(b.value, '$.text'), '') "
        "FROM json_each(m.value, '$.content') b WHERE json_extract(b.value, '$.type') = 'text') END "
        f"FROM json_each({col}, '$.trajectory.messages') m "
        "WHERE json_extract(m.value, '$.role') = 'assistant' ORDER BY m.key DESC LIMIT 1)"
    )


def sample_columns(d: Dialect, t: str = "t") -> SampleColumns:
    """Where a sample's fields are in the `tasks` table (alias `t`), for the viewer's one query
    compiler (rollouts.view._sql): a batch's tasks filter and sort as a run's samples do."""
    if d.is_postgres:
        meta = f"({_jsonb(f'{t}.input')} -> 'context' ->> ?)"
    else:
        meta = f"(SELECT CAST(c.value AS TEXT) FROM json_each({t}.input, '$.context') c WHERE c.key = ?)"
    return SampleColumns(
        id=f"{t}.task_id",
        seq=f"{t}.seq",
        status=f"{t}.status",
        reward=reward(d, t),
        # (a task without a result has 0 of each, as a sample without a trajectory has in files)
        turns=f"COALESCE({t}.turns, {_num(d, f'{t}.result', 'turns')}, 0)",
        tokens=f"COALESCE({_tokens(d, t)}, 0)",
        cost=f"COALESCE({t}.cost_usd, {_num(d, f'{t}.result', 'usage', 'cost_usd')}, 0)",
        time=f"COALESCE({t}.execution_time_ms, 0)",
        metric=metric(d, f"{t}.result"),
        meta=meta,
        # the input's JSON, its user message decoded (non-ASCII text, quotes), the response
        search=(f"{t}.input", _text(d, f"{t}.input", "user_message"), _response(d, f"{t}.result")),
        groups={"failed": tuple(x for x in queue.FINISHED if x != "completed"), "pending": queue.PENDING},
        postgres=d.is_postgres,
    )
