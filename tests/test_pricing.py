"""The model price table and cost accounting (`rollouts.providers._pricing`)."""

from __future__ import annotations

import pytest

from rollouts.dtypes import Usage
from rollouts.providers._pricing import ModelPrice, cost_usd, price_for, register_price, with_cost


def test_dated_snapshots_and_prefixed_names_price_like_their_family() -> None:
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5")
    assert price_for("models/gemini-2.5-flash") == price_for("gemini-2.5-flash")
    assert price_for("openai/gpt-4o-2024-08-06") == price_for("gpt-4o")


def test_the_longest_matching_prefix_wins() -> None:
    assert price_for("gpt-4o-mini") == ModelPrice(0.15, 0.60, 0.075)
    assert price_for("gpt-5-mini-2025-08-07") == ModelPrice(0.25, 2.0, 0.025)
    assert price_for("gemini-2.5-flash-lite") == ModelPrice(0.10, 0.40, 0.01)


def test_cost_counts_every_kind_of_token_at_its_own_price() -> None:
    usage = Usage(
        input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=2_000_000, cache_write_tokens=400_000
    )
    # claude-haiku-4-5: $1 in, $5 out, $0.10 cache read, $1.25 cache write per million
    assert cost_usd(usage, "claude-haiku-4-5") == pytest.approx(1.0 + 0.5 + 0.2 + 0.5)
    assert with_cost(usage, "claude-haiku-4-5").cost_usd == pytest.approx(2.2)


def test_unknown_models_cost_nothing_and_can_be_registered() -> None:
    usage = Usage(input_tokens=2_000_000, output_tokens=1_000_000)
    assert price_for("my-local-llama") is None
    assert with_cost(usage, "my-local-llama") is usage
    register_price("my-local-llama", ModelPrice(0.5, 1.0))
    try:
        assert cost_usd(usage, "my-local-llama-8b") == pytest.approx(2.0)
    finally:
        from rollouts.providers import _pricing

        del _pricing._PRICES["my-local-llama"]
