"""FilesCatalog and its indexes: incremental, crash-tolerant, pages served while indexing,
ids that never reach the file system."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from _view_data import EP, assistant, make_sample, write_eval

from rollouts.dtypes import Message
from rollouts.eval.io import SAMPLES_FILE, SampleLog, sample_to_line
from rollouts.store import FileSessionStore, SessionStatus
from rollouts.view import FilesCatalog, NotFound, SampleQuery, SessionQuery
from rollouts.view._index import EvalIndex


def test_eval_index_reads_only_what_was_appended_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / SAMPLES_FILE
    write_eval(tmp_path, [make_sample(i, True) for i in range(5)], "x", report=False)
    index = EvalIndex(tmp_path / "i.sqlite", path)
    assert index.update() is False
    assert index.state("lines") == 5 and index.state("end") == path.stat().st_size
    with path.open("a") as f:  # a writer killed mid-line
        f.write(sample_to_line(make_sample(5, False))[:40])
    index.update()
    assert index.state("lines") == 5 and index.up_to_date() is False
    with path.open("a") as f:  # ... and the line completed later
        f.write(sample_to_line(make_sample(5, False))[40:])
        f.write(sample_to_line(make_sample(2, False)))  # a rerun of q002: the last record wins
    index.update()
    with index.read() as db:
        rows = db.execute("SELECT id, seq, reward FROM samples ORDER BY seq").fetchall()
    assert [r[0] for r in rows] == ["q000", "q001", "q002", "q003", "q004", "q005"]  # q002 keeps its place
    assert rows[2][2] == 0.0
    assert index.up_to_date()


def test_eval_index_starts_over_when_the_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / SAMPLES_FILE
    write_eval(tmp_path, [make_sample(i, True) for i in range(6)], "x", report=False)
    index = EvalIndex(tmp_path / "i.sqlite", path)
    index.update()
    path.unlink()
    write_eval(tmp_path, [make_sample(i, False) for i in range(2)], "x", report=False)
    index.update()
    with index.read() as db:
        assert db.execute("SELECT count(*), max(reward) FROM samples").fetchone() == (2, 0.0)


def test_eval_index_steps_are_bounded(tmp_path: Path) -> None:
    write_eval(tmp_path, [make_sample(i, True) for i in range(30)], "x", report=False)
    index = EvalIndex(tmp_path / "i.sqlite", tmp_path / SAMPLES_FILE)
    assert index.update(budget=10) is True
    assert index.state("lines") == 10
    while index.update(budget=10):
        pass
    assert index.state("lines") == 30


async def test_first_page_is_served_while_a_big_run_is_being_indexed(tmp_path: Path) -> None:
    out = tmp_path / "big"
    log = SampleLog(out / SAMPLES_FILE)
    for i in range(5000):
        log.write(make_sample(i, i % 3 == 0))
    log.close()
    catalog = FilesCatalog([out], cache_dir=tmp_path / "cache")
    run = catalog.run_id(out)
    async with trio.open_nursery() as nursery:
        await nursery.start(catalog.run_indexer)
        page = await catalog.list_samples(run, SampleQuery(limit=50))
        assert [s.sample_id for s in page.items] == [f"q{i:03d}" for i in range(50)]
        nursery.cancel_scope.cancel()
    # the plain first page did not wait for the whole file: later calls finish the job
    await catalog.index_once()
    page = await catalog.list_samples(run, SampleQuery(offset=4990, limit=50))
    assert page.complete and page.total == 5000 and len(page.items) == 10


async def test_sessions_index_follows_appends_new_and_deleted_sessions(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    async with FileSessionStore(root, fsync_every=0) as store:
        s = await store.create(endpoint=EP)
        await store.append_message(s.session_id, Message("user", "first question"))
    catalog = FilesCatalog([root], cache_dir=tmp_path / "cache")
    page = await catalog.list_sessions(SessionQuery())
    assert [r.n_messages for r in page.items] == [1]
    async with FileSessionStore(root, fsync_every=0) as store:
        await store.append_message(s.session_id, assistant("an answer about zebras"))
        await store.update(s.session_id, status=SessionStatus.COMPLETED)
        t = await store.create(endpoint=EP)
    await catalog.index_once()
    page = await catalog.list_sessions(SessionQuery(text="ZEBRAS"))
    assert [(r.session_id, r.n_messages, r.status) for r in page.items] == [(s.session_id, 2, "completed")]
    assert (await catalog.list_sessions(SessionQuery())).total == 2
    for f in (root / t.session_id).iterdir():
        f.unlink()
    (root / t.session_id).rmdir()
    await catalog.index_once()
    assert [r.session_id for r in (await catalog.list_sessions(SessionQuery())).items] == [s.session_id]


async def test_session_transcript_window(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    async with FileSessionStore(root, fsync_every=0) as store:
        s = await store.create(endpoint=EP)
        for i in range(30):
            await store.append_message(s.session_id, Message("user", f"message {i}"))
    catalog = FilesCatalog([root], cache_dir=tmp_path / "cache")
    d = await catalog.get_session(s.session_id, offset=10, limit=5)
    assert [m.text for m in d.messages] == [f"message {i}" for i in range(10, 15)]
    assert d.n_messages == 30 and d.offset == 10


@pytest.mark.parametrize("bad", ["../x", "..", "a/b", "/etc/passwd", "", "x" * 300, "q\x00"])
async def test_ids_are_looked_up_never_joined_to_paths(tmp_path: Path, bad: str) -> None:
    write_eval(tmp_path / "run", [make_sample(0, True)], "x")
    catalog = FilesCatalog([tmp_path], cache_dir=tmp_path / "cache")
    with pytest.raises(NotFound):
        await catalog.get_session(bad)
    with pytest.raises(NotFound):
        await catalog.get_eval_run(bad)
    with pytest.raises(NotFound):
        await catalog.get_gepa_run(bad)
    with pytest.raises(NotFound):
        await catalog.get_sample(catalog.run_id(tmp_path / "run"), bad)


async def test_filter_keys_with_quotes_are_data_not_sql(tmp_path: Path) -> None:
    write_eval(tmp_path / "run", [make_sample(0, True)], "x")
    catalog = FilesCatalog([tmp_path], cache_dir=tmp_path / "cache")
    run = catalog.run_id(tmp_path / "run")
    for key in ('le"vel', "le'vel", "$.level", "le\\vel"):
        assert (await catalog.list_samples(run, SampleQuery(meta=(key, "hard")))).items == ()
        assert (await catalog.list_samples(run, SampleQuery(sort=f"metric:{key}"))).total == 1
    page = await catalog.list_samples(run, SampleQuery(meta=("level", "hard")))
    assert [s.sample_id for s in page.items] == ["q000"]
    assert json.loads(json.dumps(page.items[0].metrics)) == {"correct": 1.0, "length": 1.0}


async def test_runs_without_their_final_file_are_running_until_they_go_quiet(tmp_path: Path) -> None:
    from _view_data import write_gepa

    write_eval(tmp_path / "ev", [make_sample(0, True)], "x", report=False)
    write_gepa(tmp_path / "gp", finished=False, n=2)
    catalog = FilesCatalog([tmp_path], cache_dir=tmp_path / "cache")
    ev, gp = catalog.run_id(tmp_path / "ev"), catalog.run_id(tmp_path / "gp")
    assert (await catalog.get_eval_run(ev)).row.status == "running"
    assert (await catalog.get_gepa_run(gp)).row.status == "running"
    old = 1_700_000_000
    os.utime(tmp_path / "ev" / SAMPLES_FILE, (old, old))
    os.utime(tmp_path / "gp" / "state.json", (old, old))
    assert (await catalog.get_eval_run(ev)).row.status == "interrupted"
    assert (await catalog.get_gepa_run(gp)).row.status == "interrupted"


async def test_a_branch_in_the_sessions_list_shows_its_conversations_first_message_not_its_tool_result(
    tmp_path: Path,
) -> None:
    """Issue 33 item 15: a branch's own history starts mid-conversation (here with a tool
    result), and the list showed that as the branch's first message."""
    from _view_data import write_sessions

    parent, branch, _ = await write_sessions(tmp_path / "sessions")
    catalog = FilesCatalog([tmp_path / "sessions"], cache_dir=tmp_path / "cache")
    rows = {r.session_id: r for r in (await catalog.list_sessions(SessionQuery())).items}
    assert rows[parent].preview == "what is 7 + 5 * 3?"
    assert rows[branch].preview == "what is 7 + 5 * 3?"
    assert (await catalog.get_session(branch)).row.preview == "what is 7 + 5 * 3?"
