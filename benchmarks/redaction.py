"""What masking secrets costs the writers and the streams (rollouts.redaction).

With four known secrets (the provider key variables set, as on a developer's machine):

* `redact_json` on a ~400-byte message line with no secret in it (what every store append,
  samples.jsonl line and GEPA log line pays), next to the `json.dumps` that makes the line;
* `StreamRedactor.feed` of a 4-character piece (what every streamed text delta pays on the CLI),
  for a piece that cannot start a secret and for one ending in `sk` (held back);
* `known_secrets()` itself (read before each of those).

Run: python benchmarks/redaction.py [--repeats 100000]
Last line: JSON with redact_json_us, dumps_us, feed_us, feed_held_us, known_secrets_us.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

KEYS = {
    "ANTHROPIC_API_KEY": "sk-ant-bench-0123456789abcdef0123456789",
    "OPENAI_API_KEY": "sk-bench-0123456789abcdef0123456789abcd",
    "GEMINI_API_KEY": "AIzaBench0123456789abcdef0123456789",
    "GOOGLE_API_KEY": "AIzaBench-google-0123456789abcdef01",
}

MESSAGE = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "The user wants the sum; I will call add with 4."},
        {"type": "text", "text": "Adding four to the current value, then I will report the result."},
        {"type": "tool_call", "id": "call_1", "name": "add", "arguments": {"value": 4}},
    ],
    "usage": {"input_tokens": 812, "output_tokens": 57, "cost_usd": 0.0012},
    "timestamp": "2026-01-15T09:30:12.123456Z",
}


def _per_call_us(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        best = min(best, time.perf_counter() - start)
    return round(best / repeats * 1e6, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=100_000)
    args = parser.parse_args()
    os.environ.update(KEYS)
    from rollouts.redaction import StreamRedactor, known_secrets, redact_json

    assert len(known_secrets().secrets) == 4
    line = json.dumps(MESSAGE, ensure_ascii=False, separators=(",", ":"))
    stream = StreamRedactor()
    held = StreamRedactor()

    def feed_held() -> None:
        held.feed("a sk")
        held.feed("; ")

    figures = {
        "line_bytes": len(line.encode()),
        "redact_json_us": _per_call_us(lambda: redact_json(line), args.repeats),
        "dumps_us": _per_call_us(lambda: json.dumps(MESSAGE, ensure_ascii=False, separators=(",", ":")), args.repeats),
        "feed_us": _per_call_us(lambda: stream.feed("abcd"), args.repeats),
        "feed_held_us": round(_per_call_us(feed_held, args.repeats) / 2, 2),
        "known_secrets_us": _per_call_us(known_secrets, args.repeats),
    }
    for name, value in figures.items():
        print(f"{name:>18}: {value}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
