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
