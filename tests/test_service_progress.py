"""When the service looks again, on trio's virtual clock: a batch's event stream
(rollouts.service.routing.progress_stream, rollouts.service.progress.BatchChanges), and an idle
SQLite worker (no NOTIFY: it watches the database files)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import trio
import trio.testing

from rollouts.service import accounts, queue
from rollouts.service.batch_tasks import BatchTasks
from rollouts.service.gepa_jobs import GEPAJobs
from rollouts.service.progress import BatchChanges
from rollouts.service.routing import progress_stream
from rollouts.service.store import Store
from rollouts.service.worker import Worker


class _Store:
    is_postgres = False


def _states(pendings: list[int]) -> tuple[list[float], Any]:
    polled: list[float] = []
    it = iter(pendings)

    async def poll() -> dict[str, Any]:
        polled.append(trio.current_time())
        return {"progress": {"pending": next(it)}}

    return polled, poll


async def _drain(stream: Any) -> list[bytes]:
    return [event async for event in stream]


def _paced(poll: Any) -> Any:
    """A stream without notifications: polls every 10 s, sooner by its pending count's rate."""
    return progress_stream(
        poll, lambda s: s["progress"]["pending"] == 0, 10.0, min_gap_s=1.0, pending=lambda s: s["progress"]["pending"]
    )


async def test_without_notifications_the_stream_looks_sooner_when_the_end_is_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 10 s between polls; 100 -> 60 pending in the first 10 s (4/s): the last 60 are due in 15 s,
    # so the next look is at half that, and so on (at the average rate since the first look).
    polled, poll = _states([100, 60, 30, 14, 0])
    t0 = trio.current_time()
    events = await _drain(_paced(poll))
    gaps = [round(b - a, 3) for a, b in itertools.pairwise([t0, *polled])][1:]
    assert gaps == [10.0, 7.5, 3.75, 1.73]  # (86 in 21.25 s: 14 due in 3.46 s)
    assert events[-1].startswith(b"event: done") and len(events) == 5


async def test_a_look_that_sees_no_progress_keeps_the_average_rate(autojump_clock: trio.testing.MockClock) -> None:
    # (outcomes are written in bursts: one look may see the same count as the one before)
    polled, poll = _states([100, 60, 60, 60, 0])
    await _drain(_paced(poll))
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(polled)]
    assert gaps == [10.0, 7.5, 10.0, 10.0]  # 40 in 17.5 s: 60 due in 26 s, beyond the poll


async def test_without_a_pending_count_the_stream_polls_at_its_pace(autojump_clock: trio.testing.MockClock) -> None:
    polled, poll = _states([100, 60, 30, 0])
    await _drain(progress_stream(poll, lambda s: s["progress"]["pending"] == 0, 10.0))
    assert [round(b - a, 3) for a, b in itertools.pairwise(polled)] == [10.0, 10.0, 10.0]


async def test_batch_changes_wait_returns_at_once_for_a_change_already_seen(
    autojump_clock: trio.testing.MockClock,
) -> None:
    changes = BatchChanges(_Store())  # type: ignore[arg-type]
    seen = changes.version("b1")
    changes._changed("b1")  # (what the listener does on a NOTIFY)
    t0 = trio.current_time()
    await changes.wait("b1", seen, 100.0)  # changed since `seen`: no wait
    assert trio.current_time() == t0
    await changes.wait("b2", changes.version("b2"), 100.0)  # no change: the timeout
    assert trio.current_time() == t0 + 100.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(changes.wait, "b1", changes.version("b1"), 100.0)
        await trio.sleep(1.0)
        changes._changed("b1")  # wakes the waiter
    assert trio.current_time() == t0 + 101.0


async def test_an_idle_sqlite_worker_wakes_when_another_process_commits(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Without NOTIFY, an idle worker looks again when the database files change (another
    process committed: a new batch, say), not at its next poll (10 minutes away here)."""
    store = await Store.open(f"sqlite:///{tmp_path / 'q.db'}")
    other = Store(f"sqlite:///{tmp_path / 'q.db'}")  # (another process's connection)
    try:
        worker = Worker(store, max_poll_s=600.0)
        woke: list[float] = []

        async def idle() -> None:
            await worker._sleep_until_changed(600.0)
            woke.append(trio.current_time())

        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle)
            await trio.sleep(5.0)
            assert woke == []  # nothing changed: still asleep
            other.call_sync(accounts.ensure_workspace, "w")  # a commit
        assert woke and woke[0] - t0 < 5.1
        await worker._sleep_until_changed(30.0)  # no change: the poll
        assert trio.current_time() - woke[0] >= 30.0
    finally:
        other.close()
        store.close()


async def test_a_sqlite_batch_stream_reports_done_when_another_process_finishes_it(tmp_path: Path) -> None:
    """On SQLite (no NOTIFY) a batch's event stream learns of the commit that finishes the
    batch from the database files and reports `done` at once, not at its next poll (10
    minutes away here). A commit that does not finish it (a claim) is checked and waited past;
    the result written right after it -- while the stream was busy checking -- is not missed.
    (The real clock: the stream reads the database in threads, which a virtual clock would
    jump past.)"""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = await Store.open(url)
    other = Store(url)  # (a worker process's connection)
    try:
        ws = other.call_sync(accounts.ensure_workspace, "w")
        agent = other.call_sync(accounts.create_agent, ws, "a", accounts.VersionSpec({"model": "openai/x"}))
        summary, _ = other.call_sync(
            queue.create_batch, workspace_id=ws, agent_id=agent["agent_id"], agent_version=1, system_prompt="",
            tasks=[("t0", {"user_message": "hi"}), ("t1", {"user_message": "hi"})], config={}, parallelism=2,
            timeout_per_task_ms=1000, deadline_s=3600,
        )  # fmt: skip
        bid = summary["batch_id"]
        changes = BatchChanges(store)
        events: list[bytes] = []
        done = trio.Event()

        async def poll() -> dict[str, Any] | None:
            batch = await store.read(queue.get_batch, ws, bid, 0, 0)
            return None if batch is None else {"progress": batch["progress"]}

        async def follow() -> None:
            async for event in progress_stream(
                poll, lambda s: s["progress"]["pending"] == 0, 600.0, changes=(changes, bid),
                pending=lambda s: s["progress"]["pending"], finished=lambda: store.read(queue.batch_finished, bid),
            ):  # fmt: skip
                events.append(event)
            done.set()

        with trio.fail_after(60):  # (the poll alone would take 600 s)
            async with trio.open_nursery() as nursery:
                await nursery.start(changes.run)
                nursery.start_soon(follow)
                await trio.sleep(0.3)
                claimed = other.call_sync(queue.claim, "w1", 2, 30.0)  # a change that does not finish it
                await trio.sleep(0.3)
                assert not done.is_set() and len(events) == 1  # (the first progress event)
                for task in claimed:  # two commits in a row: the second lands while the first is checked
                    outcome = queue.Outcome(task.batch_id, task.task_id, "completed", {"n": 1}, None, 1)
                    other.call_sync(queue.finish_many, [outcome])
                    await trio.sleep(0.01)
                await done.wait()
                nursery.cancel_scope.cancel()
        assert events[-1].startswith(b"event: done") and b'"pending":0' in events[-1]
        assert not changes._waiting  # nothing left watched for
    finally:
        other.close()
        store.close()


async def test_the_tasks_of_a_claim_read_their_batch_spec_once(autojump_clock: trio.testing.MockClock) -> None:
    """The tasks of one claim start together: one reads the batch's spec, the others wait for
    it (each reading it too cost a query per task at every batch's start); a failed read is not
    cached, and the next task reads it again."""
    reads: list[str] = []
    fail = [True]

    class _SpecStore:
        is_postgres = False

        async def read(self, fn: Any, batch_id: str) -> Any:
            reads.append(batch_id)
            await trio.sleep(1.0)
            if fail[0]:
                fail[0] = False
                raise RuntimeError("the database went away")
            return f"spec of {batch_id}"

    tasks = BatchTasks(_SpecStore())  # type: ignore[arg-type]
    got: list[Any] = []

    async def task() -> None:
        try:
            got.append(await tasks.spec("b1"))
        except RuntimeError as e:
            got.append(e)

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(task)
    # the first read failed: its task saw the error; the others waited, then one read again
    assert reads == ["b1", "b1"]
    assert sum(isinstance(g, RuntimeError) for g in got) == 1 and got.count("spec of b1") == 9
    assert await tasks.spec("b1") == "spec of b1" and len(reads) == 2  # cached


async def test_a_big_batch_far_from_its_end_is_polled_not_probed_on_every_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """On SQLite every commit of a run changes the database files: a stream whose batch has
    thousands of tasks left does not ask `finished()` at each of them (every open stream would);
    it polls at its pace, and watches for the end once the end is near."""
    changes = BatchChanges(_Store())  # type: ignore[arg-type]
    probes: list[float] = []
    polled, poll = _states([5000, 5000, 4000, 100, 0])

    async def finished() -> bool:
        probes.append(trio.current_time())
        return False

    async def commits() -> None:  # a commit every 10 ms, as during a run
        while True:
            await trio.sleep(0.01)
            changes._changed("b1")

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commits)
        await _drain(
            progress_stream(
                poll, lambda s: s["progress"]["pending"] == 0, 1.0, changes=(changes, "b1"),
                pending=lambda s: s["progress"]["pending"], finished=finished,
            )
        )  # fmt: skip
        nursery.cancel_scope.cancel()
    far = [p for p in probes if p < polled[3]]  # before the look that saw 100 left
    assert far == [] and probes  # probed only once near the end
    assert all(round(b - a, 3) >= 0.05 for a, b in itertools.pairwise(probes))  # at most every min_gap_s
    assert polled[:3] == [t0, t0 + 1.0, t0 + 2.0]


async def test_a_gepa_job_waits_on_its_batchs_changes_instead_of_polling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 32 item 5: a GEPA job polled its batch (a full read of its progress and results)
    at a backoff up to 0.5 s for as long as the batch ran; it now sleeps until the database says
    the batch changed (a worker's NOTIFY), asks with one index probe, and returns at once."""
    probes: list[float] = []
    finished = [False]

    class _ProbedStore(_Store):
        is_postgres = True  # (precise changes: the batch's end is notified)

        async def read(self, fn: Any, *args: Any) -> Any:
            assert fn is queue.batch_finished
            probes.append(trio.current_time())
            return finished[0]

    store = _ProbedStore()
    changes = BatchChanges(store)  # type: ignore[arg-type]
    jobs = GEPAJobs(store, changes=changes, poll_s=1.0)  # type: ignore[arg-type]

    async def the_batch_ends_after_30_s() -> None:
        await trio.sleep(30.0)
        finished[0] = True
        changes._changed("b1")  # (as the worker's NOTIFY does)

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(the_batch_ends_after_30_s)
        await jobs._wait_finished("b1")
    assert trio.current_time() - t0 == 30.0  # at once, not at the next look
    assert len(probes) <= 32  # at most one a second (the fallback for a missed NOTIFY)
