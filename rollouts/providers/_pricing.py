"""A small model price table and `cost_usd` for Usage, shared by every provider.

Prices are US dollars per million tokens (list prices for standard, non-batch usage, as
published by the providers in late 2025; check the provider's page before relying on a figure).
`input` is charged for `Usage.input_tokens` (which never includes cached tokens), `cache_read`
for `cache_read_tokens`, `cache_write` for `cache_write_tokens` and `output` for `output_tokens`
(which includes reasoning tokens, billed as output by every provider).

A model is priced by its exact name, after dropping a `models/` or `provider/` prefix and
case, or by a dated alias of a listed name (`claude-sonnet-4-5-20250929`, `gpt-4o-2024-08-06`,
`claude-3-7-sonnet-latest`, `gemini-2.0-flash-001`). Nothing else matches: `o3-pro` and
`o3-mini` are not `o3`, `gpt-5-pro` is not `gpt-5` (they cost several times more or less).
A model that is not listed has no price: `price_for` and `cost_usd` return None, `with_cost`
leaves `cost_usd` at 0.0 and warns once per model (`UnknownPriceWarning`) — pass
`warn=False` where no price is expected (self-hosted servers). `register_price` adds or
overrides an entry (e.g. for a self-hosted model with an internal cost). A cost budget
(`handle_stop_cost_budget`) refuses to start on a model without a price.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace

from rollouts.dtypes import Usage


class UnknownPriceWarning(UserWarning):
    """A model's usage was not priced: it is not in the price table (see `register_price`)."""


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


# A dated snapshot or alias of a listed name: -20250929, -2024-08-06, -latest, -001.
_ALIAS_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest|\d{3})$")
_warned: set[str] = set()


def price_for(model: str) -> ModelPrice | None:
    """The price of `model` (its exact name or a dated alias of one), or None when not listed."""
    name = _normalise(model)
    price = _PRICES.get(name)
    if price is None:
        base = _ALIAS_SUFFIX.sub("", name)
        if base != name:
            price = _PRICES.get(base)
    return price


def register_price(model: str, price: ModelPrice) -> None:
    """Add or replace the price of `model` (its dated aliases get it too)."""
    if not isinstance(price, ModelPrice):
        raise TypeError(f"register_price needs a ModelPrice(input=..., output=...), got {price!r}")
    _PRICES[_normalise(model)] = price


def cost_usd(usage: Usage, model: str) -> float | None:
    """Dollars `usage` costs on `model`; None when the model has no price (never a silent 0.0)."""
    price = price_for(model)
    if price is None:
        return None
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_read_tokens * price.cache_read
        + usage.cache_write_tokens * price.cache_write
    ) / 1_000_000


def with_cost(usage: Usage, model: str, *, warn: bool = True) -> Usage:
    """`usage` with `cost_usd` from the price table. A model without a price leaves it unchanged
    and, with `warn`, issues one `UnknownPriceWarning` per model and process."""
    cost = cost_usd(usage, model)
    if cost is None:
        if warn and model not in _warned:
            _warned.add(model)
            warnings.warn(
                f"no price for model {model!r}: its cost_usd stays 0.0; add one with "
                "rollouts.register_price(model, ModelPrice(input=..., output=...)) (dollars per million tokens)",
                UnknownPriceWarning,
                stacklevel=2,
            )
        return usage
    return replace(usage, cost_usd=cost) if cost else usage
