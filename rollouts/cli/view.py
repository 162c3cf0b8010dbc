"""`rollouts view`: the web UI over sessions, eval runs and sets, GEPA runs and training runs on this machine.

Serves on 127.0.0.1 (any free port unless --port) and prints the URL; or, with --bundle DIR,
writes a static copy of the pages that opens from disk.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path
from typing import Any

import trio

from rollouts.cli.common import CLIError, HelpFormatter

EXAMPLES = """\
examples:
  rollouts view                                   # ~/.rollouts/sessions and the current directory
  rollouts view results/ gepa_runs/ ~/.rollouts/sessions
  rollouts view results/ --port 8765
  rollouts view --bundle report/ results/run1 results/run2   # static pages: open report/index.html

Each PATH is a session store, an eval output directory (samples.jsonl, report.json), an eval set
(index.json of `rollouts eval-set`), a GEPA run directory (state.json, result.json), a training run
(log.jsonl of `rollouts train`), or a directory holding such directories (two levels down).
Indexes are kept in $ROLLOUTS_VIEW_CACHE (default ~/.cache/rollouts/view).
"""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "view",
        help="browse sessions, evaluations, GEPA and training runs in a web page",
        description="Serve a web UI over session stores, eval output directories and sets, GEPA run directories "
        "and training runs.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="what to show (default: the sessions dir and .)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port)")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another host name it answers for (Host header; besides localhost, 127.0.0.1, ::1 and --host)",
    )
    p.add_argument("--cache-dir", metavar="DIR", help="where the indexes live (default $ROLLOUTS_VIEW_CACHE)")
    p.add_argument("--bundle", metavar="DIR", help="write a static copy of the pages to DIR instead of serving")
    p.add_argument(
        "--max-sessions", type=int, default=200, metavar="N", help="sessions in a bundle (default %(default)s)"
    )
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    try:
        from rollouts.view import FilesCatalog, create_app, serve
        from rollouts.view.bundle import write_bundle
    except ImportError as e:
        raise CLIError(
            f"`rollouts view` needs the view extra ({e.name} is missing): pip install 'rollouts[view]'"
        ) from None
    missing = [p for p in args.paths if not Path(p).expanduser().exists()]
    if missing:
        raise CLIError(f"no such file or directory: {', '.join(missing)}")
    if not 0 <= args.port <= 65535:
        raise CLIError(f"--port must be 0..65535, got {args.port}")
    catalog = FilesCatalog(args.paths or None, cache_dir=args.cache_dir)

    if args.bundle:
        out = Path(args.bundle).expanduser()
        written = trio.run(lambda: write_bundle(catalog, out, max_sessions=args.max_sessions))
        print(f"wrote {len(written)} files; open {out / 'index.html'}")
        return 0

    from rollouts.view.guard import LOCAL_HOSTS, is_local

    hosts = sorted({*LOCAL_HOSTS, args.host, *args.allow_host})
    token = None if is_local(args.host) else secrets.token_urlsafe(32)
    app = create_app(catalog, allowed_hosts=hosts, access_token=token)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve, app, args.host, args.port)
            if token is not None:
                url = f"{url}?token={token}"
                print(
                    f"note: {args.host} is reachable from other machines: every request needs the token in this "
                    f"URL (it answers for the host names {', '.join(hosts)}; add more with --allow-host)",
                    file=sys.stderr,
                )
            print(f"rollouts view: {url}  (Ctrl-C to stop)", flush=True)

    trio.run(run)
    return 0
