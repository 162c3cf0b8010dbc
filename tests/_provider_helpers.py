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
