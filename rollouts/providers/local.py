"""Provider `local`: the embedded model (see `rollouts.local_model`).

The first call starts the process-wide llama.cpp server; every call then goes through the
OpenAI-compatible chat provider pointed at it, so the local model gets exactly the events,
Message/Usage shapes, retries and quirk handling (tool calls written as bare JSON, missing
usage) of any self-hosted server. The returned actor keeps the caller's endpoint: the server's
ephemeral address never reaches a trajectory or a session file.
"""

from __future__ import annotations

from dataclasses import replace

from rollouts.dtypes import Actor
from rollouts.errors import ConfigurationError
from rollouts.events import OnChunk
from rollouts.local_model import ensure_local_server, resolve_local_model
from rollouts.providers.openai_chat import stream_openai_compatible


async def stream_local(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Stream one reply from the embedded model."""
    ep = actor.endpoint
    if ep.api_base:
        raise ConfigurationError(
            f"provider 'local' runs the embedded model and takes no api_base (got {ep.api_base!r}); "
            "for a server of your own use provider 'openai-compatible' with api_base"
        )
    server = await ensure_local_server(resolve_local_model(ep.model))
    extra = {"parallel_tool_calls": False, **(ep.extra_params or {})}
    served = replace(actor, endpoint=replace(ep, api_base=server.api_base, api_key="", extra_params=extra))
    new_actor = await stream_openai_compatible(served, on_chunk)
    return replace(new_actor, endpoint=ep)
