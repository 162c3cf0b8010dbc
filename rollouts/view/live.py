"""The viewer's one loop for live pages: server-sent events of numbers that change.

    return live_response(first, poll, poll_s=1.0, still_allowed=session_is_valid)

`first` is what the page shows now; `poll()` returns new numbers, or None when nothing changed
(callers compare a cheap version token first, and recompute only when it moved), with whether
the item has finished. Each change is one `data:` event of JSON; `event: done` ends a finished
item's stream. Every stream is bounded: it ends after `max_lifetime_s` (the browser's
EventSource reconnects by itself, `retry:` tells it how soon) and after LIVE_MAX_EVENTS polls,
and when `still_allowed()` turns False (a revoked sign-in) it sends `event: denied` and ends
(the reconnect then meets the sign-in check and is refused).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import trio
from starlette.responses import StreamingResponse

__all__ = ["LIVE_MAX_EVENTS", "LIVE_MAX_LIFETIME_S", "live_events", "live_response"]

LIVE_MAX_EVENTS = 100_000  # polls of one stream at most (a day at one a second)
LIVE_MAX_LIFETIME_S = 15 * 60.0  # a stream ends after this; the page's EventSource reconnects
_RECONNECT_MS = 1000
_KEEP_ALIVE_EVERY = 15

Poll = Callable[[], Awaitable[tuple[Mapping[str, Any], bool] | None]]


async def live_events(
    first: Mapping[str, Any],
    finished: bool,
    poll: Poll,
    *,
    poll_s: float,
    max_lifetime_s: float = LIVE_MAX_LIFETIME_S,
    still_allowed: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """The event stream's text, chunk by chunk (see the module docstring)."""
    yield f"retry: {_RECONNECT_MS}\ndata: {json.dumps(first)}\n\n"
    last = dict(first)
    deadline = trio.current_time() + max_lifetime_s
    for n in range(LIVE_MAX_EVENTS):
        if finished:
            yield "event: done\ndata: {}\n\n"
            return
        if trio.current_time() + poll_s > deadline:
            return  # (the browser reconnects and gets a fresh stream, through the sign-in check)
        await trio.sleep(poll_s)
        if still_allowed is not None and not await still_allowed():
            yield "event: denied\ndata: {}\n\n"
            return
        got = await poll()
        if got is not None:
            now, finished = got
            if dict(now) != last:
                last = dict(now)
                yield f"data: {json.dumps(last)}\n\n"
                continue
        if n % _KEEP_ALIVE_EVERY == _KEEP_ALIVE_EVERY - 1:
            yield ": keep-alive\n\n"


def live_response(
    first: Mapping[str, Any],
    poll: Poll,
    *,
    finished: bool = False,
    poll_s: float,
    max_lifetime_s: float = LIVE_MAX_LIFETIME_S,
    still_allowed: Callable[[], Awaitable[bool]] | None = None,
) -> StreamingResponse:
    """`live_events` as an HTTP response (text/event-stream, not cached)."""
    events = live_events(
        first, finished, poll, poll_s=poll_s, max_lifetime_s=max_lifetime_s, still_allowed=still_allowed
    )
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
