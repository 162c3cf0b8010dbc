"""The embedded local model through our provider versus the engine's server called bare.

Both paths hit the same in-process llama.cpp server (started once, not timed here) with the same
request body, alternating run by run so background load hits both alike:

* ours: `rollout()` with `Endpoint("local", ...)` (events, aggregation, Message/Usage), through
  the official SDK (`transport="sdk"`, the default) and the lean transport (`transport="http"`);
* bare: httpx2 streaming the SSE lines and nothing else (the reference: our layer can only
  add to it).

Generation: a short prompt whose answer runs past the 128-token limit (counting to 300), tokens/s
measured after the first token. (llama.cpp's `ignore_eos` would force the length, but this
build drops the connection when a chat request sets it.) Prompt processing: a ~700-token prompt made unique per run (so the prompt cache
cannot help) and one output token; tokens/s = prompt tokens / time to first token.
Figures are medians over the runs. The machine's other load matters a lot (llama.cpp uses every
core): read the ratios, not the absolute numbers, on a busy machine.

Run: python benchmarks/local_model.py [--runs N]
Last line: JSON with gen_tok_s, prompt_tok_s, bare_gen_tok_s, ttft_s (and the rest).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

import httpx2
import trio

from rollouts import Actor, Endpoint, Message, Trajectory
from rollouts.agents import rollout
from rollouts.events import StreamEvent, TextDelta
from rollouts.local_model import ensure_local_server
from rollouts.providers import client_scope

GEN_TOKENS = 128
GEN_PROMPT = "Count from 1 to 300, separated by commas, and write nothing else."  # never stops early
LONG_PROMPT = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(60)) + " Summarise."


def _endpoint(transport: str) -> Endpoint:
    return Endpoint(
        "local",
        "qwen2.5-coder-0.5b",
        temperature=0.0,
        max_tokens=GEN_TOKENS,
        transport=transport,  # type: ignore[arg-type]
    )


async def _ours(transport: str, prompt: str, max_tokens: int) -> dict[str, float]:
    started = time.perf_counter()
    first: list[float] = []

    async def on_chunk(event: StreamEvent) -> None:
        if isinstance(event, TextDelta) and not first:
            first.append(time.perf_counter())

    actor = Actor(Trajectory((Message("user", prompt),)), replace(_endpoint(transport), max_tokens=max_tokens))
    new = await rollout(actor, on_chunk)
    end = time.perf_counter()
    usage = new.trajectory.messages[-1].usage
    assert usage is not None and usage.output_tokens > 0
    return _figures(started, first[0] if first else end, end, usage.input_tokens + usage.cache_read_tokens,
                    usage.output_tokens)  # fmt: skip


async def _bare(client: httpx2.AsyncClient, api_base: str, prompt: str, max_tokens: int) -> dict[str, float]:
    body = {
        "model": "qwen2.5-coder-0.5b",
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    started = time.perf_counter()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with client.stream("POST", f"{api_base}/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    return _figures(started, first or end, end, usage["prompt_tokens"], usage["completion_tokens"])


def _figures(started: float, first: float, end: float, prompt_tokens: int, output_tokens: int) -> dict[str, float]:
    ttft = first - started
    return {
        "ttft_s": ttft,
        "prompt_tok_s": prompt_tokens / ttft,
        "gen_tok_s": (output_tokens - 1) / (end - first) if end > first else 0.0,
        "output_tokens": output_tokens,
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


async def main(runs: int) -> None:
    t0 = time.perf_counter()
    server = await ensure_local_server(progress=lambda line: print(f"  {line}"))
    print(f"server ready in {time.perf_counter() - t0:.1f} s (first use includes assembling the model file)")
    paths = ("bare", "sdk", "http")
    gen: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    pp: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
    # no kept-alive connections, like our clients for llama.cpp servers: reusing one races the
    # server closing it after a streamed reply
    bare_limits = httpx2.Limits(max_keepalive_connections=0)
    async with client_scope(), httpx2.AsyncClient(timeout=300, limits=bare_limits) as client:
        for i in range(runs + 1):  # run 0 warms every path up and is not counted
            for path in paths[i % 3 :] + paths[: i % 3]:  # rotate the order
                long_prompt = f"[{uuid.uuid4().hex}] {LONG_PROMPT}"  # unique prefix: no prompt-cache hit
                if path == "bare":
                    g = await _bare(client, server.api_base, GEN_PROMPT, GEN_TOKENS)
                    p = await _bare(client, server.api_base, long_prompt, 1)
                else:
                    g = await _ours(path, GEN_PROMPT, GEN_TOKENS)
                    p = await _ours(path, long_prompt, 1)
                if i > 0:
                    gen[path].append(g)
                    pp[path].append(p)
            print(f"run {i}{' (warm-up)' if i == 0 else ''} done")

    print(f"\n{'path':28s} {'gen tok/s':>10s} {'prompt tok/s':>13s} {'ttft s':>8s}")
    names = {"bare": "bare httpx2 (reference)", "sdk": "ours, SDK transport", "http": "ours, lean http transport"}
    for path in paths:
        print(
            f"{names[path]:28s} {_median(gen[path], 'gen_tok_s'):10.1f} {_median(pp[path], 'prompt_tok_s'):13.1f} "
            f"{_median(gen[path], 'ttft_s'):8.3f}"
        )
    bare_gen = _median(gen["bare"], "gen_tok_s")
    result = {
        "gen_tok_s": round(_median(gen["sdk"], "gen_tok_s"), 2),
        "prompt_tok_s": round(_median(pp["sdk"], "prompt_tok_s"), 2),
        "bare_gen_tok_s": round(bare_gen, 2),
        "ttft_s": round(_median(gen["sdk"], "ttft_s"), 4),
        "gen_tok_s_http": round(_median(gen["http"], "gen_tok_s"), 2),
        "bare_prompt_tok_s": round(_median(pp["bare"], "prompt_tok_s"), 2),
        "bare_ttft_s": round(_median(gen["bare"], "ttft_s"), 4),
        "gen_ratio_to_bare": round(_median(gen["sdk"], "gen_tok_s") / bare_gen, 3),
        "gen_ratio_to_bare_http": round(_median(gen["http"], "gen_tok_s") / bare_gen, 3),
        "runs": runs,
        "threads": server.settings.threads,
    }
    print(
        f"\nours/bare generation speed: SDK {result['gen_ratio_to_bare']:.3f}x, lean http "
        f"{result['gen_ratio_to_bare_http']:.3f}x (1.0 = no overhead)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="measured runs per path (default 5)")
    trio.run(main, parser.parse_args().runs)
