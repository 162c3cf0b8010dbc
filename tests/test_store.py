"""FileSessionStore on real files: exact histories through branches, environment states at
branch points, listing, metadata, errors that name the fix, torn lines, fsync policy, no keys."""

# ruff: noqa: ASYNC240  (the tests look at the files on disk directly)

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import trio

from rollouts import Endpoint, ImageContent, Message, TextContent, ThinkingContent, ToolCallContent, Usage
from rollouts.store import (
    AgentSession,
    FileSessionStore,
    SessionConflictError,
    SessionCorruptError,
    SessionError,
    SessionNotFoundError,
    SessionRecoveryWarning,
    SessionStatus,
    SessionStore,
    _log,
    new_session_id,
)

SECRET = "sk-live-DO-NOT-STORE-0123456789abcdef"
EP = Endpoint("anthropic", "claude-sonnet-4-5", api_key=SECRET, thinking={"budget_tokens": 1024})


def _conversation(n: int, tag: str = "") -> list[Message]:
    """n messages of every kind (text, thinking, tool calls, tool results, images, usage)."""
    out: list[Message] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(Message("user", f"{tag}question {i} ünïcødé \n newline", timestamp=f"t{i}"))
        elif kind == 1:
            out.append(
                Message(
                    "assistant",
                    (
                        ThinkingContent(f"{tag}think {i}", signature="sig"),
                        TextContent(f"{tag}answer {i}"),
                        ToolCallContent(f"call_{tag}{i}", "add", {"value": i}),
                    ),
                    provider="anthropic",
                    model="claude-sonnet-4-5",
                    usage=Usage(10, 5, cost_usd=0.001),
                    details={"finish_reason": "tool_use"},
                )
            )
        elif kind == 2:
            out.append(
                Message("tool", f"{tag}result {i}", tool_call_id=f"call_{tag}{i - 1}", details={"tool_name": "add"})
            )
        else:
            out.append(Message("user", (TextContent(f"{tag}look {i}"), ImageContent(url="https://x.test/a.png"))))
    return out


async def _session_with(store: FileSessionStore, messages: list[Message], **kw: object) -> AgentSession:
    session = await store.create(endpoint=EP, **kw)  # type: ignore[arg-type]
    for m in messages:
        await store.append_message(session.session_id, m)
    return session


async def test_branches_at_several_points_read_back_exact_histories(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    root_msgs = _conversation(9)
    root = await _session_with(store, root_msgs)
    _, got = await store.get(root.session_id)
    assert list(got) == root_msgs

    for at in (0, 1, 4, 9):
        branch = await store.branch(root.session_id, at, tags={"at": str(at)})
        assert branch.parent_id == root.session_id and branch.branch_point == at
        own = _conversation(3, tag=f"b{at}-")
        for m in own:
            await store.append_message(branch.session_id, m)
        session, history = await store.get(branch.session_id)
        assert list(history) == root_msgs[:at] + own
        assert session.tags == {"at": str(at)}
        assert await store.message_count(branch.session_id) == at + 3
        # the branch stores only its own messages
        lines = (tmp_path / branch.session_id / "messages.jsonl").read_text().splitlines()
        assert len(lines) == 3
    # the parent is untouched
    assert list((await store.get(root.session_id))[1]) == root_msgs
    children = await store.list_children(root.session_id)
    assert [c.branch_point for c in children] == [0, 1, 4, 9]  # oldest first


async def test_branch_of_a_branch_of_a_branch(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    a_msgs = _conversation(6, "a")
    a = await _session_with(store, a_msgs)
    b = await store.branch(a.session_id, 4)
    b_own = _conversation(4, "b")
    for m in b_own:
        await store.append_message(b.session_id, m)
    c = await store.branch(b.session_id, 6)  # 4 from a, 2 of b's own
    c_own = _conversation(2, "c")
    for m in c_own:
        await store.append_message(c.session_id, m)
    d = await store.branch(c.session_id, 3)  # before c's (and b's) branch point: 3 of a's
    d_own = _conversation(1, "d")
    await store.append_message(d.session_id, d_own[0])

    assert list((await store.get(b.session_id))[1]) == a_msgs[:4] + b_own
    assert list((await store.get(c.session_id))[1]) == a_msgs[:4] + b_own[:2] + c_own
    assert list((await store.get(d.session_id))[1]) == a_msgs[:3] + d_own
    assert await store.messages(c.session_id, limit=5) == a_msgs[:4] + b_own[:1]
    assert [s.session_id for s in await store.list_children(b.session_id)] == [c.session_id]
    assert await store.list_children(d.session_id) == []
    # nothing was copied: each log holds only its own lines
    for s, n in ((a, 6), (b, 4), (c, 2), (d, 1)):
        assert len((tmp_path / s.session_id / "messages.jsonl").read_bytes().splitlines()) == n


async def test_environment_state_follows_the_position_in_the_log(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    s = await store.create(endpoint=EP, environment_type="m:Env", environment_state={"v": 0})
    for i in range(6):
        env = {"v": i + 1} if i in (1, 3) else None  # states after messages 2 and 4
        await store.append_message(s.session_id, Message("user", f"m{i}"), environment_state=env)
    assert (await store.get(s.session_id))[0].environment_state == {"v": 4}
    expected = {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 6: 4}
    for at, v in expected.items():
        branch = await store.branch(s.session_id, at)
        assert branch.environment_state == {"v": v}, at
        assert branch.environment_type == "m:Env"
        assert (await store.get(branch.session_id))[0].environment_state == {"v": v}
    # a snapshot written by update() counts from its position; update reports the latest state
    updated = await store.update(s.session_id, environment_state={"v": 99})
    assert updated.environment_state == {"v": 99}
    assert (await store.branch(s.session_id, 6)).environment_state == {"v": 99}
    assert (await store.branch(s.session_id, 5)).environment_state == {"v": 4}
    await store.append_message(s.session_id, Message("user", "m6"))
    again = await store.update(s.session_id, status=SessionStatus.COMPLETED)
    assert again.environment_state == {"v": 99} and again.status == "completed"


async def test_metadata_updates_are_atomic_and_merge_tags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileSessionStore(tmp_path)
    s = await store.create(endpoint=EP, tags={"a": "1"})
    assert s.status == SessionStatus.PENDING and s.created_at == s.updated_at
    u = await store.update(s.session_id, status=SessionStatus.RUNNING, tags={"b": "2"}, reward={"acc": 1.0})
    assert u.tags == {"a": "1", "b": "2"} and u.reward == {"acc": 1.0} and u.updated_at > s.updated_at
    assert (await store.get(s.session_id))[0] == u
    meta = tmp_path / s.session_id / "session.json"
    before = meta.read_bytes()

    def crash(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space"):
        await store.update(s.session_id, status=SessionStatus.FAILED)
    monkeypatch.undo()
    assert meta.read_bytes() == before  # the old metadata, whole
    assert sorted(p.name for p in meta.parent.iterdir()) == ["messages.jsonl", "session.json"]  # no temp file


async def test_list_filters_orders_and_limits(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    made = []
    for i in range(6):
        s = await store.create(endpoint=EP, tags={"group": "even" if i % 2 == 0 else "odd", "i": str(i)})
        if i in (1, 2):
            await store.update(s.session_id, status=SessionStatus.COMPLETED)
        made.append(s.session_id)
    newest_first = made[::-1]
    assert [s.session_id for s in await store.list()] == newest_first
    assert [s.session_id for s in await store.list(limit=2)] == newest_first[:2]
    assert [s.session_id for s in await store.list(tags={"group": "even"})] == [made[4], made[2], made[0]]
    assert [s.session_id for s in await store.list(tags={"group": "even", "i": "2"})] == [made[2]]
    assert [s.session_id for s in await store.list(status=SessionStatus.COMPLETED)] == [made[2], made[1]]
    pending = await store.list(status=[SessionStatus.PENDING, SessionStatus.COMPLETED], tags={"group": "odd"}, limit=2)
    assert [s.session_id for s in pending] == [made[5], made[3]]
    assert await store.list(tags={"group": "none"}) == []
    assert await FileSessionStore(tmp_path / "absent").list() == []

    # a damaged session is skipped (and reported), never breaking the listing
    (tmp_path / made[3] / "session.json").write_text("{not json")
    (tmp_path / "not-a-session.txt").write_text("x")
    with pytest.warns(SessionRecoveryWarning, match=made[3]):
        listed = await store.list()
    assert [s.session_id for s in listed] == [m for m in newest_first if m != made[3]]


def test_ids_sort_by_creation_time_and_are_unique() -> None:
    ids = [new_session_id() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


async def test_concurrent_creates_in_one_process_get_distinct_sessions(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    made: list[str] = []

    async def make() -> None:
        made.append((await store.create(endpoint=EP)).session_id)

    async with trio.open_nursery() as nursery:
        for _ in range(40):
            nursery.start_soon(make)
    assert len(set(made)) == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(made)


async def test_user_errors_name_the_session_and_the_fix(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    with pytest.raises(SessionNotFoundError, match=r"no session 'nope' in .*rollouts sessions list"):
        await store.get("nope")
    for bad in ("../etc", "a/b", "", ".hidden"):
        with pytest.raises(SessionNotFoundError, match="is not a session id"):
            await store.get(bad)
    with pytest.raises(SessionNotFoundError):
        await store.append_message("nope", Message("user", "x"))
    with pytest.raises(SessionNotFoundError):
        await store.update("nope", status=SessionStatus.FAILED)
    with pytest.raises(SessionNotFoundError):
        await store.branch("nope", 0)
    with pytest.raises(SessionNotFoundError):
        await store.list_children("nope")

    s = await _session_with(store, _conversation(3))
    for at in (-1, 4, 100):
        with pytest.raises(SessionError, match=r"at message -?\d+: it has 3 messages \(use 0\.\.3\)"):
            await store.branch(s.session_id, at)
    with pytest.raises(SessionError, match="it has 3 messages"):
        await store.create(endpoint=EP, parent_id=s.session_id, branch_point=7)
    with pytest.raises(ValueError, match="both parent_id and branch_point"):
        await store.create(endpoint=EP, parent_id=s.session_id)
    with pytest.raises(ValueError, match="fsync_every"):
        FileSessionStore(tmp_path, fsync_every=-1)

    meta = tmp_path / s.session_id / "session.json"
    meta.write_text('{"session_id": ')
    with pytest.raises(SessionCorruptError, match=r"session\.json is not valid JSON .* restore it from a backup"):
        await store.get(s.session_id)
    meta.write_text(json.dumps({"session_id": s.session_id}))
    with pytest.raises(SessionCorruptError, match="not valid session metadata"):
        await store.get(s.session_id)


async def test_a_torn_last_line_is_skipped_reported_and_cut_before_the_next_append(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    msgs = _conversation(5)
    s = await _session_with(store, msgs)
    log = tmp_path / s.session_id / "messages.jsonl"
    whole = log.read_bytes()
    torn = json.dumps(Message("user", "never acknowledged").to_dict()).encode()[:17]
    log.write_bytes(whole + torn)

    with pytest.warns(SessionRecoveryWarning, match=r"ignored an incomplete last line \(17 bytes\)"):
        _, got = await store.get(s.session_id)
    assert list(got) == msgs
    with pytest.warns(SessionRecoveryWarning):
        assert await store.message_count(s.session_id) == 5

    with pytest.warns(SessionRecoveryWarning, match=r"removed an incomplete last line \(17 bytes\)"):
        await store.append_message(s.session_id, Message("user", "after the crash"))
    assert log.read_bytes().startswith(whole) and not log.read_bytes()[len(whole) :].startswith(torn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # clean again: no warning
        _, got = await store.get(s.session_id)
    assert [m.text for m in got][-2:] == [msgs[-1].text, "after the crash"]

    # damage in the middle is not a crash: it is reported with the line number, not skipped
    lines = log.read_bytes().split(b"\n")
    lines[2] = b'{"role": "user", "content": "x"'
    log.write_bytes(b"\n".join(lines))
    with pytest.raises(SessionCorruptError, match=r"messages\.jsonl:3: not valid JSON"):
        await store.get(s.session_id)


async def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("messages.jsonl"):
            synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    for every, expected_appends, expected_close in ((1, 7, 0), (3, 2, 1), (0, 0, 1)):
        async with FileSessionStore(tmp_path, fsync_every=every) as store:
            s = await store.create(endpoint=EP)
            synced.clear()
            for i in range(7):
                await store.append_message(s.session_id, Message("user", str(i)))
            assert len(synced) == expected_appends, every
            synced.clear()
        assert len(synced) == expected_close, every  # aclose() syncs what is pending
        assert len((await store.get(s.session_id))[1]) == 7


async def test_an_append_is_all_or_nothing_under_cancellation(tmp_path: Path) -> None:
    for every in (0, 1):
        store = FileSessionStore(tmp_path, fsync_every=every)
        s = await store.create(endpoint=EP)
        with trio.CancelScope() as cs:
            cs.cancel()
            await store.append_message(s.session_id, Message("user", "never"))
        assert cs.cancelled_caught
        assert (tmp_path / s.session_id / "messages.jsonl").read_bytes() == b""
        with trio.CancelScope() as cs:
            await store.append_message(s.session_id, Message("user", "written"))
            cs.cancel()  # cancelled after the write: the message stays
        assert [m.text for m in (await store.get(s.session_id))[1]] == ["written"]


async def test_no_key_in_any_file_and_the_protocol_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileSessionStore(tmp_path)
    assert isinstance(store, SessionStore)
    s = await _session_with(store, _conversation(4), environment_type="m:E", environment_state={"k": 1})
    b = await store.branch(s.session_id, 2)
    await store.update(b.session_id, status=SessionStatus.COMPLETED, environment_state={"k": 2}, tags={"x": "y"})
    assert "api_key" not in s.to_dict()["endpoint"]
    assert s.endpoint.api_key == SECRET  # the object we passed in; the files never see it
    got, _ = await store.get(s.session_id)
    assert got.endpoint.api_key == "" and got.endpoint.thinking == {"budget_tokens": 1024}
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 4
    assert all(SECRET.encode() not in p.read_bytes() for p in files)
    assert all(p.stat().st_mode & 0o077 == 0 for p in files)  # private to the user

    monkeypatch.setenv("ROLLOUTS_SESSIONS_DIR", str(tmp_path / "from-env"))
    assert FileSessionStore().root == tmp_path / "from-env"
    assert FileSessionStore(tmp_path / "explicit").root == tmp_path / "explicit"
    monkeypatch.delenv("ROLLOUTS_SESSIONS_DIR")
    assert FileSessionStore().root == Path("~/.rollouts/sessions").expanduser()


async def test_item5_an_append_conditional_on_the_count_writes_nothing_when_the_session_grew(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    other = FileSessionStore(tmp_path)  # another writer (its own tail cache), as another process
    parent = await _session_with(store, _conversation(4))
    b = await store.branch(parent.session_id, 2)  # counts include the 2 messages read through the parent
    sid = b.session_id
    await store.append_message(sid, Message("user", "one"), expected_count=2)
    await store.append_messages(sid, [Message("assistant", "two"), Message("user", "three")], expected_count=3)
    await other.append_message(sid, Message("user", "from elsewhere"), expected_count=5)
    log = tmp_path / sid / "messages.jsonl"
    before = log.read_bytes()
    for stale in (5, 2, 9):
        with pytest.raises(SessionConflictError, match=rf"now holds 6 messages, not the {stale} this append expected"):
            await store.append_message(sid, Message("assistant", "stale"), expected_count=stale)
        with pytest.raises(SessionConflictError):
            await store.append_messages(sid, [Message("assistant", "a"), Message("user", "b")], expected_count=stale)
    assert log.read_bytes() == before
    await store.update(sid, environment_state={"k": 1})  # a snapshot line is not a message
    await store.append_message(sid, Message("assistant", "four"), expected_count=6)
    await store.append_message(sid, Message("user", "unconditional"))
    got = [m.text for m in (await store.get(sid))[1]]
    assert got[2:] == ["one", "two", "three", "from elsewhere", "four", "unconditional"]
    assert await store.message_count(sid) == 8


async def test_item19_append_messages_is_one_write_and_keeps_fsync_every(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    writes: list[int] = []
    real_fsync, real_write = os.fsync, os.write

    def is_log(fd: int) -> bool:
        return os.readlink(f"/proc/self/fd/{fd}").endswith("messages.jsonl")

    def counting_fsync(fd: int) -> None:
        if is_log(fd):
            synced.append(fd)
        real_fsync(fd)

    def counting_write(fd: int, data: bytes) -> int:  # type: ignore[override]
        if is_log(fd):
            writes.append(bytes(data).count(b"\n"))
        return real_write(fd, data)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(os, "write", counting_write)
    batches = (2, 3, 1, 4)  # 10 messages
    # a batch is fsynced when it brings the unsynced messages to fsync_every or more: never more
    # than fsync_every - 1 acknowledged messages wait for an fsync, as with one message at a time
    for every, expected_syncs, at_close in ((1, 4, 0), (3, 2, 0), (4, 2, 0), (6, 1, 1), (0, 0, 1)):
        async with FileSessionStore(tmp_path, fsync_every=every) as store:
            s = await store.create(endpoint=EP)
            synced.clear()
            writes.clear()
            n = 0
            for size in batches:
                batch = [Message("user", f"{n + i}") for i in range(size)]
                await store.append_messages(s.session_id, batch, environment_state={"n": n + size})
                n += size
            assert writes == list(batches), every  # one write per batch, whole lines
            assert len(synced) == expected_syncs, every
            synced.clear()
        assert len(synced) == at_close, every
        session, got = await store.get(s.session_id)
        assert [m.text for m in got] == [str(i) for i in range(10)] and session.environment_state == {"n": 10}


def test_item19_the_fast_codec_gives_exactly_what_to_dict_and_from_dict_give() -> None:
    from rollouts.store._codec import message_from_dict, message_to_dict

    extra = [
        Message("assistant", (TextContent(""),), usage=Usage()),  # an all-zero usage is falsy: None
        Message("assistant", ""),
        Message("user", (ImageContent(url="https://x/y.png"), TextContent("and this?"))),
        Message("tool", "out", tool_call_id="c1", details={"tool_name": "bash", "result": {"exit": [1, 2]}}),
    ]
    for m in [*_conversation(9), *extra]:
        assert json.dumps(message_to_dict(m)) == json.dumps(m.to_dict())  # same keys, same order
        line = _log.encode_message(m)
        fast, slow = message_from_dict(json.loads(line)), Message.from_dict(json.loads(line))
        assert fast == slow and repr(fast) == repr(slow) and hash(fast.role) == hash(slow.role)
        assert fast.to_dict() == slow.to_dict() and _log.encode_message(fast) == line
        assert [type(b) for b in fast.blocks] == [type(b) for b in slow.blocks]
    # the same leniency and the same errors as Message.from_dict
    assert message_from_dict({"role": "user", "future_field": 1}) == Message.from_dict(
        {"role": "user", "future_field": 1}
    )
    assert message_from_dict({"role": "user", "content": None}) == Message("user", "")
    for bad, error in (
        ({"content": "no role"}, TypeError),
        ({"role": "wizard", "content": "x"}, ValueError),
        ({"role": "tool", "content": "no call id"}, ValueError),
        ({"role": "user", "content": [{"type": "video"}]}, ValueError),
        ({"role": "user", "content": [{"type": "text", "text": "x", "bold": True}]}, TypeError),
        ({"role": "user", "content": [{"type": "image"}]}, ValueError),
        ({"role": "user", "content": ["just a string"]}, ValueError),
    ):
        with pytest.raises(error):
            message_from_dict(bad)


async def test_item19_appends_write_on_the_loop_and_only_the_fsync_goes_to_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[str] = []
    real = trio.to_thread.run_sync

    async def counting(fn, *args, **kw):  # type: ignore[no-untyped-def]
        hops.append(getattr(fn, "__name__", "?"))
        return await real(fn, *args, **kw)

    for every, expected in ((0, []), (5, ["fsync_file", "fsync_file"])):
        store = FileSessionStore(tmp_path, fsync_every=every)
        sid = (await store.create(endpoint=EP)).session_id
        monkeypatch.setattr(trio.to_thread, "run_sync", counting)
        hops.clear()
        for i in range(10):  # conditional, as the agent loop appends
            await store.append_message(sid, Message("user", str(i)), expected_count=i)
        assert hops == expected, every
        monkeypatch.setattr(trio.to_thread, "run_sync", real)
        assert len((await store.get(sid))[1]) == 10


async def test_item19_a_log_is_read_in_chunks_with_exact_messages_and_bad_lines_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_log, "_CHUNK", 700)  # a few lines per chunk: every case crosses chunk boundaries
    store = FileSessionStore(tmp_path, fsync_every=0)
    msgs = _conversation(60)
    s = await store.create(endpoint=EP, environment_state={"step": 0})
    for start in range(0, 60, 7):  # snapshots at known positions, inside and across chunks
        await store.append_messages(
            s.session_id, msgs[start : start + 7], environment_state={"step": min(start + 7, 60)}
        )
    session, got = await store.get(s.session_id)
    assert list(got) == msgs and session.environment_state == {"step": 60}
    assert (await store.messages(s.session_id, 23)) == msgs[:23]
    # a branch at 23 restores the state recorded at 21 (the last one at or before it)
    assert (await store.branch(s.session_id, 23)).environment_state == {"step": 21}

    log = tmp_path / s.session_id / "messages.jsonl"
    good = log.read_bytes()
    lines = good.split(b"\n")
    assert len(good) > 10 * _log._CHUNK
    for lineno, bad, error in (
        (2, b"", r":2: not valid JSON"),  # an empty line
        (40, b'{"role": "user", "content": "x"', r":40: not valid JSON"),
        (41, b'{"role": "user", "content": "x"}, {"role": "user", "content": "y"}', r":41: not valid JSON"),
        (len(lines) - 1, b"[1, 2]", rf":{len(lines) - 1}: not a JSON object"),
        (33, b'{"role": "wizard", "content": "x"}', r":33: not a valid message \(Message\.role must be one of"),
        (34, b'{"note": 1}', r":34: not a message or an environment snapshot"),
    ):
        damaged = list(lines)
        damaged[lineno - 1] = bad
        log.write_bytes(b"\n".join(damaged))
        with pytest.raises(SessionCorruptError, match=r"messages\.jsonl" + error):
            await store.get(s.session_id)
    log.write_bytes(good)
    assert list((await store.get(s.session_id))[1]) == msgs


async def test_item19_loaded_messages_are_frozen_and_the_collector_is_left_as_it_was(tmp_path: Path) -> None:
    import gc

    from rollouts.frozen import FrozenDict, FrozenList

    store = FileSessionStore(tmp_path, fsync_every=0)
    nested = Message("tool", "r", tool_call_id="c", details={"tool_name": "t", "result": {"rows": [[1, {"a": 2}]]}})
    msgs = [*_conversation(8), nested]
    s = await store.create(endpoint=EP)
    await store.append_messages(s.session_id, msgs)
    got = (await store.get(s.session_id))[1]
    assert list(got) == msgs
    result = got[-1].details["result"]  # type: ignore[index]
    assert type(got[-1].details) is FrozenDict and type(result) is FrozenDict
    assert type(result["rows"]) is FrozenList and type(result["rows"][0][1]) is FrozenDict
    with pytest.raises(TypeError, match="read-only"):
        result["rows"][0].append(3)
    call = got[1].blocks[2]
    assert isinstance(call, ToolCallContent) and type(call.arguments) is FrozenDict
    with pytest.raises(TypeError, match="read-only"):
        call.arguments["value"] = 2  # type: ignore[index]

    # a big log's objects go to the collector's oldest generation, not its youngest
    assert gc.isenabled()
    big = await store.create(endpoint=EP)
    await store.append_messages(big.session_id, _conversation(3000))
    _, got = store._get_sync(big.session_id)
    young = {id(o) for o in gc.get_objects(0)} | {id(o) for o in gc.get_objects(1)}
    assert gc.is_tracked(got[1]) and id(got[1]) not in young and gc.isenabled() and gc.get_freeze_count() == 0
    assert any(o is got[1] for o in gc.get_objects(2))
    # objects the process froze itself stay frozen (in no generation); a disabled collector stays disabled
    marker: list[object] = [object()]
    gc.freeze()
    try:
        assert list(store._get_sync(s.session_id)[1]) == msgs and gc.get_freeze_count() > 0
        assert not any(o is marker for o in gc.get_objects())
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        assert list(store._get_sync(s.session_id)[1]) == msgs and not gc.isenabled()
    finally:
        gc.enable()


def test_item19_freeze_json_makes_what_freeze_makes() -> None:
    from rollouts.frozen import freeze, freeze_json

    for value in ({"a": [1, {"b": [2.5, None, True]}], "c": {}}, [], [[{}]], {"x": "y"}, "s", 3, None):
        fast, slow = freeze_json(json.loads(json.dumps(value))), freeze(json.loads(json.dumps(value)))
        assert fast == slow == value and repr(fast) == repr(slow)

        def types(v: object) -> object:
            if isinstance(v, dict):
                return (type(v), {k: types(x) for k, x in v.items()})
            if isinstance(v, list):
                return (type(v), [types(x) for x in v])
            return type(v)

        assert types(fast) == types(slow)
