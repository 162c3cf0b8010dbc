"""Running an async entry point from code that is not async (a script, a notebook cell, a test).

    result = run_sync("optimize_sync", optimize, seed, trainset, valset, task=cfg, ...)

It starts a trio event loop for the call and returns its result. Inside a running event loop
(trio's, or asyncio's as in Jupyter) starting another one would block that loop or fail deep
inside trio, so it refuses at once, saying what to call instead.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import trio

from rollouts.errors import ConfigurationError

__all__ = ["run_sync"]

T = TypeVar("T")


def _running_loop() -> str | None:
    """Which loop ("trio" or "asyncio") this thread runs inside, if any: None when none."""
    try:
        trio.lowlevel.current_trio_token()
        return "trio"
    except RuntimeError:
        pass
    asyncio = sys.modules.get("asyncio")  # (only looked at when some code has imported it)
    if asyncio is not None and asyncio.events._get_running_loop() is not None:
        return "asyncio"
    return None


def run_sync(name: str, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """`await fn(*args, **kwargs)` in a new trio loop; ConfigurationError inside a running loop."""
    loop = _running_loop()
    if loop is not None:
        async_name = getattr(fn, "__name__", "the async function")
        raise ConfigurationError(
            f"{name}() was called inside a running {loop} event loop, where it cannot start its own; "
            f"use `await {async_name}(...)` there instead"
            + (" (in Jupyter, a cell can `await` directly)" if loop == "asyncio" else "")
        )
    return trio.run(partial(fn, *args, **kwargs))
