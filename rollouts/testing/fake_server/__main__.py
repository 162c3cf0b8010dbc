"""Run the fake provider server standalone (e.g. in another process for benchmarks).

    python -m rollouts.testing.fake_server --text "Hello" --latency 0.1
    python -m rollouts.testing.fake_server --deltas 10000 --chunk-size 4

Every request gets the same reply (in whichever wire format its path asks for). The first
line printed is `listening on http://127.0.0.1:<port>`; the server runs until killed.
"""

from __future__ import annotations

import argparse
import sys

import trio

from rollouts.testing.fake_server.server import open_fake_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rollouts.testing.fake_server", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--text", default="Hello from the fake server.", help="the reply text")
    parser.add_argument("--deltas", type=int, default=0, help="reply with this many text deltas instead of --text")
    parser.add_argument("--chunk-size", type=int, default=4, help="characters per delta")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each response's first byte")
    parser.add_argument("--no-usage", action="store_true", help="never report usage")
    args = parser.parse_args(argv)
    assert args.chunk_size > 0 and args.deltas >= 0 and args.latency >= 0
    text = "abcd"[: args.chunk_size].ljust(args.chunk_size, "x") * args.deltas if args.deltas else args.text

    async def serve() -> None:
        async with open_fake_server(
            lambda request: text, chunk_size=args.chunk_size, latency_s=args.latency, send_usage=not args.no_usage,
            port=args.port,
        ) as srv:  # fmt: skip
            print(f"listening on {srv.url}", flush=True)
            await trio.sleep_forever()

    try:
        trio.run(serve)
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
