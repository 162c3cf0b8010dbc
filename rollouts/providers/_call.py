"""The lifecycle every provider call shares, in one place.

A provider module is its request building, its stream translator and its error table; this
module runs the call around them::

    return await run_call(
        actor, on_chunk,
        build=lambda: build_request(actor),                 # after LLMCallStart
        open_stream=lambda body: open_the_stream(ep, body),  # raises on HTTP errors
        translator=lambda emit: MyTranslator(emit),         # raw stream items -> our events
        classify=lambda exc: classify_my_error(exc, ep.provider),
        secret=api_key,
    )

`run_call` emits `LLMCallStart`, builds the request, then runs attempts through
`_retry.stream_with_retries`: each attempt opens the stream (so `StreamStart` follows only a
successful open, i.e. a known HTTP status), feeds every item to a fresh translator and calls
its `finish()` (which emits `StreamDone` and returns the finish reason). Every event passes the
call's `MessageBuilder` (which drops the partial output of a failed attempt) on its way to
`on_chunk`. The result is the actor with the assistant `Message` and its `Completion` (duration,
time to the first streamed item, attempts) appended; when the run records raw calls
(`RunConfig.record_raw`), also the masked request and raw stream items (`rollouts.providers.raw`).

A provider whose key comes from `keys.PROVIDER_KEY_ENV` declares its parts once as a
`ProviderCall` and its stream function is `await CALL.run(actor, on_chunk)`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rollouts.dtypes import Actor, Completion, Endpoint, Message
from rollouts.events import LLMCallStart, OnChunk, StreamEvent, StreamStart
from rollouts.providers._aggregate import MessageBuilder, append_assistant
from rollouts.providers._retry import Failure, stream_with_retries
from rollouts.providers.keys import api_key_for
from rollouts.providers.raw import RawCall, recording

R = TypeVar("R")
Tr = TypeVar("Tr", bound="Translator")


class Translator(Protocol):
    """Turns a provider's raw stream items into our events (through the `emit` it was made with)."""

    async def feed(self, item: Any) -> None: ...

    async def finish(self) -> Any:
        """Close open blocks, emit StreamDone; return `(finish_reason, usage)`. Raise
        `IncompleteStreamError` when the stream ended before the model finished."""
        ...


async def run_call(
    actor: Actor,
    on_chunk: OnChunk,
    *,
    build: Callable[[], R],
    open_stream: Callable[[R], AbstractAsyncContextManager[AsyncIterator[Any]]],
    translator: Callable[[OnChunk], Tr],
    classify: Callable[[Exception], Failure | None],
    secret: str = "",
    finish_message: Callable[[Message, Tr], Message] | None = None,
    provider: str | None = None,
    model: str | None = None,
    bounded: bool = True,
) -> Actor:
    """One streamed model call with the shared lifecycle (see the module docstring).

    `finish_message(message, last_translator)` may adjust the finished Message (e.g. mark that the
    server reported no usage). `provider`/`model` default to the endpoint's. `bounded=False`
    drops the total deadline (`stream_with_retries`) for a call that does no I/O."""
    ep = actor.endpoint
    provider = provider or ep.provider
    model = model or ep.model
    started = time.perf_counter()
    await on_chunk(LLMCallStart(provider=provider, model=model))
    request = build()
    raw = RawCall(request) if recording() else None  # (RunConfig.record_raw; rollouts.providers.raw)
    builder = MessageBuilder(provider, model)
    first_item_at: float | None = None
    last: list[Tr] = []

    async def emit(event: StreamEvent) -> None:
        builder.feed(event)
        await on_chunk(event)

    async def attempt(emit: OnChunk, n: int) -> str | None:
        nonlocal first_item_at
        async with open_stream(request) as stream:
            await emit(StreamStart(attempt=n))
            tr = translator(emit)
            last[:] = [tr]
            feed: Callable[[Any], Awaitable[None]] = tr.feed
            if raw is not None:
                raw.start_attempt()
                feed = raw.tee(feed)
            async for item in stream:
                if first_item_at is None:
                    first_item_at = time.perf_counter()
                await feed(item)
            reason, _ = await tr.finish()
            return reason  # type: ignore[no-any-return]

    finish_reason, attempts = await stream_with_retries(
        attempt, endpoint=ep, on_chunk=emit, classify=classify, secret=secret, bounded=bounded
    )
    message = builder.finish()
    if finish_message is not None:
        message = finish_message(message, last[0])
    completion = Completion(
        provider=provider,
        model=model,
        finish_reason=finish_reason,
        message_index=len(actor.trajectory.messages),
        duration_s=time.perf_counter() - started,
        time_to_first_token_s=(first_item_at - started) if first_item_at is not None else None,
        attempts=attempts,
        raw_request=raw.request if raw is not None else None,
        raw_response=raw.response() if raw is not None else None,
    )
    return append_assistant(actor, message, completion)


@dataclass(frozen=True)
class ProviderCall:
    """A provider made of its parts, run by `run_call`:

    * `key_provider`: its row in `keys.PROVIDER_KEY_ENV` (the key is found before LLMCallStart);
    * `build(actor)`: the request;
    * `open_stream(endpoint, request, api_key)`: an async context manager yielding raw items;
    * `translator(emit, model)`: a `Translator` for one attempt;
    * `classify(exc, provider)`: the error table (a `Failure`, or None to propagate);
    * `credential(endpoint, key_provider)`: the secret the call sends (default `keys.api_key_for`;
      Anthropic's also takes `Endpoint.oauth_token`)."""

    key_provider: str
    build: Callable[[Actor], Any]
    open_stream: Callable[[Endpoint, Any, str], AbstractAsyncContextManager[AsyncIterator[Any]]]
    translator: Callable[[OnChunk, str], Translator]
    classify: Callable[[Exception, str], Failure | None]
    credential: Callable[[Endpoint, str], str] = api_key_for

    async def run(self, actor: Actor, on_chunk: OnChunk) -> Actor:
        """One call for `actor` (its endpoint's provider, model and key)."""
        ep = actor.endpoint
        api_key = self.credential(ep, self.key_provider)
        return await run_call(
            actor,
            on_chunk,
            build=lambda: self.build(actor),
            open_stream=lambda request: self.open_stream(ep, request, api_key),
            translator=lambda emit: self.translator(emit, ep.model),
            classify=lambda exc: self.classify(exc, ep.provider),
            secret=api_key,
        )
