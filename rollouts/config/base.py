"""The original rollouts' import path for model configuration (`from rollouts.config.base import
BaseModelConfig`).

A thin re-export of `rollouts.config`: `BaseModelConfig` (`model` as `provider/model`,
`infer_provider()`, `to_endpoint()` reading the key from the environment: it has no `api_key`
field, keys stay in environment variables), `infer_provider_from_model`, `parse_model_spec`,
`resolve_model`, `load_config`.
"""

from __future__ import annotations

from rollouts.config import (
    PROVIDER_KEY_ENV,
    BaseModelConfig,
    MissingAPIKeyError,
    RolloutsConfig,
    infer_provider_from_model,
    load_config,
    parse_model_spec,
    resolve_model,
)

__all__ = [
    "PROVIDER_KEY_ENV",
    "BaseModelConfig",
    "MissingAPIKeyError",
    "RolloutsConfig",
    "infer_provider_from_model",
    "load_config",
    "parse_model_spec",
    "resolve_model",
]
