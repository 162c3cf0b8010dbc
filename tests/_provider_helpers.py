"""Helpers shared by the provider tests (Anthropic, Responses, Google, cross-provider)."""

from __future__ import annotations

from typing import Any

from rollouts.dtypes import Actor
from rollouts.events import StreamEvent
from rollouts.providers import get_provider_function


class Recorder:
    """An on_chunk that keeps every event."""

    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]


async def call(actor: Actor, rec: Recorder | None = None) -> tuple[Actor, Recorder]:
    """One provider call through the registry."""
    rec = rec or Recorder()
    fn = get_provider_function(actor.endpoint.provider, actor.endpoint.model)
    return await fn(actor, rec), rec


def assert_event_grammar(events: list[StreamEvent]) -> None:
    """The events of one successful call follow the grammar of `rollouts.events`: blocks one at a
    time (Start, its deltas, its End), no event for a block after its end, StreamDone last."""
    from rollouts import events as ev

    starts = (ev.TextStart, ev.ThinkingStart, ev.ToolCallStart)
    middles = (ev.TextDelta, ev.ThinkingDelta, ev.ThinkingSignature, ev.ToolCallDelta)
    ends = (ev.TextEnd, ev.ThinkingEnd, ev.ToolCallEnd, ev.ToolCallError)
    open_index: int | None = None
    closed: set[int] = set()
    for n, e in enumerate(events):
        where = f"event {n} {e!r}"
        if isinstance(e, starts):
            assert open_index is None, f"{where} starts while block {open_index} is open"
            assert e.content_index not in closed, f"{where} restarts an ended block"
            open_index = e.content_index
        elif isinstance(e, middles + ends):
            assert e.content_index == open_index, f"{where} is not for the open block {open_index}"
            if isinstance(e, ends):
                closed.add(e.content_index)
                open_index = None
    assert open_index is None, f"block {open_index} never ended"
    assert isinstance(events[-1], ev.StreamDone)
