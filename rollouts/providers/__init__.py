"""Provider registry: maps an Endpoint's provider name (and model) to its stream function.

A provider is an async function `(actor, on_chunk) -> Actor`: it streams the model's reply as
events through `on_chunk` and returns the actor with the new assistant message appended.
Built-in providers are imported lazily, so using one SDK never imports the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable

from rollouts.dtypes import Actor
from rollouts.errors import UnknownProviderError
from rollouts.events import OnChunk
from rollouts.providers._pricing import ModelPrice, UnknownPriceWarning, price_for, register_price

__all__ = [
    "ModelPrice",
    "ProviderFn",
    "ProviderResolver",
    "UnknownPriceWarning",
    "get_provider_function",
    "known_providers",
    "price_for",
    "register_price",
    "register_provider",
]

ProviderFn = Callable[[Actor, OnChunk], Awaitable[Actor]]
# A resolver picks the function for a model name (e.g. chat vs. responses API).
ProviderResolver = Callable[[str], ProviderFn]

# provider name -> "module:attribute" of a ProviderFn or ProviderResolver (imported on first use)
_BUILTIN: dict[str, str] = {
    "scripted": "rollouts.providers.scripted:stream_scripted",
    "openai": "rollouts.providers.openai_chat:stream_openai",
    "openai-compatible": "rollouts.providers.openai_chat:stream_openai_compatible",
    "vllm": "rollouts.providers.openai_chat:stream_openai_compatible",
    "sglang": "rollouts.providers.openai_chat:stream_openai_compatible",
    "llamacpp": "rollouts.providers.openai_chat:stream_openai_compatible",
    "anthropic": "rollouts.providers.anthropic:stream_anthropic",
    "openai-responses": "rollouts.providers.openai_responses:stream_openai_responses",
    "google": "rollouts.providers.google:stream_google",
    "local": "rollouts.providers.local:stream_local",
    "transformers": "rollouts.providers.transformers_local:stream_transformers",
}
_REGISTERED: dict[str, ProviderFn | ProviderResolver] = {}
_RESOLVERS: set[str] = set()


def register_provider(name: str, fn: ProviderFn | ProviderResolver, *, resolver: bool = False) -> None:
    """Register a provider under `name`. With `resolver=True`, `fn(model)` returns the function."""
    _REGISTERED[name] = fn
    if resolver:
        _RESOLVERS.add(name)
    else:
        _RESOLVERS.discard(name)


def known_providers() -> list[str]:
    """Every provider name `get_provider_function` accepts (built-in and registered), sorted."""
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def get_provider_function(provider: str, model: str) -> ProviderFn:
    """The stream function for `provider` (and `model`); raises UnknownProviderError listing
    the known providers."""
    fn = _REGISTERED.get(provider)
    if fn is None:
        target = _BUILTIN.get(provider)
        if target is None:
            raise UnknownProviderError(
                f"unknown provider {provider!r}; known providers: {', '.join(known_providers())}"
            )
        module_name, _, attr = target.partition(":")
        obj = getattr(importlib.import_module(module_name), attr)
        is_resolver = getattr(obj, "__provider_resolver__", False)
        register_provider(provider, obj, resolver=is_resolver)
        fn = obj
    if provider in _RESOLVERS:
        return fn(model)  # type: ignore[call-arg,arg-type,return-value]
    return fn  # type: ignore[return-value]


# Shared with the rest of the library (the agent loop, evaluate, optimize) and its users:
# re-exported here so that nothing outside this package imports its private modules.
from rollouts.providers._aggregate import MessageBuilder as MessageBuilder  # noqa: E402
from rollouts.providers._clients import client_scope as client_scope  # noqa: E402
from rollouts.providers._clients import shared_ssl_context as shared_ssl_context  # noqa: E402
from rollouts.providers._retry import retry_policy as retry_policy  # noqa: E402
