"""Which environment variables hold each provider's API key: one table, read by the providers
(to find the key) and by `rollouts.config` and the CLI (to name, check and scrub it).

A provider with no entry needs no key (`local`, `scripted`) or takes one only through
`Endpoint.api_key` / a config's `api_key_env` (`openai-compatible` and its aliases: your OpenAI
key is never sent to an arbitrary server).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from rollouts.dtypes import Endpoint
from rollouts.errors import AuthenticationError

# Provider -> the environment variables its key is read from, in order of preference.
PROVIDER_KEY_ENV: Mapping[str, tuple[str, ...]] = {
    "anthropic": ("ANTHROPIC_API_KEY",),
    "openai": ("OPENAI_API_KEY",),
    "openai-responses": ("OPENAI_API_KEY",),
    "google": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
}
_DISPLAY = {"anthropic": "Anthropic", "openai": "OpenAI", "openai-responses": "OpenAI", "google": "Google"}


def api_key_for(endpoint: Endpoint, provider: str) -> str:
    """`endpoint.api_key`, else the first non-empty variable of `provider`'s row; raises
    AuthenticationError naming the variables (and `Endpoint.api_key`) when there is none."""
    if endpoint.api_key:
        return endpoint.api_key
    names = PROVIDER_KEY_ENV[provider]
    for name in names:
        key = os.environ.get(name, "")
        if key:
            return key
    variables = names[0] + (f" (or {', '.join(names[1:])})" if len(names) > 1 else "")
    raise AuthenticationError(
        f"no {_DISPLAY.get(provider, provider)} API key: set the {variables} environment variable or Endpoint.api_key",
        provider=endpoint.provider,
    )
