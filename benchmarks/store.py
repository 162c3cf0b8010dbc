"""FileSessionStore throughput and read latency, with SQLite as the reference in the same run.

* append 10,000 messages to one session with an fsync per message (`fsync_every=1`); one at a
  time with `fsync_every=100` (one fsync per 100 messages, plus one at close); and batched:
  `append_messages` of 100 messages at a time (one write and one fsync per batch);
* reference: the same 10,000 message JSON rows inserted into a SQLite table (stdlib sqlite3,
  WAL, synchronous=FULL) with one transaction per batch of 100;
* the two ways an append can run under trio: directly on the event loop (what the store does
  without an fsync) and through `trio.to_thread.run_sync` (what it does with one);
* load a 10,000-message session (`get`; next to it, `json.loads` of the same bytes alone, the
  floor for any JSON store in Python), and read a branch 10 levels deep (a 1,000-message
  root, each level adding 100 messages: 2,000 messages through 11 logs), next to a flat
  session of the same 2,000 messages.

The messages are a realistic mix: user text, assistant turns with thinking, text, a tool call
and usage, and tool results (about 400 bytes of JSON each).

Run: python benchmarks/store.py
Last line: JSON with append_per_s_fsync, append_per_s_fsync_every_100, append_per_s_batched,
sqlite_append_per_s, load_10k_ms, json_parse_10k_ms, branch10_read_ms (and the other figures).
Targets (issue 19): append_per_s_batched >= sqlite_append_per_s, load_10k_ms <= 2x
json_parse_10k_ms.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import trio

from rollouts import Endpoint, Message, TextContent, ThinkingContent, ToolCallContent, Usage
from rollouts.store import FileSessionStore, _log

N = 10_000
BATCH = 100
EP = Endpoint("anthropic", "claude-sonnet-4-5")


def _messages(n: int) -> list[Message]:
    out: list[Message] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(Message("user", f"Question {i}: what is {i} + {i * 7} times three, exactly?", timestamp="t"))
        elif kind == 1:
            out.append(
                Message(
                    "assistant",
                    (
                        ThinkingContent(f"I should add first, then multiply. Step {i}.", signature="c2lnbmF0dXJl" * 4),
                        TextContent("Let me compute that with the calculator."),
                        ToolCallContent(f"toolu_{i:08d}", "add", {"value": i * 7}),
                    ),
                    timestamp="2026-01-15T09:30:12.123456Z",
                    provider="anthropic",
                    model="claude-sonnet-4-5",
                    usage=Usage(1200 + i, 85, cache_read_tokens=1024, cost_usd=0.0042),
                    details={"finish_reason": "tool_use"},
                )
            )
        else:
            out.append(
                Message(
                    "tool",
                    f"Added {i * 7} to {i}. Current value: {i * 8}",
                    tool_call_id=f"toolu_{i - 1:08d}",
                    timestamp="2026-01-15T09:30:12.223456Z",
                    details={"tool_name": "add"},
                )
            )
    return out


async def _append_all(root: Path, messages: list[Message], fsync_every: int, batch: int = 1) -> tuple[float, str]:
    store = FileSessionStore(root, fsync_every=fsync_every)
    sid = (await store.create(endpoint=EP)).session_id
    t0 = time.perf_counter()
    if batch == 1:
        for m in messages:
            await store.append_message(sid, m)
    else:
        for start in range(0, len(messages), batch):
            await store.append_messages(sid, messages[start : start + batch])
    await store.aclose()
    return time.perf_counter() - t0, sid


def _sqlite_append(path: Path, messages: list[Message]) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE messages (session_id TEXT, idx INTEGER, data TEXT, PRIMARY KEY (session_id, idx))")
    t0 = time.perf_counter()
    for start in range(0, len(messages), BATCH):
        db.execute("BEGIN")
        for i, m in enumerate(messages[start : start + BATCH], start):
            data = json.dumps(m.to_dict(), ensure_ascii=False, separators=(",", ":"))
            db.execute("INSERT INTO messages VALUES (?, ?, ?)", ("s", i, data))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    db.close()
    return elapsed


async def _raw_appends(root: Path, messages: list[Message], via_thread: bool) -> float:
    """Appends without fsync, directly on the event loop or each through a worker thread."""
    store = FileSessionStore(root, fsync_every=0)
    sid = (await store.create(endpoint=EP)).session_id
    path = root / sid / "messages.jsonl"
    lines = [_log.encode_message(m) for m in messages]
    t0 = time.perf_counter()
    for data in lines:
        if via_thread:
            await trio.to_thread.run_sync(lambda d=data: _log.append(path, d, fsync=False, blocking=True))
        else:
            _log.append(path, data, fsync=False, blocking=False)
            await trio.lowlevel.cancel_shielded_checkpoint()
    return time.perf_counter() - t0


async def _median_ms(fn, repeats: int = 7) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


async def main() -> None:
    messages = _messages(N)
    size = sum(len(_log.encode_message(m)) for m in messages) / N
    print(f"{N} messages, {size:.0f} bytes of JSON each on average; batches of {BATCH}")
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=Path.home() if Path.home().is_dir() else None) as tmp:
        root = Path(tmp)
        t_fsync, _ = await _append_all(root / "fsync", messages, 1)
        t_every, _ = await _append_all(root / "every100", messages, BATCH)
        # The two figures compared are each the median of 3 runs, interleaved (one run is noisy).
        batched_runs, sqlite_runs = [], []
        for r in range(3):
            t, sid = await _append_all(root / f"batched{r}", messages, BATCH, batch=BATCH)
            batched_runs.append(t)
            sqlite_runs.append(_sqlite_append(root / f"reference{r}.sqlite", messages))
        t_batched, t_sqlite = statistics.median(batched_runs), statistics.median(sqlite_runs)
        t_direct = await _raw_appends(root / "direct", messages, via_thread=False)
        t_thread = await _raw_appends(root / "thread", messages, via_thread=True)
        results["append_per_s_fsync"] = round(N / t_fsync)
        results["append_per_s_fsync_every_100"] = round(N / t_every)
        results["append_per_s_batched"] = round(N / t_batched)
        results["sqlite_append_per_s"] = round(N / t_sqlite)
        results["append_per_s_direct_no_fsync"] = round(N / t_direct)
        results["append_per_s_thread_no_fsync"] = round(N / t_thread)

        store = FileSessionStore(root / "batched2")
        loaded = (await store.get(sid))[1]
        assert list(loaded) == messages, "the store must give back exactly what was appended"
        results["load_10k_ms"] = round(await _median_ms(lambda: store.get(sid)), 1)
        raw = (root / "batched2" / sid / "messages.jsonl").read_bytes()

        async def parse_only() -> None:
            json.loads(b"[" + raw[:-1].replace(b"\n", b",") + b"]")

        results["json_parse_10k_ms"] = round(await _median_ms(parse_only), 1)

        chain_store = FileSessionStore(root / "chain", fsync_every=0)
        session = (await chain_store.create(endpoint=EP)).session_id
        history = _messages(2_000)
        for m in history[:1_000]:
            await chain_store.append_message(session, m)
        for level in range(10):
            session = (await chain_store.branch(session, 1_000 + 100 * level)).session_id
            for m in history[1_000 + 100 * level : 1_100 + 100 * level]:
                await chain_store.append_message(session, m)
        assert list((await chain_store.get(session))[1]) == history
        flat = (await chain_store.create(endpoint=EP)).session_id
        for m in history:
            await chain_store.append_message(flat, m)
        results["branch10_read_ms"] = round(await _median_ms(lambda: chain_store.get(session)), 1)
        results["flat_2k_read_ms"] = round(await _median_ms(lambda: chain_store.get(flat)), 1)

    r = results
    print(f"append, fsync every message   {r['append_per_s_fsync']:>9,} msg/s")
    print(
        f"append, fsync every {BATCH:<4}      {r['append_per_s_fsync_every_100']:>9,} msg/s"
        f"   ({r['append_per_s_fsync_every_100'] / r['append_per_s_fsync']:.0f}x per-message fsync)"
    )
    print(f"append_messages, {BATCH} at a time {r['append_per_s_batched']:>9,} msg/s   (one write, one fsync each)")
    print(
        f"sqlite, 1 transaction / {BATCH:<4}  {r['sqlite_append_per_s']:>9,} msg/s"
        f"   (store batched / sqlite: {r['append_per_s_batched'] / r['sqlite_append_per_s']:.2f}x)"
    )
    print(
        f"append, no fsync, on the loop   {r['append_per_s_direct_no_fsync']:>9,} msg/s"
        f"   (through a thread: {r['append_per_s_thread_no_fsync']:,} msg/s, "
        f"{r['append_per_s_direct_no_fsync'] / r['append_per_s_thread_no_fsync']:.1f}x slower)"
    )
    print(
        f"load a 10,000-message session  {r['load_10k_ms']:>9} ms   (json.loads of the same bytes alone: "
        f"{r['json_parse_10k_ms']} ms, {r['load_10k_ms'] / r['json_parse_10k_ms']:.2f}x; the rest is building "
        "the Message objects)"
    )
    print(
        f"read a branch 10 levels deep   {r['branch10_read_ms']:>9} ms   (2,000 messages; the same flat: "
        f"{r['flat_2k_read_ms']} ms, {r['branch10_read_ms'] / r['flat_2k_read_ms']:.2f}x)"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    trio.run(main)
