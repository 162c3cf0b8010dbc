"""Exceptions raised by rollouts. Each names what went wrong and what to do about it."""

from __future__ import annotations


class RolloutsError(Exception):
    """Base class of every error rollouts raises on purpose."""


class ConfigurationError(RolloutsError, ValueError):
    """A user-supplied configuration value is wrong (bad endpoint, unknown provider, ...)."""


class DirectoryInUseError(ConfigurationError):
    """Another run is writing this output_dir (evaluate) or run_dir (GEPA): the message names it."""


class UnknownProviderError(ConfigurationError):
    """No provider is registered under this name."""


class ProviderError(RolloutsError):
    """A model call failed after the retries its Endpoint allows.

    `retryable` says whether the failure was transient (rate limit, overload, dropped
    connection) — evaluate() may try the whole sample again later — or permanent."""

    def __init__(
        self, message: str, *, provider: str = "", status_code: int | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status_code = status_code
        self.retryable = retryable


class AuthenticationError(ProviderError):
    """The provider rejected the API key. Set the provider's key variable (e.g. ANTHROPIC_API_KEY)."""


class ContextTooLongError(ProviderError):
    """The conversation no longer fits the model's context window."""


class RateLimitError(ProviderError):
    """Too many requests; retried with backoff until Endpoint.max_retries is used up."""


class ProviderConnectionError(ProviderError):
    """The connection to the provider failed or broke mid-stream."""


class ModelFileError(RolloutsError):
    """The embedded local model file is missing or fails its hash check."""
