"""Serving the viewer: hypercorn's trio worker on a local address.

async with trio.open_nursery() as nursery:
    url = await nursery.start(serve, app, "127.0.0.1", 0)   # port 0: any free port
"""

from __future__ import annotations

import functools

import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette


def hypercorn_config(
    host: str, port: int, *, access_log: str | None = None, error_log: str | None = "-", log_level: str = "WARNING"
) -> Config:
    """Hypercorn's config for serving on `host:port` (an IPv6 address in brackets), stopping
    within a second; `access_log` / `error_log`: "-" for stderr, None for none. The viewer and
    the rollout service both serve with it."""
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"]
    config.graceful_timeout = 1.0
    config.accesslog = access_log
    config.errorlog = error_log
    config.loglevel = log_level
    return config


def _config(host: str, port: int, *, quiet: bool) -> Config:
    # errors (a page that failed) always reach stderr
    return hypercorn_config(host, port, access_log=None if quiet else "-", log_level="WARNING" if quiet else "INFO")


async def serve(
    app: Starlette,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    quiet: bool = True,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until cancelled; `task_status.started(url)` reports the URL once it listens."""

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(hypercorn_serve, app, _config(host, port, quiet=quiet)))  # type: ignore[arg-type]
        task_status.started(binds[0] + "/")
