"""The model price table and cost accounting (`rollouts.providers._pricing`)."""

from __future__ import annotations

import warnings

import pytest

from rollouts.dtypes import Usage
from rollouts.providers._pricing import (
    ModelPrice,
    UnknownPriceWarning,
    cost_usd,
    price_for,
    register_price,
    with_cost,
)


def test_dated_snapshots_and_prefixed_names_price_like_their_family() -> None:
    assert price_for("claude-sonnet-4-5-20250929") == price_for("claude-sonnet-4-5")
    assert price_for("models/gemini-2.5-flash") == price_for("gemini-2.5-flash")
    assert price_for("openai/gpt-4o-2024-08-06") == price_for("gpt-4o")


def test_exact_names_win_over_shorter_ones() -> None:
    assert price_for("gpt-4o-mini") == ModelPrice(0.15, 0.60, 0.075)
    assert price_for("gpt-5-mini-2025-08-07") == ModelPrice(0.25, 2.0, 0.025)
    assert price_for("gemini-2.5-flash-lite") == ModelPrice(0.10, 0.40, 0.01)


def test_prices_are_exact_names_and_dated_aliases_only() -> None:
    """Issue 13 item 8: by longest prefix, o3-pro and o3-mini got o3's price and gpt-5-pro
    gpt-5's (several times off); now only the name itself and its dated aliases match."""
    for model in ("o3-pro", "o3-mini", "gpt-5-pro", "gpt-4o-realtime-preview", "claude-sonnet-4-5-turbo"):
        assert price_for(model) is None, model
    assert price_for("o3-2025-04-16") == price_for("o3") is not None
    assert price_for("claude-3-7-sonnet-latest") == price_for("claude-3-7-sonnet") is not None
    assert price_for("gemini-2.0-flash-001") == price_for("gemini-2.0-flash") is not None


def test_an_unknown_price_is_none_with_one_warning_per_model() -> None:
    usage = Usage(input_tokens=1000, output_tokens=1000)
    assert cost_usd(usage, "o3-pro") is None  # not a silent 0.0
    with pytest.warns(UnknownPriceWarning, match="o3-pro.*register_price") as caught:
        assert with_cost(usage, "o3-pro") is usage
        assert with_cost(usage, "o3-pro") is usage
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert with_cost(usage, "my-self-hosted-model", warn=False) is usage  # where no price is expected


def test_cost_counts_every_kind_of_token_at_its_own_price() -> None:
    usage = Usage(
        input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=2_000_000, cache_write_tokens=400_000
    )
    # claude-haiku-4-5: $1 in, $5 out, $0.10 cache read, $1.25 cache write per million
    assert cost_usd(usage, "claude-haiku-4-5") == pytest.approx(1.0 + 0.5 + 0.2 + 0.5)
    assert with_cost(usage, "claude-haiku-4-5").cost_usd == pytest.approx(2.2)


def test_unknown_models_have_no_price_and_can_be_registered() -> None:
    usage = Usage(input_tokens=2_000_000, output_tokens=1_000_000)
    assert price_for("my-local-llama") is None
    assert with_cost(usage, "my-local-llama", warn=False) is usage
    register_price("my-local-llama", ModelPrice(0.5, 1.0))
    try:
        assert cost_usd(usage, "my-local-llama") == pytest.approx(2.0)
        assert price_for("my-local-llama-8b") is None  # a longer name is another model
    finally:
        from rollouts.providers import _pricing

        del _pricing._PRICES["my-local-llama"]


async def test_a_cost_budget_over_an_unpriced_model_is_an_error_at_the_start() -> None:
    """Issue 13 item 8: an unpriced model costs $0 forever, so the budget was a silent no-op."""
    from rollouts.agents import run_agent
    from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Trajectory
    from rollouts.errors import ConfigurationError
    from rollouts.handlers import handle_stop_cost_budget
    from rollouts.run_config import RunConfig
    from rollouts.testing import open_fake_server

    async with open_fake_server(["never sent"]) as srv:
        endpoint = Endpoint("openai", "o3-pro", api_base=srv.base_url, api_key="k", extra_params={"api": "chat"})
        state = AgentState(actor=Actor(Trajectory((Message("user", "hi"),)), endpoint))
        with pytest.raises(ConfigurationError, match=r"no price for model 'o3-pro'.*register_price"):
            await run_agent(state, RunConfig(handle_stop=handle_stop_cost_budget(1.0)))
        assert srv.scripted_requests == []  # refused before any call
        # with a price (or a cost_fn) it runs
        register_price("o3-pro", ModelPrice(20.0, 80.0))
        try:
            states = await run_agent(state, RunConfig(handle_stop=handle_stop_cost_budget(1.0), max_turns=1))
        finally:
            from rollouts.providers import _pricing

            del _pricing._PRICES["o3-pro"]
    assert states[-1].messages[-1].usage is not None and states[-1].messages[-1].usage.cost_usd > 0


async def test_a_token_budget_on_a_server_that_reports_no_usage_is_an_error() -> None:
    """Issue 13 item 8: zero reported tokens never reach the budget; the run is stopped with an
    error at the first reply that carries no usage."""
    from rollouts.agents import run_agent
    from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Trajectory
    from rollouts.environments.calculator import CalculatorEnvironment
    from rollouts.errors import ConfigurationError
    from rollouts.handlers import handle_stop_token_budget
    from rollouts.run_config import RunConfig
    from rollouts.testing import ScriptedReply, ScriptedToolCall, open_fake_server

    call = ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 1}),))
    async with open_fake_server([call, call, call], send_usage=False) as srv:
        endpoint = Endpoint("openai-compatible", "m", api_base=srv.base_url)
        state = AgentState(
            actor=Actor(Trajectory((Message("user", "hi"),)), endpoint), environment=CalculatorEnvironment()
        )
        with pytest.raises(ConfigurationError, match="reports no token usage"):
            await run_agent(state, RunConfig(handle_stop=handle_stop_token_budget(100)))
        assert len(srv.scripted_requests) == 1
