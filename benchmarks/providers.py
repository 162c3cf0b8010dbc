"""What our provider layer costs on top of each provider SDK.

The fake provider server (`python -m rollouts.testing.fake_server`) runs in a SEPARATE process,
so `time.process_time()` here counts only client CPU.

1. Per-event CPU: one streamed reply of 10,000 text deltas, iterated (a) through the bare SDK
   stream (touching each delta's text) and (b) through our provider function (events built,
   aggregated into a Message, sent to a no-op on_chunk). Best of 5 alternating runs after a warm-up.
   `overhead_ratio_<provider>` = our CPU per event / bare SDK CPU per event (target <= 1.2).
2. Fan-out: 200 concurrent streams from a server that waits 100 ms before the first byte
   (short replies), through our layer (provider `openai`, Chat Completions through the openai
   SDK) vs through the bare openai SDK, one shared client each, fresh connections; median of 9
   rotating rounds (target: ours <= 1.3x the SDK's wall time). The ideal is the first-byte
   latency itself (0.1 s: every stream waits at once); both are reported against it. The lean
   HTTP transport (`Endpoint.transport="http"`) is measured too.

Providers are rows of `PROVIDERS`: add an entry (endpoint factory + bare-SDK streaming function)
to measure another one. Entries whose SDK is missing are skipped with a note.

Run: python benchmarks/providers.py [--deltas 10000] [--concurrency 200]
Last line: JSON with overhead_ratio_<provider>..., overhead_ratio_max, concurrent200_wall_s,
concurrent200_sdk_wall_s, concurrent200_ratio_to_sdk (plus per-event microseconds, the ideal
wall time and the lean transport's figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.events import ignore_chunk
from rollouts.providers import get_provider_function
from rollouts.providers._clients import client_scope

MESSAGES = (Message("user", "Stream, please."),)
FIRST_BYTE_S = 0.1  # the fan-out server's latency before the first byte: the ideal wall time


# --------------------------------------------------------------------------------------------
# Provider table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderEntry:
    """One provider to measure.

    `endpoint(url)` builds our Endpoint against the fake server at `url` (no path);
    `make_client(url)` builds the bare SDK client and `bare_stream(client)` streams one reply
    through it, touching each delta, returning the number of deltas seen; `close_client` closes it.
    """

    name: str
    endpoint: Callable[[str], Endpoint]
    make_client: Callable[[str], Any]
    bare_stream: Callable[[Any], Awaitable[int]]
    close_client: Callable[[Any], Awaitable[None]]


def _openai_client(url: str) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="bench", max_retries=0)


async def _openai_bare(client: Any) -> int:
    n = 0
    stream = await client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "user", "content": "Stream, please."}],
        stream=True,
        stream_options={"include_usage": True},
    )
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                n += 1
    return n


async def _close_openai(client: Any) -> None:
    await client.close()


PROVIDERS: list[ProviderEntry] = [
    ProviderEntry(
        "openai",
        lambda url: Endpoint("openai", "fake-model", api_base=f"{url}/v1", api_key="bench"),
        _openai_client,
        _openai_bare,
        _close_openai,
    ),
    ProviderEntry(
        "openai_compatible",
        lambda url: Endpoint("openai-compatible", "fake-model", api_base=f"{url}/v1", transport="sdk"),
        _openai_client,
        _openai_bare,
        _close_openai,
    ),
]


def _anthropic_client(url: str) -> Any:
    import anthropic

    return anthropic.AsyncAnthropic(base_url=url, api_key="bench", max_retries=0)


async def _anthropic_bare(client: Any) -> int:
    n = 0
    stream = await client.messages.create(
        model="fake-model", max_tokens=4096, messages=[{"role": "user", "content": "Stream, please."}], stream=True
    )
    async with stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta" and event.delta.text:
                n += 1
    return n


async def _responses_bare(client: Any) -> int:
    n = 0
    stream = await client.responses.create(model="fake-model", input="Stream, please.", stream=True)
    async with stream:
        async for event in stream:
            if event.type == "response.output_text.delta" and event.delta:
                n += 1
    return n


def _google_client(url: str) -> Any:
    import httpx2
    from google import genai
    from google.genai import types

    http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=1000))
    options = types.HttpOptions(
        base_url=url, httpx_async_client=http, timeout=120_000, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key="bench", http_options=options), http


async def _google_bare(client: Any) -> int:
    n = 0
    stream = await client[0].aio.models.generate_content_stream(model="fake-model", contents="Stream, please.")
    async for chunk in stream:
        if chunk.candidates and chunk.candidates[0].content.parts[0].text:
            n += 1
    return n


async def _close_google(client: Any) -> None:
    await client[1].aclose()


PROVIDERS += [
    ProviderEntry(
        "anthropic",
        lambda url: Endpoint("anthropic", "fake-model", api_base=url, api_key="bench"),
        _anthropic_client,
        _anthropic_bare,
        _close_openai,
    ),
    ProviderEntry(
        "openai_responses",
        lambda url: Endpoint("openai-responses", "fake-model", api_base=f"{url}/v1", api_key="bench"),
        _openai_client,
        _responses_bare,
        _close_openai,
    ),
    ProviderEntry(
        "google",
        lambda url: Endpoint("google", "fake-model", api_base=url, api_key="bench"),
        _google_client,
        _google_bare,
        _close_google,
    ),
]


# --------------------------------------------------------------------------------------------
# Fake server process
# --------------------------------------------------------------------------------------------


class ServerProcess:
    def __init__(self, *args: str) -> None:
        cmd = [sys.executable, "-m", "rollouts.testing.fake_server", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), f"fake server did not start: {line!r}"
        self.url = line.removeprefix("listening on ")

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


async def _cpu_per_event(fns: dict[str, Callable[[], Awaitable[int]]], repeats: int) -> dict[str, float]:
    """Best CPU seconds per delta of each function over `repeats` rounds, after one warm-up.
    The functions alternate within each round so that load changes on a shared machine hit
    all of them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        await fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            c0 = time.process_time()
            n = await fn()
            best[name] = min(best[name], (time.process_time() - c0) / max(1, n))
    return best


def _ours(entry: ProviderEntry, endpoint: Endpoint) -> Callable[[], Awaitable[int]]:
    fn = get_provider_function(endpoint.provider, endpoint.model)
    actor = Actor(Trajectory(MESSAGES), endpoint)

    async def run() -> int:
        result = await fn(actor, ignore_chunk)
        return len(result.trajectory.messages[-1].text) // 4  # 4 characters per delta

    return run


async def per_event(entry: ProviderEntry, url: str, repeats: int) -> dict[str, float]:
    client = entry.make_client(url)
    try:
        async with client_scope():
            best = await _cpu_per_event(
                {"bare": lambda: entry.bare_stream(client), "ours": _ours(entry, entry.endpoint(url))}, repeats
            )
    finally:
        await entry.close_client(client)
    return {"bare_us": best["bare"] * 1e6, "ours_us": best["ours"] * 1e6, "ratio": best["ours"] / best["bare"]}


async def per_event_http(url: str, repeats: int) -> dict[str, float]:
    endpoint = Endpoint("openai-compatible", "fake-model", api_base=f"{url}/v1", transport="http")
    async with client_scope():
        best = await _cpu_per_event({"ours": _ours(PROVIDERS[0], endpoint)}, repeats)
    return {"ours_us": best["ours"] * 1e6}


async def layer_only(n: int, repeats: int) -> float:
    """Microseconds per delta of our chunk translation + aggregation alone (pre-parsed chunks,
    no network): the floor of what our layer adds to any transport."""
    from rollouts.providers._aggregate import MessageBuilder
    from rollouts.providers._chat_format import ChatStreamTranslator

    chunks = [{"choices": [{"index": 0, "delta": {"content": "abcd"}, "finish_reason": None}]} for _ in range(n)]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    best = float("inf")
    for _ in range(repeats + 1):
        builder = MessageBuilder("bench", "m")

        async def emit(event: Any, builder: MessageBuilder = builder) -> None:
            builder.feed(event)
            await ignore_chunk(event)

        c0 = time.process_time()
        translator = ChatStreamTranslator(emit)
        for chunk in chunks:
            await translator.feed(chunk)
        await translator.finish()
        builder.finish()
        best = min(best, (time.process_time() - c0) / n)
    return best * 1e6


async def _fan_out(n: int, one: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return time.perf_counter() - t0


async def concurrent(entry: ProviderEntry, url: str, n: int, rounds: int) -> dict[str, float]:
    """Median wall time of each path over `rounds`; the order of the paths rotates every round
    so that load changes on a shared machine hit all of them alike (the median, not the best,
    because single runs swing by +-30% when other processes share the two cores)."""
    http_ep = Endpoint("openai-compatible", "fake-model", api_base=f"{url}/v1", transport="http")

    async def sdk() -> float:
        client = entry.make_client(url)
        try:
            return await _fan_out(n, lambda: entry.bare_stream(client))
        finally:
            await entry.close_client(client)

    async def ours() -> float:
        async with client_scope():
            return await _fan_out(n, _ours(entry, entry.endpoint(url)))

    async def http() -> float:
        async with client_scope():
            return await _fan_out(n, _ours(entry, http_ep))

    paths = [("sdk", sdk), ("ours", ours), ("http", http)]
    walls: dict[str, list[float]] = {name: [] for name, _ in paths}
    for r in range(rounds):
        for name, fn in paths[r % 3 :] + paths[: r % 3]:
            walls[name].append(await fn())
    return {name: statistics.median(w) for name, w in walls.items()}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {}
    ratios: dict[str, float] = {}
    floor = await layer_only(args.deltas, args.repeats)
    print(f"{'our layer alone':>20}: {floor:7.1f} us/event (translation + aggregation, no I/O)", flush=True)
    result["us_per_event_layer_only"] = round(floor, 2)
    with ServerProcess("--deltas", str(args.deltas), "--chunk-size", "4") as srv:
        for entry in PROVIDERS:
            r = await per_event(entry, srv.url, args.repeats)
            print(
                f"{entry.name:>20}: bare SDK {r['bare_us']:7.1f} us/event, ours {r['ours_us']:7.1f} us/event, "
                f"ratio {r['ratio']:.3f}",
                flush=True,
            )
            ratios[entry.name] = r["ratio"]
            result[f"us_per_event_bare_{entry.name}"] = round(r["bare_us"], 2)
            result[f"us_per_event_ours_{entry.name}"] = round(r["ours_us"], 2)
        h = await per_event_http(srv.url, args.repeats)
        print(f"{'lean http transport':>20}: ours {h['ours_us']:7.1f} us/event", flush=True)
        result["us_per_event_http_transport"] = round(h["ours_us"], 2)
    with ServerProcess("--text", "A short streamed answer for fan-out.", "--latency", str(FIRST_BYTE_S)) as srv:
        c = await concurrent(PROVIDERS[0], srv.url, args.concurrency, args.rounds)
    print(
        f"{args.concurrency} concurrent streams, {FIRST_BYTE_S * 1000:.0f} ms first byte (ideal {FIRST_BYTE_S:.3f} s): "
        f"bare SDK {c['sdk']:.3f} s, ours (SDK) {c['ours']:.3f} s, ours (lean http) {c['http']:.3f} s",
        flush=True,
    )
    for name, ratio in ratios.items():
        result[f"overhead_ratio_{name}"] = round(ratio, 3)
    result["overhead_ratio_max"] = round(max(ratios.values()), 3)
    result["concurrent200_wall_s"] = round(c["ours"], 3)
    result["concurrent200_sdk_wall_s"] = round(c["sdk"], 3)
    result["concurrent200_ratio_to_sdk"] = round(c["ours"] / c["sdk"], 3)
    result["concurrent200_http_wall_s"] = round(c["http"], 3)
    result["concurrent200_ideal_s"] = FIRST_BYTE_S
    result["concurrent200_ratio_to_ideal"] = round(c["ours"] / FIRST_BYTE_S, 3)
    result["concurrent200_sdk_ratio_to_ideal"] = round(c["sdk"] / FIRST_BYTE_S, 3)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deltas", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    result = trio.run(main_async, args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
