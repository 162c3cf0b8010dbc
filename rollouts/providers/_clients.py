"""Client reuse: one SDK/HTTP client per endpoint per run, closed when the run ends.

`run_agent` and `evaluate` open a `client_scope()`; providers call
`await get_client(key, factory)` to reuse a client inside it. Outside any scope a provider gets
a client that is closed when the scope-less call ends (see `_pooled.pooled_client`).
`shared_ssl_context()` is the one TLS context every client is built with.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

import httpx2
import trio

_ssl_context: ssl.SSLContext | None = None


def shared_ssl_context() -> ssl.SSLContext:
    """One TLS context for every client we build (pass it as `verify=`): building one costs
    ~40 ms of CPU, which would otherwise be paid by every client."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx2.create_ssl_context()
    return _ssl_context


class ClientPool:
    """Clients keyed by whatever identifies an endpoint's connection settings."""

    def __init__(self) -> None:
        self._clients: dict[Hashable, Any] = {}
        self._lock = trio.Lock()

    async def get(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The client for `key`, made by `factory()` the first time it is asked for."""
        client = self._clients.get(key)
        if client is None:
            async with self._lock:
                client = self._clients.get(key)
                if client is None:
                    client = factory()
                    self._clients[key] = client
        return client

    async def aclose(self) -> None:
        """Close every client (shielded: this runs on the way out of a cancelled run too). A
        client whose close fails does not keep the others open; the first error is re-raised."""
        clients, self._clients = list(self._clients.values()), {}
        first_error: Exception | None = None
        with trio.CancelScope(shield=True):
            for c in clients:
                close = getattr(c, "aclose", None) or getattr(c, "close", None)
                if close is None:
                    continue
                try:
                    result = close()
                    if hasattr(result, "__await__"):
                        await result
                except Exception as e:
                    first_error = first_error or e
        if first_error is not None:
            raise first_error


_current: ContextVar[ClientPool | None] = ContextVar("rollouts_client_pool", default=None)


def current_pool() -> ClientPool | None:
    """The pool of the innermost `client_scope()` of this task (None outside any)."""
    return _current.get()


@asynccontextmanager
async def client_scope() -> AsyncIterator[ClientPool]:
    """Enter a pool (or reuse the one already active); clients close when the outermost exits."""
    existing = _current.get()
    if existing is not None:
        yield existing
        return
    pool = ClientPool()
    token = _current.set(pool)
    try:
        yield pool
    finally:
        _current.reset(token)
        await pool.aclose()
