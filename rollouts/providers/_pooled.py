"""`pooled_client`: the SDK client for an endpoint, reused inside a `client_scope()`;
`sdk_arguments`: a request body as an SDK method's keyword arguments.

Inside a scope (run_agent, evaluate) the client comes from the run's pool and is closed when the
scope ends; outside one, a fresh client is made and closed when the call ends. Pool keys hold a
hash of the API key, never the key itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Any

import trio

from rollouts.providers._clients import current_pool


async def _close(client: Any) -> None:
    close = getattr(client, "aclose", None) or getattr(client, "close", None)
    if close is not None:
        result = close()
        if hasattr(result, "__await__"):
            await result


@asynccontextmanager
async def pooled_client(key: Hashable, factory: Callable[[], Any]) -> AsyncIterator[Any]:
    """The pooled client for `key` (made by `factory` on first use), or a temporary one."""
    pool = current_pool()
    if pool is not None:
        yield await pool.get(key, factory)
        return
    client = factory()
    try:
        yield client
    finally:
        with trio.CancelScope(shield=True):
            await _close(client)


@functools.cache
def _parameters(create: Callable[..., Any]) -> frozenset[str]:
    return frozenset(p for p in inspect.signature(create).parameters if p not in ("self", "extra_body"))


def sdk_arguments(create: Callable[..., Any], body: dict[str, Any]) -> dict[str, Any]:
    """`body` as keyword arguments of the SDK method `create`: the parameters it declares, and
    the rest (parameters the SDK does not know yet) in `extra_body`."""
    known = _parameters(create)
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    kwargs["extra_body"] = extra or None
    return kwargs
