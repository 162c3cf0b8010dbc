"""`rollouts service`: run the rollout service (API + workers), workers alone, and manage tokens.

The database is `--db URL`, else `$ROLLOUTS_SERVICE_DB`, else the embedded SQLite file under
`$ROLLOUTS_DATA_DIR` (default ~/.rollouts/service). Prefer the environment variable for a
PostgreSQL URL with a password: command lines are visible to other users.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, cast

import trio

from rollouts.cli.common import CLIError, HelpFormatter

EXAMPLES = """\
examples:
  rollouts service token create --workspace demo          # prints a token once; keep it
  rollouts service serve --workers 2                      # API on 127.0.0.1:8321 + 2 workers, embedded DB
  export ROLLOUTS_SERVICE_DB=postgresql://rollouts@db.internal:5432/rollouts
  rollouts service serve --host 0.0.0.0 --port 8321       # the API, against PostgreSQL
  rollouts service worker --concurrency 64                # on every machine that runs rollouts
  rollouts service token list
  rollouts service token revoke tok_0123456789abcdef

the operator decides what requests may use: a policy file (--policy FILE or
$ROLLOUTS_SERVICE_POLICY, given to serve and to every worker) names the credentials (the
variable holding each key and the addresses it may be sent to) and the modules tasks may import;
see docs/service.md "Security model". Keys and tokens never reach the database, logs or results.
"""


def _db_url(args: argparse.Namespace) -> str:
    from rollouts.service.server import DB_ENV
    from rollouts.service.store import default_db_url

    return str(getattr(args, "db", None) or os.environ.get(DB_ENV) or default_db_url())


def _add_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="the operator's policy (TOML): credentials requests may use and modules tasks may import "
        "(default: $ROLLOUTS_SERVICE_POLICY, else built-in credentials and code only)",
    )


def _policy(args: argparse.Namespace) -> Any:
    from rollouts.errors import ConfigurationError
    from rollouts.service.policy import ServicePolicy

    try:
        return ServicePolicy.from_env(args.policy)
    except ConfigurationError as e:
        raise CLIError(str(e)) from None


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--db",
        metavar="URL",
        help="postgresql://USER@HOST:PORT/NAME, sqlite:///PATH or a file (default: $ROLLOUTS_SERVICE_DB, else "
        "rollouts.db under $ROLLOUTS_DATA_DIR or ~/.rollouts/service)",
    )


def _database_errors() -> tuple[type[BaseException], ...]:
    import sqlite3

    from rollouts.service.store import DatabaseUnavailable

    errors: list[type[BaseException]] = [sqlite3.Error, DatabaseUnavailable]
    try:
        import psycopg

        errors.append(psycopg.Error)
    except ImportError:  # (PostgreSQL support not installed: only SQLite errors can happen)
        pass
    return tuple(errors)


def _run(fn: Callable[[], Any]) -> Any:
    """`fn()`, with a database that cannot be reached or used reported as one line."""
    from rollouts.cli.common import unwrap_group

    try:
        return fn()
    except BaseException as e:
        real = unwrap_group(e) if isinstance(e, BaseExceptionGroup) else e
        if isinstance(real, _database_errors()):
            first = str(real).strip().splitlines()[0] if str(real).strip() else type(real).__name__
            raise CLIError(f"the database cannot be used: {first}", exit_code=1) from None
        raise


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    for noisy in ("httpx2", "httpcore2", "httpx", "httpcore", "hypercorn"):  # a line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def _stop_on_signal(scope: trio.CancelScope, what: str) -> None:
    """Stop gracefully on SIGTERM (what systemd and Docker send) or SIGHUP: cancel `scope`,
    whose cleanup puts running tasks back (a worker) or stops the local workers (serve)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            print(f"{what}: {signal.Signals(signum).name}, stopping", file=sys.stderr, flush=True)
            scope.cancel()
            return


async def _stop_when_stdin_closes(scope: trio.CancelScope) -> None:
    """Stop when stdin reaches its end: the parent (serve) that holds the pipe is gone."""
    stdin = cast(io.BufferedReader, sys.stdin.buffer)
    while await trio.to_thread.run_sync(stdin.read1, 4096, abandon_on_cancel=True):
        pass
    print("the parent process is gone: stopping", file=sys.stderr, flush=True)
    scope.cancel()


def _serve(args: argparse.Namespace) -> int:
    from rollouts.service.api import ApiLimits
    from rollouts.service.server import serve

    _logging()
    _policy(args)  # (a bad file is reported before anything starts)
    limits = ApiLimits(max_body_bytes=args.max_body_mb * 1024 * 1024, max_tasks=args.max_tasks)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_signal, nursery.cancel_scope, "rollouts service")
            url = await nursery.start(
                lambda task_status: serve(
                    _db_url(args),
                    host=args.host,
                    port=args.port,
                    workers=args.workers,
                    worker_concurrency=args.worker_concurrency,
                    limits=limits,
                    data_dir=args.data_dir,
                    job_lease_s=args.job_lease,
                    ui=not args.no_ui,
                    policy_file=os.path.abspath(args.policy) if args.policy else None,
                    worker_lease_s=args.worker_lease,
                    task_status=task_status,
                )
            )
            print(f"rollouts service listening on {url} ({args.workers} local workers)", file=sys.stderr, flush=True)
            if not args.no_ui:
                print(f"web UI: {url.rstrip('/')}/ui (sign in with a workspace token)", file=sys.stderr, flush=True)

    _run(lambda: trio.run(main))
    return 0


def _worker(args: argparse.Namespace) -> int:
    from rollouts.service.batch_tasks import BatchTasks
    from rollouts.service.store import Store
    from rollouts.service.worker import Worker

    _logging()
    policy = _policy(args)

    async def main() -> None:
        store = await Store.open(_db_url(args), max_connections=4)
        try:
            worker = Worker(store, run_task=BatchTasks(store, policy), concurrency=args.concurrency, lease_s=args.lease)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_stop_on_signal, nursery.cancel_scope, f"worker {worker.worker_id}")
                if args.exit_with_parent:
                    nursery.start_soon(_stop_when_stdin_closes, nursery.cancel_scope)
                await nursery.start(worker.run)  # (warmed up and listening: ready for its first task)
                print(
                    f"worker {worker.worker_id} ready ({args.concurrency} tasks at once)", file=sys.stderr, flush=True
                )
        finally:
            store.close()

    _run(lambda: trio.run(main))
    return 0


def _store(args: argparse.Namespace) -> Any:
    from rollouts.service.store import Store

    store = Store(_db_url(args), max_connections=1)
    _run(store.migrate_sync)
    return store


def _token_create(args: argparse.Namespace) -> int:
    from rollouts.service import accounts

    if args.expires_in is not None and args.expires_in <= 0:
        raise CLIError("--expires-in must be > 0 seconds")
    store = _store(args)
    try:
        tid, token = store.call_sync(accounts.create_token, args.workspace, args.name or "", args.expires_in)
    finally:
        store.close()
    if args.json:
        print(json.dumps({"token_id": tid, "workspace": args.workspace, "token": token}))
    else:
        print(token)
        print(f"token {tid} for workspace {args.workspace!r}; shown once, stored only as a hash", file=sys.stderr)
    return 0


def _token_revoke(args: argparse.Namespace) -> int:
    from rollouts.service import accounts

    store = _store(args)
    try:
        done = store.call_sync(accounts.revoke_token, args.token_id)
    finally:
        store.close()
    if not done:
        raise CLIError(f"no active token {args.token_id!r} (see `rollouts service token list`)")
    print(f"revoked {args.token_id}", file=sys.stderr)
    return 0


def _token_list(args: argparse.Namespace) -> int:
    from rollouts.service import accounts

    store = _store(args)
    try:
        tokens = store.call_sync(accounts.list_tokens)
    finally:
        store.close()
    for t in tokens:
        if args.json:
            print(json.dumps(t))
        else:
            state = "revoked" if t["revoked_at"] else "active"
            print(f"{t['id']}  {t['workspace']}  {t['name'] or '-'}  {state}")
    return 0


def _help(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def show(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return show


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "service",
        help="run the rollout service (API + workers) and manage its tokens",
        description="The rollout service: batches of rollouts over HTTP, run by workers on any number of machines.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")

    s = actions.add_parser("serve", help="the API (and N local worker processes)", formatter_class=HelpFormatter)
    _add_db(s)
    s.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    s.add_argument("--port", type=int, default=8321, help="(default: %(default)s)")
    s.add_argument("--workers", type=int, default=0, metavar="N", help="local worker processes (default: 0)")
    s.add_argument("--worker-concurrency", type=int, default=16, metavar="N", help="tasks per worker (default: 16)")
    s.add_argument(
        "--worker-lease",
        type=float,
        metavar="SECONDS",
        help="the local workers' task lease: a task whose worker died is rerun after this long (default: 30)",
    )
    s.add_argument("--max-body-mb", type=int, default=16, metavar="MB", help="larger requests are 413 (default: 16)")
    s.add_argument("--max-tasks", type=int, default=10_000, metavar="N", help="tasks per batch (default: 10000)")
    s.add_argument("--data-dir", metavar="DIR", help="GEPA jobs' run directories (default: a temporary directory)")
    s.add_argument(
        "--job-lease",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="GEPA job lease: a restarted server resumes a job after this long (default: 30)",
    )
    s.add_argument("--no-ui", action="store_true", help="do not serve the web UI under /ui")
    _add_policy(s)
    s.set_defaults(func=_serve)

    w = actions.add_parser("worker", help="run tasks from the database's queue", formatter_class=HelpFormatter)
    _add_db(w)
    w.add_argument("--concurrency", type=int, default=16, metavar="N", help="tasks at once (default: 16)")
    w.add_argument("--lease", type=float, default=30.0, metavar="SECONDS", help="task lease (default: 30)")
    _add_policy(w)
    w.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)  # (serve's local workers)
    w.set_defaults(func=_worker)

    t = actions.add_parser("token", help="create, list and revoke API tokens", formatter_class=HelpFormatter)
    tokens = t.add_subparsers(dest="token_action", metavar="ACTION")
    tc = tokens.add_parser("create", help="a new token for a workspace (printed once)")
    _add_db(tc)
    tc.add_argument("--workspace", required=True, help="the workspace (created if new)")
    tc.add_argument("--name", help="a label for the token")
    tc.add_argument("--expires-in", type=float, metavar="SECONDS", help="the token expires after this long")
    tc.add_argument("--json", action="store_true")
    tc.set_defaults(func=_token_create)
    tr = tokens.add_parser("revoke", help="revoke a token by its id")
    _add_db(tr)
    tr.add_argument("token_id", metavar="TOKEN_ID")
    tr.set_defaults(func=_token_revoke)
    tl = tokens.add_parser("list", help="tokens (ids, workspaces, state; never the tokens)")
    _add_db(tl)
    tl.add_argument("--json", action="store_true")
    tl.set_defaults(func=_token_list)
    t.set_defaults(func=_help(t))

    p.set_defaults(func=_help(p))
    return p


def main(args: argparse.Namespace) -> int:
    return int(args.func(args))
