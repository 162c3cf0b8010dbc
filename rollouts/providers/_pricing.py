"""A small model price table and `cost_usd` for Usage, shared by every provider.

Prices are US dollars per million tokens (list prices for standard, non-batch usage, as
published by the providers in late 2025; check the provider's page before relying on a figure).
`input` is charged for `Usage.input_tokens` (which never includes cached tokens), `cache_read`
for `cache_read_tokens`, `cache_write` for `cache_write_tokens` and `output` for `output_tokens`
(which includes reasoning tokens, billed as output by every provider).

A model is found by the longest table key that its name starts with, after dropping a
`models/` or `provider/` prefix, so dated snapshots (`claude-sonnet-4-5-20250929`,
`gpt-4o-2024-08-06`) price like their family. Unknown models cost 0.0; `price_for` returns
None for them so callers can tell "free" from "unknown". `register_price` adds or overrides
an entry (e.g. for a self-hosted model with an internal cost).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollouts.dtypes import Usage


@dataclass(frozen=True)
class ModelPrice:
    """Dollars per million tokens."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0


# Anthropic: cache writes (5-minute TTL) cost 1.25x input, cache reads 0.1x input.
# OpenAI and Google: cached input has its own price and there is no write charge.
_PRICES: dict[str, ModelPrice] = {
    # Anthropic
    "claude-opus-4-5": ModelPrice(5.0, 25.0, 0.50, 6.25),
    "claude-opus-4-1": ModelPrice(15.0, 75.0, 1.50, 18.75),
    "claude-opus-4": ModelPrice(15.0, 75.0, 1.50, 18.75),
    "claude-sonnet-4-5": ModelPrice(3.0, 15.0, 0.30, 3.75),
    "claude-sonnet-4": ModelPrice(3.0, 15.0, 0.30, 3.75),
    "claude-3-7-sonnet": ModelPrice(3.0, 15.0, 0.30, 3.75),
    "claude-haiku-4-5": ModelPrice(1.0, 5.0, 0.10, 1.25),
    "claude-3-5-haiku": ModelPrice(0.80, 4.0, 0.08, 1.0),
    # OpenAI
    "gpt-5": ModelPrice(1.25, 10.0, 0.125),
    "gpt-5-mini": ModelPrice(0.25, 2.0, 0.025),
    "gpt-5-nano": ModelPrice(0.05, 0.40, 0.005),
    "gpt-4.1": ModelPrice(2.0, 8.0, 0.50),
    "gpt-4.1-mini": ModelPrice(0.40, 1.60, 0.10),
    "gpt-4.1-nano": ModelPrice(0.10, 0.40, 0.025),
    "gpt-4o": ModelPrice(2.50, 10.0, 1.25),
    "gpt-4o-mini": ModelPrice(0.15, 0.60, 0.075),
    "o3": ModelPrice(2.0, 8.0, 0.50),
    "o4-mini": ModelPrice(1.10, 4.40, 0.275),
    # Google (prompts up to 200k tokens)
    "gemini-2.5-pro": ModelPrice(1.25, 10.0, 0.125),
    "gemini-2.5-flash": ModelPrice(0.30, 2.50, 0.03),
    "gemini-2.5-flash-lite": ModelPrice(0.10, 0.40, 0.01),
    "gemini-2.0-flash": ModelPrice(0.10, 0.40, 0.025),
}


def _normalise(model: str) -> str:
    name = model.strip().lower()
    if "/" in name:
        name = name.rsplit("/", 1)[1]
    return name


def price_for(model: str) -> ModelPrice | None:
    """The price of `model` (longest matching table prefix), or None when it is not listed."""
    name = _normalise(model)
    best: str | None = None
    for key in _PRICES:
        if name.startswith(key) and (best is None or len(key) > len(best)):
            best = key
    return _PRICES[best] if best is not None else None


def register_price(model: str, price: ModelPrice) -> None:
    """Add or replace the price of `model` (a name or a name prefix)."""
    if not isinstance(price, ModelPrice):
        raise TypeError(f"register_price needs a ModelPrice(input=..., output=...), got {price!r}")
    _PRICES[_normalise(model)] = price


def cost_usd(usage: Usage, model: str) -> float:
    """Dollars `usage` costs on `model` (0.0 for models not in the table)."""
    price = price_for(model)
    if price is None:
        return 0.0
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_write_tokens * price.cache_write
    ) / 1_000_000


def with_cost(usage: Usage, model: str) -> Usage:
    """`usage` with `cost_usd` computed from the price table (unchanged for unknown models)."""
    cost = cost_usd(usage, model)
    return replace(usage, cost_usd=cost) if cost else usage
