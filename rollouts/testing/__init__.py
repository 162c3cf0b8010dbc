"""Testing helpers shipped with rollouts: a wire-faithful fake provider server.

See `rollouts.testing.fake_server` for the full API.
"""

from rollouts.testing.fake_server import (
    FakeServer,
    FakeTurn,
    RecordedRequest,
    http_error,
    open_fake_server,
)

__all__ = ["FakeServer", "FakeTurn", "RecordedRequest", "http_error", "open_fake_server"]
