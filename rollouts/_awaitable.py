"""`maybe_await`: the one helper for hooks that may be plain or async functions."""

from __future__ import annotations

import inspect
from typing import Any


async def maybe_await(value: Any) -> Any:
    """`value`, awaited first when it is awaitable (what a hook returned)."""
    if inspect.isawaitable(value):
        return await value
    return value
