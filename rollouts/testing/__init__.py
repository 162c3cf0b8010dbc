"""Testing helpers shipped with rollouts: a wire-faithful fake provider server.

See `rollouts.testing.fake_server` for the full API. `ScriptedReply` / `ScriptedToolCall` (the
turn specs) are re-exported here for convenience.
"""

from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.testing.fake_server import (
    FakeServer,
    FakeTurn,
    RecordedRequest,
    http_error,
    open_fake_server,
)
from rollouts.testing.fake_server.anthropic_format import AnthropicReply

__all__ = [
    "AnthropicReply",
    "FakeServer",
    "FakeTurn",
    "RecordedRequest",
    "ScriptedReply",
    "ScriptedToolCall",
    "http_error",
    "open_fake_server",
]
