"""evaluate() throughput: 1,000 single-turn samples, 100 at a time, against a local
OpenAI-compatible server that answers after 50 ms.

The ideal is 1000 / 100 x 50 ms = 0.5 s. The fake server (rollouts.testing.fake_server, real
HTTP + SSE) runs in a SUBPROCESS, so the CPU figures below are the client's alone: the real
OpenAI provider (`openai-compatible`) through both transports — the official SDK
(`transport="sdk"`) and the lean httpx2 transport (`transport="http"`) — plus our agent loop,
scoring (exact match on an <answer> tag) and writing every sample to samples.jsonl.

Each transport is timed `--repeats` times (best kept), then run once more under cProfile to show
where the client CPU goes, grouped by package (SDK, HTTP stack, trio, our loop, scoring, writing);
time in the standard library and C builtins (json, typing, re, ...) is charged to its callers.

The default path (an Endpoint with no `transport`: the lean transport for a self-hosted
server since `transport="auto"`) is timed as its own third path: `cpu_ms_per_sample_default`,
`ratio_to_ideal_default`. OpenTelemetry tracing (rollouts.tracing) is timed on the default path
too: `cpu_ms_per_sample_otel_off` (tracing off, as by default: the hooks' cost, compared with the
default path before they existed) and `cpu_ms_per_sample_otel_on` (on, spans made with the SDK
and batched to an exporter that drops them: the cost of tracing without the network).

Big runs (each in a fresh subprocess, so its peak RSS is its own): evaluate() over a lazily read
JSONL of `--big-samples` rows (100,000) and of a tenth of that (10,000), 1,000 in flight, through
the default path: `rss_mb_100k`, `cpu_ms_per_sample_100k`, `rss_mb_10k`, `cpu_ms_per_sample_10k`
(flat figures mean memory and per-sample CPU do not grow with the dataset). `--no-big` skips them.

Run: python benchmarks/evaluate.py [--samples 1000] [--concurrency 100] [--latency 0.05]
Last line: JSON with wall_s (best transport), wall_s_sdk, ideal_s, samples_per_s,
cpu_ms_per_sample (and per-transport details, the default path's and the big runs' figures).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from rollouts import Endpoint, EvalConfig, Message, evaluate
from rollouts.eval.scorers import combine, exact_match, extract_tag, metric

# --------------------------------------------------------------------------------------------
# The server (subprocess)
# --------------------------------------------------------------------------------------------


async def _serve(latency_s: float) -> None:
    from rollouts.testing.fake_server import RecordedRequest, open_fake_server

    def reply(request: RecordedRequest) -> str:
        content = request.json["messages"][-1]["content"]
        return f"The answer is <answer>{content.rsplit(' ', 1)[-1]}</answer>."

    # keep_requests=False: the server counts requests instead of keeping them. Kept, the 100,000
    # requests of the big run (after the 10,000 of the small one and those of the timed runs)
    # grew the server's heap by hundreds of MB, so its collector and its replies slowed down as
    # the runs went on; a slower server holds more of the client's requests open at once, and
    # the client's connection pools scan their connections on every request. So the 100k run
    # met a slower server than the 10k one, and the client's CPU per sample rose with the
    # dataset for a reason outside the client.
    async with open_fake_server(reply, latency_s=latency_s, chunk_size=8, keep_requests=False) as srv:
        print(srv.port, flush=True)
        # Run until the parent closes our stdin.
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        stats = {
            "max_in_flight": srv.max_in_flight,
            "requests": srv.request_count,
            "connections_opened": srv.connections_opened,
            "cpu_ms_per_request": round(time.process_time() * 1e3 / max(1, srv.request_count), 3),
        }
        print(json.dumps(stats), flush=True)


class _ServerProcess:
    def __init__(self, latency_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--latency", str(latency_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"fake server failed to start: {line!r}")
        self.port = int(line)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        stats = self.proc.stdout.readline()
        self.proc.wait(timeout=10)
        return json.loads(stats) if stats.strip() else {}


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


def _prepare(row: dict[str, Any]) -> list[Message]:
    return [Message("user", f"Answer with the number in an <answer> tag: {row['n']}")]


def _config(base_url: str, transport: str, concurrency: int, output_dir: str) -> EvalConfig:
    """`transport` is "sdk", "http" or "default" (no transport set: what a user gets; also
    "otel_off" and "otel_on")."""
    chosen: dict[str, Any] = {"transport": transport} if transport in ("sdk", "http") else {}
    return EvalConfig(
        endpoint=Endpoint("openai-compatible", "fake-model", api_base=base_url, api_key="sk-bench", **chosen),
        prepare_messages=_prepare,
        score_fn=combine(metric("correct", exact_match(extract=extract_tag("answer")), weight=1.0)),
        max_concurrent=concurrency,
        max_turns=1,
        output_dir=output_dir,
        eval_name=f"bench-{transport}",
        show_progress=False,
    )


def _rows(n: int) -> Any:
    return ({"n": i, "answer": str(i)} for i in range(n))  # lazy, as a real dataset would be


def _count_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as f:
        return sum(1 for _ in f)


def _tracer_provider() -> Any:
    """An SDK tracer provider batching spans to an exporter that drops them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return provider


async def _timed_run(base_url: str, transport: str, n: int, concurrency: int) -> dict[str, Any]:
    from rollouts import tracing

    provider = _tracer_provider() if transport == "otel_on" else None
    with tempfile.TemporaryDirectory() as out:
        config = _config(base_url, transport, concurrency, out)
        if provider is not None:
            tracing.enable_tracing(provider)
        cpu0, t0 = time.process_time(), time.perf_counter()
        try:
            report = await evaluate(_rows(n), config)
            if provider is not None:
                provider.force_flush()  # (the spans' export is part of the cost)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        finally:
            tracing.disable_tracing()
            if provider is not None:
                provider.shutdown()
        lines = _count_lines(Path(out) / "samples.jsonl")
    counts = report.summary["counts"]
    assert counts["completed"] == n, f"{transport}: {counts} — first error: {_first_error(report)}"
    assert report.summary["reward"]["mean"] == 1.0, "every answer should be scored correct"
    assert lines == n
    return {"wall_s": wall, "cpu_s": cpu}


async def _bare_http_run(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    """Reference floor: the same 1,000 streamed requests with a bare httpx2 client and no
    parsing beyond reading the bytes (what any httpx2-based transport costs at least)."""
    import httpx2

    limits = httpx2.Limits(max_connections=1000, max_keepalive_connections=1000)
    url = base_url + "/chat/completions"
    slots = trio.CapacityLimiter(concurrency)
    async with httpx2.AsyncClient(limits=limits, timeout=60) as client:

        async def one(i: int) -> None:
            body = {
                "model": "fake-model",
                "stream": True,
                "messages": [{"role": "user", "content": _prepare({"n": i})[0].text}],
            }
            async with slots, client.stream("POST", url, json=body) as response:
                async for _ in response.aiter_bytes():
                    pass

        cpu0, t0 = time.process_time(), time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"wall_s": wall, "cpu_s": cpu}


async def _scripted_run(n: int, concurrency: int, latency_s: float) -> dict[str, Any]:
    """Reference: the same evaluate() with a scripted model (no HTTP): our loop, scoring and
    writing alone."""
    from rollouts import ScriptedModel

    model = ScriptedModel(
        lambda req: f"The answer is <answer>{req.last_user_text.rsplit(' ', 1)[-1]}</answer>.",
        latency_s=latency_s,
        chunk_size=8,
    )
    with tempfile.TemporaryDirectory() as out:
        config = replace(_config("", "http", concurrency, out), endpoint=model.endpoint, eval_name="bench-scripted")
        cpu0, t0 = time.process_time(), time.perf_counter()
        report = await evaluate(_rows(n), config)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert report.summary["reward"]["mean"] == 1.0
    return {"wall_s": wall, "cpu_s": cpu}


def _first_error(report: Any) -> str | None:
    return next((s.error for s in report.samples if s.error), None)


_GROUPS = (
    ("openai SDK", ("/openai/",)),
    ("pydantic (SDK models)", ("/pydantic/", "/pydantic_core/")),
    ("HTTP stack (httpx2/httpcore2/h11/anyio)", ("/httpx", "/httpcore", "/h11/", "/anyio/", "/sniffio/", "/idna/")),
    ("trio", ("/trio/", "/outcome/")),
    ("rollouts lean transport + chat format", ("rollouts/providers/openai_http", "rollouts/providers/_chat_format")),
    ("rollouts provider glue (retry, aggregate)", ("rollouts/providers/",)),
    ("rollouts agent loop", ("rollouts/agents", "rollouts/dtypes", "rollouts/environments", "rollouts/run_config")),
    ("rollouts evaluate (loop, summary)", ("rollouts/eval/run", "rollouts/eval/summary", "rollouts/eval/progress")),
    ("scoring", ("rollouts/eval/scorers", "rollouts/eval/sample")),
    ("writing results (eval.io)", ("rollouts/eval/io",)),
)
_SYSCALLS = "system calls (socket send/recv, epoll)"
_SYSCALL_NAMES = ("'send'", "'recv", "'sendall'", "'poll'", "'epoll", "'write' of '_io", "'flush' of '_io")
_STDLIB = "other python"


def _group_of(func: tuple[str, int, str]) -> str:
    filename, _line, name = func
    for group, needles in _GROUPS:
        if any(n in filename for n in needles):
            return group
    if filename == "~" and any(s in name for s in _SYSCALL_NAMES):
        return _SYSCALLS
    return _STDLIB  # the standard library (json, typing, contextlib, ...) and C builtins


def _attribute(stats: dict[Any, Any]) -> dict[str, float]:
    """Self time per group, where the standard library and C builtins (json, typing, re,
    isinstance, ...) are charged to whoever called them (split by the caller's share, up the
    call chain until a named group), so "json" spent parsing SSE is counted as transport and
    json spent writing samples.jsonl as writing. What has no named caller stays "other python"."""
    memo: dict[Any, dict[str, float]] = {}

    def owners(func: Any, depth: int = 0) -> dict[str, float]:
        if func in memo:
            return memo[func]
        group = _group_of(func)
        if group != _STDLIB or depth > 8 or func not in stats:
            return {group: 1.0}
        memo[func] = {group: 1.0}  # a cycle through the stdlib stays where it is
        callers = stats[func][4]
        total = sum(v[2] for v in callers.values())
        if total <= 0:
            return {group: 1.0}
        out: dict[str, float] = {}
        for caller, v in callers.items():
            for g, share in owners(caller, depth + 1).items():
                out[g] = out.get(g, 0.0) + share * v[2] / total
        memo[func] = out
        return out

    groups: dict[str, float] = {}
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.items():
        for g, share in owners(func).items():
            groups[g] = groups.get(g, 0.0) + tottime * share
    return groups


async def _profiled_run(base_url: str, transport: str, n: int, concurrency: int) -> tuple[dict[str, float], list[str]]:
    prof = cProfile.Profile()
    with tempfile.TemporaryDirectory() as out:
        config = _config(base_url, transport, concurrency, out)
        prof.enable()
        await evaluate(_rows(n), config)
        prof.disable()
    st = pstats.Stats(prof)
    groups = _attribute(st.stats)  # type: ignore[attr-defined]
    total = sum(groups.values())
    shares = {g: t / total for g, t in sorted(groups.items(), key=lambda kv: -kv[1])}
    top = []
    entries = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]  # type: ignore[attr-defined]
    for (filename, line, fn), (_cc, nc, tottime, _ct, _callers) in entries:
        short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        top.append(f"    {tottime * 1e3 / n:7.3f} ms/sample  {nc:>7} calls  {short}:{line} {fn}")
    return shares, top


async def _client(args: argparse.Namespace) -> dict[str, Any]:
    # Import both provider paths up front so import time is not measured.
    import rollouts.providers.openai_chat
    import rollouts.providers.openai_http  # noqa: F401

    n, conc = args.samples, args.concurrency
    ideal = n / conc * args.latency
    server = _ServerProcess(args.latency)
    results: dict[str, Any] = {}
    try:
        # Warm-up (connections, lazy imports inside the SDK), not measured.
        await _timed_run(server.base_url, "http", min(n, 200), conc)
        await _timed_run(server.base_url, "sdk", min(n, 200), conc)
        # Interleaved (http, sdk, default, bare httpx2 in turn), so machine load hits all alike.
        paths = ("http", "sdk", "default", "otel_off", "otel_on")
        runs: dict[str, list[dict[str, Any]]] = {p: [] for p in (*paths, "bare")}
        for _ in range(args.repeats):
            for transport in paths:
                runs[transport].append(await _timed_run(server.base_url, transport, n, conc))
            runs["bare"].append(await _bare_http_run(server.base_url, n, conc))
        for transport in paths:
            best = min(runs[transport], key=lambda r: r["wall_s"])
            results[transport] = {
                "wall_s": best["wall_s"],
                "cpu_ms_per_sample": best["cpu_s"] * 1e3 / n,
                "samples_per_s": n / best["wall_s"],
                "ratio_to_ideal": best["wall_s"] / ideal,
                "all_wall_s": [round(r["wall_s"], 3) for r in runs[transport]],
            }
            r = results[transport]
            print(
                f"{transport:4s}: wall {r['wall_s']:.3f} s  ({r['samples_per_s']:.0f} samples/s, "
                f"{r['ratio_to_ideal']:.2f}x ideal {ideal:.2f} s)  client CPU {r['cpu_ms_per_sample']:.2f} ms/sample  "
                f"runs {r['all_wall_s']}"
            )
        scripted = await _scripted_run(n, conc, args.latency)
        bare = min(runs["bare"], key=lambda r: r["wall_s"])
        results["references"] = refs = {
            "scripted_wall_s": round(scripted["wall_s"], 3),
            "scripted_cpu_ms_per_sample": round(scripted["cpu_s"] * 1e3 / n, 3),
            "bare_httpx2_wall_s": round(bare["wall_s"], 3),
            "bare_httpx2_cpu_ms_per_request": round(bare["cpu_s"] * 1e3 / n, 3),
        }
        print(
            f"reference, evaluate() on a scripted model (our loop + scoring + writing, no HTTP): "
            f"wall {refs['scripted_wall_s']:.3f} s, CPU {refs['scripted_cpu_ms_per_sample']:.2f} ms/sample"
        )
        print(
            f"reference, bare httpx2 streaming the same requests (no parsing, no loop): "
            f"wall {refs['bare_httpx2_wall_s']:.3f} s, CPU {refs['bare_httpx2_cpu_ms_per_request']:.2f} ms/request"
        )
        breakdown: dict[str, dict[str, float]] = {}
        if not args.no_profile:
            for transport in ("http", "sdk"):
                shares, top = await _profiled_run(server.base_url, transport, n, conc)
                cpu = results[transport]["cpu_ms_per_sample"]
                print(f"\nwhere the client CPU goes ({transport}; cProfile self time, scaled to {cpu:.2f} ms/sample):")
                breakdown[transport] = {g: round(share * cpu, 3) for g, share in shares.items()}
                for g, share in shares.items():
                    if share >= 0.005:
                        print(f"  {share * 100:5.1f}%  {share * cpu:6.3f} ms  {g}")
                print("  top functions (profiled, so inflated):")
                print("\n".join(top))
        big = {} if args.no_big else _big_runs(server.base_url, args.big_samples, args.big_concurrency)
    finally:
        server_stats = server.stop()
    print(f"\nserver: {server_stats}")
    refs = results.pop("references")
    default = results.pop("default")
    otel_off, otel_on = results.pop("otel_off"), results.pop("otel_on")
    best_transport = min(results, key=lambda t: results[t]["wall_s"])
    best = results[best_transport]
    return {
        "wall_s": round(best["wall_s"], 4),
        "wall_s_sdk": round(results["sdk"]["wall_s"], 4),
        "ideal_s": round(ideal, 4),
        "samples_per_s": round(best["samples_per_s"], 1),
        "cpu_ms_per_sample": round(best["cpu_ms_per_sample"], 3),
        "best_transport": best_transport,
        "cpu_ms_per_sample_sdk": round(results["sdk"]["cpu_ms_per_sample"], 3),
        "samples_per_s_sdk": round(results["sdk"]["samples_per_s"], 1),
        "ratio_to_ideal": round(best["ratio_to_ideal"], 2),
        "ratio_to_ideal_sdk": round(results["sdk"]["ratio_to_ideal"], 2),
        "cpu_ms_per_sample_default": round(default["cpu_ms_per_sample"], 3),
        "ratio_to_ideal_default": round(default["ratio_to_ideal"], 2),
        "wall_s_default": round(default["wall_s"], 4),
        "cpu_ms_per_sample_otel_off": round(otel_off["cpu_ms_per_sample"], 3),
        "cpu_ms_per_sample_otel_on": round(otel_on["cpu_ms_per_sample"], 3),
        **big,
        "samples": n,
        "concurrency": conc,
        "latency_s": args.latency,
        "cpus": os.cpu_count(),
        "server_cpu_ms_per_request": server_stats.get("cpu_ms_per_request"),
        **refs,
        "cpu_ms_per_sample_by_part": breakdown,  # cProfile shares scaled to the measured CPU
    }


# --------------------------------------------------------------------------------------------
# Big runs: a lazily read JSONL, 1,000 in flight, each in its own process (peak RSS is its own)
# --------------------------------------------------------------------------------------------


def _write_rows(path: Path, n: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"n": i, "answer": str(i)}) + "\n")


def _big_runs(base_url: str, n: int, concurrency: int) -> dict[str, Any]:
    out: dict[str, Any] = {"big_samples": n, "big_concurrency": concurrency}
    with tempfile.TemporaryDirectory() as tmp:
        for rows, label in ((max(1, n // 10), "10k"), (n, "100k")):
            path = Path(tmp) / f"rows_{rows}.jsonl"
            _write_rows(path, rows)
            child = subprocess.run(
                [sys.executable, __file__, "--big-child", str(path), "--base-url", base_url]
                + ["--concurrency", str(concurrency)],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(child.stdout.strip().splitlines()[-1])
            print(
                f"big run, {rows} rows from a JSONL, {concurrency} in flight (default path): wall {r['wall_s']:.2f} s, "
                f"CPU {r['cpu_ms_per_sample']:.3f} ms/sample, peak RSS {r['rss_mb']:.0f} MB"
            )
            out[f"rss_mb_{label}"] = r["rss_mb"]
            out[f"cpu_ms_per_sample_{label}"] = r["cpu_ms_per_sample"]
            out[f"wall_s_{label}"] = r["wall_s"]
    return out


async def _big_child(rows_path: str, base_url: str, concurrency: int) -> dict[str, Any]:
    from rollouts.eval.io import load_jsonl

    with tempfile.TemporaryDirectory() as out:
        config = _config(base_url, "default", concurrency, out)
        cpu0, t0 = time.process_time(), time.perf_counter()
        report = await evaluate(load_jsonl(rows_path), config)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    n = report.summary["counts"]["completed"]
    assert n == _count_lines(Path(rows_path)), report.summary["counts"]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"wall_s": round(wall, 3), "cpu_ms_per_sample": round(cpu * 1e3 / n, 3), "rss_mb": round(rss_mb, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--latency", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--big-samples", type=int, default=100_000, help="rows of the big run (a tenth for the small one)")
    p.add_argument("--big-concurrency", type=int, default=1000)
    p.add_argument("--no-big", action="store_true", help="skip the big runs")
    p.add_argument("--big-child", help=argparse.SUPPRESS)
    p.add_argument("--base-url", help=argparse.SUPPRESS)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        trio.run(_serve, args.latency)
        return
    if args.big_child:
        print(json.dumps(trio.run(_big_child, args.big_child, args.base_url, args.concurrency)))
        return
    result = trio.run(_client, args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
