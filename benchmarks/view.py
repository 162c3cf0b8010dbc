"""`rollouts view` at scale: first pages of a 100,000-sample eval run and a 10,000-session store.

Generates (in a temporary directory, written in the on-disk formats through the library's own
`to_dict()`s) an eval run of N samples (samples.jsonl + report.json, ~0.8 kB a sample) and a
session store of M sessions (4 messages each), starts `rollouts view` on both in a subprocess
(cold: no index yet), and measures over HTTP:

* eval_first_page_ms / sessions_first_page_ms: the first request for the run page and the
  sessions list, right after the server starts (the index is being built: they are served
  from the first indexed batch);
* the same pages again once indexing has finished (`*_warm_ms`), a sorted and a filtered page
  of the run (`eval_sorted_page_ms`, `eval_search_page_ms`, over all N samples), a sample page
  from the middle of the file (`sample_page_ms`) and a session page;
* index_s: how long the server took to index everything;
* big_message_page_ms: a sample whose tool output is one 8 MB text, opened in headless Chromium
  (Debian's `chromium` driven by Playwright): navigation start to the `load` event (the page
  shows 20,000 characters of it and a "show all" link); `big_message_server_ms` the same page
  over HTTP alone;
* rss_mb: the server's peak resident memory (VmHWM) over the whole run.

Each timing is the median of `--repeats` requests (the first pages: one cold request).

Run: python benchmarks/view.py [--samples 100000] [--sessions 10000]
Last line: JSON with eval_first_page_ms, sessions_first_page_ms, sample_page_ms, big_message_page_ms,
rss_mb (and the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

from rollouts.dtypes import Completion, Endpoint, Message, TextContent, Trajectory, Usage
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.store.base import AgentSession, SessionStatus

ROOT = Path(__file__).resolve().parent.parent


def write_eval(out: Path, n: int) -> None:
    out.mkdir(parents=True)
    usage = Usage(input_tokens=420, output_tokens=35, cost_usd=0.0011)
    with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            correct = (i * 7919) % 10 < 6
            answer = str(i * 3)
            traj = Trajectory(
                messages=(
                    Message("system", "Answer with the number only."),
                    Message("user", f"What is {i} times 3? Think about it and answer."),
                    Message(
                        "assistant",
                        (TextContent(answer if correct else "I think it is 7"),),
                        provider="openai",
                        model="gpt-4.1",
                        usage=usage,
                    ),
                ),
                completions=(Completion("openai", "gpt-4.1", "stop", 2, 0.4 + (i % 50) / 100),),
            )
            s = Sample(
                id=f"s{i:06d}",
                input={"question": f"What is {i} times 3?", "answer": answer},
                trajectory=traj,
                score=Score((Metric("correct", float(correct), 1.0), Metric("chars", float(len(answer)), 0.0))),
                status="completed" if i % 97 else "failed",
                error=None if i % 97 else "tool crashed",
                metadata={"level": ("easy", "medium", "hard")[i % 3]},
            )
            f.write(json.dumps(s.to_dict(), separators=(",", ":")) + "\n")
    report = {"eval_name": "bench", "status": "completed", "started_at": "", "finished_at": "", "duration_s": 1.0,
              "reused": 0, "error": None, "output_dir": str(out), "config": {}, "summary": {}, "sample_ids": []}  # fmt: skip
    (out / "report.json").write_text(json.dumps(report))


def write_sessions(root: Path, m: int) -> None:
    root.mkdir(parents=True)
    ep = Endpoint("anthropic", "claude-sonnet-4-5")
    usage = Usage(input_tokens=800, output_tokens=120, cost_usd=0.004)
    for i in range(m):
        sid = f"20260101-{i // 3600:02d}{(i // 60) % 60:02d}{i % 60:02d}-{i:06d}-abcdef"
        d = root / sid
        d.mkdir()
        messages = [
            Message("user", f"Session {i}: please refactor module_{i % 500}.py"),
            Message(
                "assistant",
                (TextContent("Reading the file first."),),
                provider="anthropic",
                model="claude-sonnet-4-5",
                usage=usage,
            ),
            Message("tool", "def f(): pass\n" * 5, tool_call_id="c1"),
            Message(
                "assistant",
                (TextContent(f"Done with module_{i % 500}.py."),),
                provider="anthropic",
                model="claude-sonnet-4-5",
                usage=usage,
            ),
        ]
        with open(d / "messages.jsonl", "w", encoding="utf-8") as f:
            for msg in messages:
                f.write(json.dumps(msg.to_dict(), separators=(",", ":")) + "\n")
        status = (SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.ABORTED)[i % 3]
        meta = AgentSession(sid, ep, status=status, tags={"team": f"t{i % 7}"}, created_at="2026-01-01T00:00:00Z")
        (d / "session.json").write_text(json.dumps(meta.to_dict()))


BIG_MESSAGE_CHARS = 8_000_000
CHROMIUM = os.environ.get("ROLLOUTS_CHROMIUM", "/usr/bin/chromium")


def write_big_message(out: Path) -> None:
    """An eval run of one sample whose tool output is one 8 MB text (a repeated letter: the
    worst case for a browser laying out one unbroken word)."""
    out.mkdir(parents=True)
    traj = Trajectory(messages=(Message("user", "cat the log"), Message("tool", "A" * BIG_MESSAGE_CHARS, tool_call_id="c1"),
                                Message("assistant", (TextContent("It is a long log."),))))  # fmt: skip
    s = Sample(id="big", input={"question": "cat the log"}, trajectory=traj, status="completed")
    (out / "samples.jsonl").write_text(json.dumps(s.to_dict(), separators=(",", ":")) + "\n")


def browser_load_ms(url: str) -> float:
    """Navigation start to the `load` event of `url` in headless Chromium (the median of three)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            times = []
            for _ in range(3):
                page = browser.new_page()
                page.set_default_timeout(120_000)
                page.goto(url, wait_until="load")
                times.append(float(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")))
                page.close()
            return statistics.median(times)
        finally:
            browser.close()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed_get(client: httpx2.Client, path: str) -> float:
    t = time.perf_counter()
    r = client.get(path)
    ms = (time.perf_counter() - t) * 1000
    assert r.status_code == 200, (path, r.status_code, r.text[:500])
    return ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="rollouts-view-bench-") as tmp:
        base = Path(tmp)
        t = time.perf_counter()
        write_eval(base / "run", args.samples)
        write_sessions(base / "sessions", args.sessions)
        write_big_message(base / "big")
        size_mb = (base / "run" / "samples.jsonl").stat().st_size / 1e6
        print(f"generated {args.samples} samples ({size_mb:.0f} MB) and {args.sessions} sessions "
              f"in {time.perf_counter() - t:.1f}s", file=sys.stderr)  # fmt: skip

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "rollouts.cli", "view", str(base / "run"), str(base / "sessions"),
               str(base / "big"), "--cache-dir", str(base / "cache")]  # fmt: skip
        server_log = open(base / "server.log", "w")  # closed below
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=server_log, text=True, env=env)
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            url = line.split()[2]
            started = time.perf_counter()
            from rollouts.view.files import FilesCatalog

            run_id = FilesCatalog.run_id(base / "run")
            big_id = FilesCatalog.run_id(base / "big")
            with httpx2.Client(base_url=url, timeout=120) as client:
                eval_first = timed_get(client, f"/evals/{run_id}")
                sessions_first = timed_get(client, "/sessions")
                # wait for the index to finish (bounded: the benchmark gives up after 10 minutes)
                for _ in range(6000):
                    runs = client.get("/api/evals").json()
                    if all(r["indexed"] for r in runs) and any(r["n_samples"] == args.samples for r in runs):
                        break
                    time.sleep(0.1)
                index_s = time.perf_counter() - started

                def median(path: str) -> float:
                    return statistics.median(timed_get(client, path) for _ in range(args.repeats))

                sessions = client.get("/api/sessions?limit=1").json()
                sid = sessions["items"][0]["session_id"]
                out = {
                    "samples": args.samples,
                    "sessions": args.sessions,
                    "samples_jsonl_mb": round(size_mb, 1),
                    "eval_first_page_ms": round(eval_first, 1),
                    "sessions_first_page_ms": round(sessions_first, 1),
                    "index_s": round(index_s, 1),
                    "eval_first_page_warm_ms": round(median(f"/evals/{run_id}"), 1),
                    "eval_sorted_page_ms": round(median(f"/evals/{run_id}?sort=reward&order=desc&page=100"), 1),
                    "eval_search_page_ms": round(median(f"/evals/{run_id}?q=4242&failed=no"), 1),
                    "sessions_first_page_warm_ms": round(median("/sessions"), 1),
                    "sessions_search_ms": round(median("/sessions?q=module_42.py&status=failed"), 1),
                    "sample_page_ms": round(median(f"/evals/{run_id}/samples/s{args.samples // 2:06d}"), 1),
                    "session_page_ms": round(median(f"/sessions/{sid}"), 1),
                    "big_message_server_ms": round(median(f"/evals/{big_id}/samples/big"), 1),
                    "big_message_page_ms": round(browser_load_ms(f"{url.rstrip('/')}/evals/{big_id}/samples/big"), 1),
                    "sessions_total": sessions["total"],
                    "rss_mb": round(peak_rss_mb(server.pid), 1),
                }
        except BaseException:
            server.terminate()
            server.wait(timeout=30)
            print((base / "server.log").read_text()[-5000:], file=sys.stderr)
            raise
        finally:
            server.terminate()
            server.wait(timeout=30)
            server_log.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
