"""Failed authentication, limited per client address: a token guess costs the database a lookup,
so one client may not make many.

    limiter = AuthFailures(rate_per_s=1.0, burst=20)
    wait = limiter.blocked(address)      # seconds to wait (0: go ahead and look the token up)
    limiter.failed(address)              # a missing, malformed or unknown token

Each address has a bucket of `burst` failures that refills at `rate_per_s`; a request from an
address whose bucket is empty is answered 429 with `Retry-After`, before any lookup. Valid
tokens never consume anything. At most `max_addresses` buckets are kept (the least recently
failed are forgotten first: memory is bounded whatever addresses a client uses).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["AuthFailures"]


class AuthFailures:
    """Per-address token buckets of failed authentications (see the module docstring)."""

    def __init__(
        self,
        *,
        rate_per_s: float = 1.0,
        burst: int = 20,
        max_addresses: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("rate_per_s must be > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.max_addresses = max_addresses
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)

    def _tokens(self, address: str, now: float) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate_per_s)

    def blocked(self, address: str) -> float:
        """Seconds until `address` may try again (0.0: it may now)."""
        if address not in self._buckets:
            return 0.0
        tokens = self._tokens(address, self._clock())
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate_per_s

    def failed(self, address: str) -> None:
        """Count a failed authentication from `address`."""
        now = self._clock()
        tokens = self._tokens(address, now)
        self._buckets[address] = (max(tokens - 1.0, 0.0), now)
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.max_addresses:
            self._buckets.popitem(last=False)
