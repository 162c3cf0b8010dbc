"""The store across real processes: a writer killed with SIGKILL loses nothing it acknowledged,
two writers appending to one session never interleave lines, ids stay unique across processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from rollouts import Endpoint, Message
from rollouts.store import FileSessionStore, SessionRecoveryWarning

# Appends messages in a loop, printing "ack N" after append N returned. Every 5th message is
# large (256 KiB: many pages), so a kill can land in the middle of a write.
_WRITER = """
import sys, trio
from rollouts import Message
from rollouts.store import FileSessionStore

root, sid, fsync_every, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])

async def main():
    store = FileSessionStore(root, fsync_every=fsync_every)
    print("ready", flush=True)
    sys.stdin.readline()  # wait for "go" so writers start together
    for i in range(count):
        body = ("x" * 262144) if i % 5 == 4 else ""
        await store.append_message(sid, Message("user", f"{name}:{i}:" + body))
        print(f"ack {i}", flush=True)

trio.run(main)
"""


def _writer(root: Path, sid: str, fsync_every: int, name: str, count: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(root), sid, str(fsync_every), name, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "ready\n"
    return proc


def _go(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.mark.parametrize("fsync_every", [1, 0])
async def test_sigkill_while_appending_keeps_every_acknowledged_message(tmp_path: Path, fsync_every: int) -> None:
    store = FileSessionStore(tmp_path)
    sid = (await store.create(endpoint=Endpoint("openai", "gpt-4.1"))).session_id
    proc = _writer(tmp_path, sid, fsync_every, "w", 1_000_000)
    _go(proc)
    assert proc.stdout is not None
    acked = -1
    for _ in range(400 if fsync_every == 0 else 60):
        line = proc.stdout.readline()
        assert line.startswith("ack "), line
        acked = int(line.split()[1])
    os.kill(proc.pid, signal.SIGKILL)
    rest = proc.stdout.read()  # acks printed before the kill landed
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    for line in rest.splitlines():
        if line.startswith("ack "):
            acked = int(line.split()[1])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, messages = await store.get(sid)
    texts = [m.text.split(":")[1] for m in messages]
    # every acknowledged message, in order, nothing else but possibly the one being appended
    assert texts[: acked + 1] == [str(i) for i in range(acked + 1)]
    assert len(texts) in (acked + 1, acked + 2)
    assert all(issubclass(w.category, SessionRecoveryWarning) for w in caught)

    # the session takes appends again (a torn tail, if any, is cut first)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SessionRecoveryWarning)
        await store.append_message(sid, Message("user", "after:the kill"))
    _, again = await store.get(sid)
    assert again[-1].text == "after:the kill" and list(again[:-1]) == list(messages)


async def test_two_processes_appending_to_one_session_never_interleave(tmp_path: Path) -> None:
    store = FileSessionStore(tmp_path)
    sid = (await store.create(endpoint=Endpoint("openai", "gpt-4.1"))).session_id
    n = 150
    writers = [_writer(tmp_path, sid, 0, name, n) for name in ("a", "b")]
    for w in writers:
        _go(w)
    for w in writers:
        out, _ = w.communicate(timeout=120)
        assert w.returncode == 0
        assert out.count("ack ") == n

    raw = (tmp_path / sid / "messages.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.split(b"\n")[:-1]
    assert len(lines) == 2 * n
    seen: dict[str, list[int]] = {"a": [], "b": []}
    for line in lines:
        message = Message.from_dict(json.loads(line))  # every line is one whole message
        name, i, body = message.text.split(":")
        assert body == ("x" * 262144 if int(i) % 5 == 4 else "")
        seen[name].append(int(i))
    assert seen == {"a": list(range(n)), "b": list(range(n))}  # each writer's order kept
    assert len((await store.get(sid))[1]) == 2 * n


_CREATOR = """
import sys, trio
from rollouts import Endpoint
from rollouts.store import FileSessionStore

async def main():
    store = FileSessionStore(sys.argv[1])
    for _ in range(int(sys.argv[2])):
        print((await store.create(endpoint=Endpoint("openai", "gpt-4.1"))).session_id, flush=True)

trio.run(main)
"""


def _create_in_two_processes(root: Path, each: int) -> list[list[str]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", _CREATOR, str(root), str(each)], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return outs


async def test_ids_are_unique_across_processes_and_sort_by_creation(tmp_path: Path) -> None:
    outs = _create_in_two_processes(tmp_path, 40)
    ids = outs[0] + outs[1]
    assert len(set(ids)) == 80
    for out in outs:
        assert out == sorted(out)  # each process's sessions in creation order
    listed = await FileSessionStore(tmp_path).list()
    assert [s.session_id for s in listed] == sorted(ids, reverse=True)


# Continues a session the way `rollouts run --session` does: resume, add a user message, run
# the agent. Prints "resumed" after reading the session; with "wait" it then waits for a line on
# stdin before continuing; with "block" the model waits for a line on stdin (after printing
# "in model"). Ends printing "done" (exit 0) or "conflict: ..." (exit 3).
_CONTINUER = """
import sys, trio
from rollouts import Message, RunConfig, ScriptedModel, run_agent
from rollouts.store import FileSessionStore, SessionConflictError, resume_session

root, sid, name, wait, block = sys.argv[1:6]

async def reply(req):
    if block == "block":
        print("in model", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)
    return f"answer to {name}"

async def main():
    store = FileSessionStore(root)
    model = ScriptedModel(reply)
    state = await resume_session(store, sid, endpoint=model.endpoint)
    print("resumed", flush=True)
    if wait == "wait":
        await trio.to_thread.run_sync(sys.stdin.readline)
    try:
        await run_agent(state.with_messages(Message("user", f"question {name}")), RunConfig(session_store=store))
    except SessionConflictError as e:
        print(f"conflict: {e}", flush=True)
        sys.exit(3)
    print("done", flush=True)

trio.run(main)
"""


def _continuer(root: Path, sid: str, name: str, wait: str, block: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CONTINUER, str(root), sid, name, wait, block],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _expect(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == line


def _tell(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


async def _two_message_session(root: Path) -> str:
    store = FileSessionStore(root)
    s = await store.create(endpoint=Endpoint("scripted", "x"))
    await store.append_messages(s.session_id, [Message("user", "first"), Message("assistant", "reply")])
    return s.session_id


def _texts(root: Path, sid: str) -> list[str]:
    lines = (root / sid / "messages.jsonl").read_text().splitlines()
    return [Message.from_dict(json.loads(line)).text for line in lines if line.startswith('{"role"')]


async def test_item5_a_continuation_that_finds_the_session_grown_stops_and_loses_nothing(tmp_path: Path) -> None:
    """B reads the session, A continues it (its user message is recorded), then B continues:
    before, B saw the count it expected, skipped its own message and answered it anyway."""
    sid = await _two_message_session(tmp_path)
    b = _continuer(tmp_path, sid, "B", "wait", "free")
    _expect(b, "resumed")
    a = _continuer(tmp_path, sid, "A", "now", "block")
    _expect(a, "resumed")
    _expect(a, "in model")  # A's user message is recorded, its answer not yet
    _tell(b)
    out_b, _ = b.communicate(timeout=60)
    assert b.returncode == 3 and "conflict: session" in out_b and "continued elsewhere" in out_b, out_b
    _tell(a)
    out_a, _ = a.communicate(timeout=60)
    assert a.returncode == 0 and "done" in out_a, out_a
    assert _texts(tmp_path, sid) == ["first", "reply", "question A", "answer to A"]


async def test_item5_two_processes_continuing_one_session_never_interleave_turns(tmp_path: Path) -> None:
    """A is waiting for its model when B continues after A's user message: B's turn is recorded
    whole, and A's answer, which would now follow B's turn, is refused with a clear error."""
    sid = await _two_message_session(tmp_path)
    a = _continuer(tmp_path, sid, "A", "now", "block")
    _expect(a, "resumed")
    _expect(a, "in model")
    b = _continuer(tmp_path, sid, "B", "now", "free")
    out_b, _ = b.communicate(timeout=60)
    assert b.returncode == 0 and "done" in out_b, out_b
    _tell(a)
    out_a, _ = a.communicate(timeout=60)
    assert a.returncode == 3 and "conflict: session" in out_a and "nothing was written" in out_a, out_a
    # every acknowledged message, no turn split by another: A's question stays unanswered
    assert _texts(tmp_path, sid) == ["first", "reply", "question A", "question B", "answer to B"]
    store = FileSessionStore(tmp_path)
    session, _ = await store.get(sid)
    assert session.status.value == "completed"  # B's outcome; A's failure does not overwrite it
