"""Provider `local`: the embedded model (see `rollouts.local_model`).

The first call starts the process-wide llama.cpp server; every call then goes through the
OpenAI-compatible chat provider pointed at it, so the local model gets exactly the events,
Message/Usage shapes, retries and quirk handling (tool calls written as bare JSON, missing
usage) of any self-hosted server. The returned actor keeps the caller's endpoint: the server's
ephemeral address never reaches a trajectory or a session file. `Endpoint.max_tokens` left at
its default (4096, the models' whole context) becomes the model's `default_max_tokens` (1024).
"""

from __future__ import annotations

from dataclasses import replace

from rollouts.dtypes import DEFAULT_MAX_TOKENS, Actor, Endpoint
from rollouts.errors import ConfigurationError
from rollouts.events import OnChunk
from rollouts.local_model import ensure_local_server, resolve_local_model
from rollouts.providers.openai_chat import stream_openai_compatible


def served_max_tokens(endpoint: Endpoint) -> int:
    """The reply limit a `local` endpoint is served with: `max_tokens` as given, or, left at
    the Endpoint default (4096, the embedded models' whole context), the model's own default."""
    spec = resolve_local_model(endpoint.model)
    return spec.default_max_tokens if endpoint.max_tokens == DEFAULT_MAX_TOKENS else endpoint.max_tokens


async def stream_local(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Stream one reply from the embedded model."""
    ep = actor.endpoint
    if ep.api_base:
        raise ConfigurationError(
            f"provider 'local' runs the embedded model and takes no api_base (got {ep.api_base!r}); "
            "for a server of your own use provider 'openai-compatible' with api_base"
        )
    spec = resolve_local_model(ep.model)
    server = await ensure_local_server(spec)
    extra = {"parallel_tool_calls": False, **(ep.extra_params or {})}
    max_tokens = served_max_tokens(ep)
    served_ep = replace(ep, api_base=server.api_base, api_key="", extra_params=extra, max_tokens=max_tokens)
    served = replace(actor, endpoint=served_ep)
    new_actor = await stream_openai_compatible(served, on_chunk)
    return replace(new_actor, endpoint=ep)
