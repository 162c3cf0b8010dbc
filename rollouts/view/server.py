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


def _config(host: str, port: int, *, quiet: bool) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = 1.0
    config.accesslog = None if quiet else "-"
    config.errorlog = "-"  # errors (a page that failed) always reach stderr
    config.loglevel = "WARNING" if quiet else "INFO"
    return config


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
