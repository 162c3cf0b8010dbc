"""One query compiler for every place samples are stored: the same `SampleQuery` gives the same
rows, in the same order, from the files catalog (`rollouts view` over samples.jsonl) and from the
service catalog (a batch's tasks, on SQLite and on a real PostgreSQL).

The fixture has every status group (completed, failed two ways, pending), metrics with plain and
awkward names (a quote, a backslash, one named like a JSON path), ties and missing values for
the sorts, and text in the input and in the response for the search cases (case, quotes,
LIKE's wildcards, non-ASCII letters, text that is only in the prompt or a metric's name)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _view_data import write_eval

from rollouts.dtypes import Completion, Message, TextContent, Trajectory, Usage
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.service import accounts, queue
from rollouts.service.accounts import VersionSpec
from rollouts.service.catalog import ServiceCatalog
from rollouts.service.store import Store
from rollouts.view import FilesCatalog
from rollouts.view.catalog import Catalog, SampleQuery


@dataclass(frozen=True)
class Case:
    id: str
    status: str  # completed | failed | timeout | pending
    question: str = ""
    answer: str = ""
    metrics: tuple[tuple[str, float], ...] = ()
    tokens: int = 0
    turns: int = 1
    ms: int = 0
    level: str = "easy"


WEIRD = 'we"ird\\name'
CASES = [
    Case(
        "c00",
        "completed",
        "What is 2 + 2?",
        "It is 4",
        (("exact", 1.0), ("len", 8.0), (WEIRD, 0.5)),
        30,
        2,
        900,
        "hard",
    ),
    Case(
        "c01", "completed", "Spell CAFÉ in lowercase", "café", (("exact", 0.0), ("len", 4.0), (WEIRD, 0.5)), 10, 1, 200
    ),
    Case(
        "c02",
        "completed",
        "Say hi",
        'I say "hi" to you',
        (("exact", 1.0), ("len", 17.0), (WEIRD, 2.0)),
        20,
        1,
        300,
        "hard",
    ),
    Case("c03", "completed", "100% sure?", "a_b is 100% sure", (("exact", 0.0), ("len", 16.0)), 20, 3, 300),
    Case(
        "c04", "completed", "What is 9 * 9?", "EIGHTY-ONE", (("exact", 1.0), ("len", 10.0), ("$.exact", 3.0)), 5, 1, 50
    ),
    Case("c05", "failed", "What is 7 - 7?", level="hard"),
    Case("c06", "timeout", "What is 1 / 0?"),
    Case("c07", "completed", "Name a colour", "Blue", (("exact", 0.5), ("len", 4.0)), 40, 2, 700, "hard"),
    Case("c08", "pending", "What is 3 + 3?"),
    Case("c09", "completed", "Lowest?", "zero", (("exact", 0.0), ("len", 4.0)), 10, 1, 200),
    Case("c10", "pending", "Say HI again", level="hard"),
]


def _score(c: Case) -> Score:
    return Score(tuple(Metric(n, v, 1.0 if n == "exact" else 0.0) for n, v in c.metrics))


def _trajectory(c: Case) -> Trajectory:
    usage = Usage(input_tokens=c.tokens // 2, output_tokens=c.tokens - c.tokens // 2, cost_usd=c.tokens / 1000)
    msgs = [Message("system", "Be exact_match and brief."), Message("user", c.question)]
    for t in range(c.turns):  # the tokens and cost on the last turn, the answer in it too
        last = t == c.turns - 1
        msgs.append(
            Message("assistant", (TextContent(c.answer if last else f"thinking {t}"),), usage=usage if last else None)
        )
        if not last:
            msgs.append(Message("user", "go on"))
    return Trajectory(messages=tuple(msgs), completions=(Completion("fake", "m", "stop", len(msgs) - 1, c.ms / 1000),))


def _files_sample(c: Case) -> Sample:
    done = c.status == "completed"
    return Sample(
        id=c.id,
        input={"user_message": c.question},
        trajectory=_trajectory(c) if done else None,
        score=_score(c) if done else None,
        status={"completed": "completed", "pending": "pending", "timeout": "provider_error"}.get(c.status, "failed"),  # type: ignore[arg-type]
        error=None if done else "it failed",
        metadata={"level": c.level},
    )


def _result(c: Case) -> dict[str, Any]:
    usage = Usage(input_tokens=c.tokens // 2, output_tokens=c.tokens - c.tokens // 2, cost_usd=c.tokens / 1000)
    return {"trajectory": _trajectory(c).to_dict(), "score": _score(c).to_dict(), "stop_reason": "completed",
            "usage": usage.to_dict(), "turns": c.turns}  # fmt: skip


QUERIES = [
    SampleQuery(),
    SampleQuery(descending=True),
    *(
        SampleQuery(sort=s, descending=d)
        for s in ("id", "reward", "status", "turns", "tokens", "cost", "time")
        for d in (False, True)
    ),
    *(
        SampleQuery(sort=f"metric:{m}", descending=d)
        for m in ("exact", "len", WEIRD, "$.exact", "reward", "nope")
        for d in (False, True)
    ),
    SampleQuery(status="completed"),
    SampleQuery(status="failed"),
    SampleQuery(status="pending"),
    SampleQuery(failed=True),
    SampleQuery(failed=False),
    *(
        SampleQuery(metric=m, op=op, value=v)
        for m, v in (("exact", 0.5), ("len", 8.0), (WEIRD, 0.5), ("reward", 0.5), ("$.exact", 3.0), ("nope", 0.0))
        for op in ("<", "<=", "=", ">=", ">")
    ),
    SampleQuery(meta=("level", "hard")),
    SampleQuery(meta=("level", "easy"), sort="reward", descending=True),
    SampleQuery(meta=('le"vel', "hard")),
    *(
        SampleQuery(text=t)
        for t in (
            "what is",
            "WHAT IS",
            "eighty",
            'say "hi"',
            "100%",
            "a_b",
            "%",
            "_",
            "café",
            "CAFÉ",
            "exact_match",
            "exact",
            "go on",
            "nothing like this",
            "hi",
        )
    ),
    SampleQuery(text="is", status="completed", metric="exact", op=">=", value=0.5, sort="tokens", descending=True),
    SampleQuery(offset=3, limit=4, sort="reward", descending=True),
    SampleQuery(offset=50, limit=4),
]


@pytest.fixture
async def catalogs(db_url: str, tmp_path: Path) -> AsyncIterator[tuple[Catalog, str, Catalog, str]]:
    write_eval(tmp_path / "run", [_files_sample(c) for c in CASES], "parity")
    files = FilesCatalog([tmp_path / "run"], cache_dir=tmp_path / "cache")
    store = await Store.open(db_url)
    try:
        ws = await store.call(accounts.ensure_workspace, "alpha")
        spec = VersionSpec(endpoint={"model": "openai-compatible/fake", "api_base": "http://127.0.0.1:9/v1"},
                           system_prompt="Be exact_match and brief.")  # fmt: skip
        agent = (await store.call(accounts.create_agent, ws, "solver", spec))["agent_id"]
        tasks = [(c.id, {"user_message": c.question, "context": {"level": c.level}}) for c in CASES]
        summary, _ = await store.call(
            queue.create_batch, workspace_id=ws, agent_id=agent, agent_version=1, system_prompt="Be exact_match.",
            tasks=tasks, config={}, parallelism=1, timeout_per_task_ms=1000, deadline_s=3600.0,
        )  # fmt: skip
        batch = str(summary["batch_id"])
        for c in CASES:
            if c.status == "pending":
                continue
            result = _result(c) if c.status == "completed" else None
            await store.call(queue.finish, batch, c.id, status=c.status, result=result, error=None if result else "it failed",
                             execution_time_ms=c.ms)  # fmt: skip
        yield files, files.run_id(tmp_path / "run"), ServiceCatalog(store, ws), batch
    finally:
        store.close()


async def test_the_same_sample_query_gives_the_same_rows_from_files_and_the_service(
    catalogs: tuple[Catalog, str, Catalog, str],
) -> None:
    files, run, service, batch = catalogs
    for q in QUERIES:
        a = await files.list_samples(run, q)
        b = await service.list_samples(batch, q)
        assert [s.sample_id for s in a.items] == [s.sample_id for s in b.items], q
        assert a.total == b.total, q
        assert [s.reward for s in a.items] == [s.reward for s in b.items], q
    # and the cases mean what the docs say
    ids = [s.sample_id for s in (await service.list_samples(batch, SampleQuery(text="WHAT IS"))).items]
    assert ids == ["c00", "c04", "c05", "c06", "c08"]
    assert (await service.list_samples(batch, SampleQuery(text="exact_match"))).total == 0  # the prompt: not searched
    assert (await service.list_samples(batch, SampleQuery(text="café"))).total == 1
    assert (await service.list_samples(batch, SampleQuery(status="failed"))).total == 2
    weird = await service.list_samples(batch, SampleQuery(metric=WEIRD, op=">", value=1.0))
    assert [s.sample_id for s in weird.items] == ["c02"]


async def test_the_same_comparison_from_files_and_the_service(
    catalogs: tuple[Catalog, str, Catalog, str],
) -> None:
    files, run, service, batch = catalogs
    a = await files.compare_runs(run, run)
    b = await service.compare_runs(batch, batch)
    assert (a.shared, a.regressed, a.improved) == (b.shared, b.regressed, b.improved) == (len(CASES), 0, 0)
    assert [r.sample_id for r in a.rows.items] == [r.sample_id for r in b.rows.items]
