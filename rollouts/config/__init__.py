"""Model and endpoint selection shared by the CLI and Python callers.

    cfg = BaseModelConfig("anthropic/claude-sonnet-4-5", max_tokens=2048)
    endpoint = cfg.to_endpoint()          # reads ANTHROPIC_API_KEY from the environment

A model is written `provider/model` (`openai/gpt-4.1`, `google/gemini-2.5-flash`,
`local/qwen2.5-coder-0.5b`, `openai-compatible/NAME` with an `api_base`). A bare model name is
accepted when its provider is unambiguous (`infer_provider_from_model`). API keys come only from
environment variables (the provider's usual one, or the one named by `api_key_env`): never from
a flag, never from a config file, and they are never printed or written anywhere.

An optional TOML file holds named endpoints and defaults. `load_config()` reads, in order of
increasing priority, the user file (`$XDG_CONFIG_HOME/rollouts/config.toml`, by default
`~/.config/rollouts/config.toml`), the project file (`rollouts.toml` in the working directory or
the nearest parent holding one) and the file named by `$ROLLOUTS_CONFIG`:

    [defaults]
    model = "fast"                  # an endpoint name below, or provider/model
    max_turns = 20
    sessions_dir = "~/.rollouts/sessions"

    [endpoints.fast]
    model = "openai/gpt-4.1-mini"
    temperature = 0.2

    [endpoints.vllm]
    model = "openai-compatible/Qwen/Qwen2.5-7B-Instruct"
    api_base = "http://127.0.0.1:8000/v1"
    api_key_env = "VLLM_API_KEY"    # optional for servers that need no key
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError, UnknownProviderError
from rollouts.local_model import MODEL_NAMES
from rollouts.providers.keys import PROVIDER_KEY_ENV

__all__ = [
    "PROVIDER_KEY_ENV",
    "BaseModelConfig",
    "MissingAPIKeyError",
    "RolloutsConfig",
    "config_paths",
    "infer_provider_from_model",
    "known_providers",
    "load_config",
    "parse_model_spec",
    "resolve_model",
]


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^https?://[^/\s]+", re.IGNORECASE)


class MissingAPIKeyError(ConfigurationError):
    """The environment variable that should hold the provider's API key is not set."""

    def __init__(self, message: str, *, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


# Providers rollouts ships (registered by their modules); listed here too so that a model spec
# is checked the same way whichever provider modules have been imported.
_STANDARD_PROVIDERS = ("anthropic", "google", "local", "openai", "openai-compatible", "openai-responses", "scripted")


def known_providers() -> list[str]:
    """Every provider name an endpoint may use: the standard ones and any registered."""
    from rollouts.providers import known_providers as registry_known

    return sorted(set(registry_known()) | set(_STANDARD_PROVIDERS))


def infer_provider_from_model(model: str) -> str | None:
    """The provider a bare model name belongs to, or None when it is ambiguous.

    `claude-*` -> anthropic; `gpt-*`, `chatgpt-*`, `o1`/`o3`/`o4*` -> openai; `gemini-*` ->
    google; the embedded model's names -> local."""
    m = model.strip().lower()
    if m.startswith("claude"):
        return "anthropic"
    if m.startswith(("gpt-", "chatgpt-")) or re.match(r"^o\d(?:$|[-.])", m):
        return "openai"
    if m.startswith("gemini"):
        return "google"
    if m in MODEL_NAMES:
        return "local"
    return None


def _unknown_provider(provider: str) -> UnknownProviderError:
    return UnknownProviderError(f"unknown provider {provider!r}; known providers: {', '.join(known_providers())}")


def parse_model_spec(spec: str, *, api_base: str = "") -> tuple[str, str]:
    """Split `provider/model` into (provider, model); infer the provider of a bare name.

    A bare name whose provider cannot be inferred is taken as `openai-compatible` when an
    `api_base` is given; otherwise it is an error that says how to write it."""
    spec = spec.strip()
    if not spec:
        raise ConfigurationError(
            "no model given; pass --model provider/model, e.g. --model anthropic/claude-sonnet-4-5"
        )
    known = known_providers()
    head, sep, rest = spec.partition("/")
    if sep:
        if head in known:
            if not rest:
                raise ConfigurationError(f"model spec {spec!r} has no model name after '{head}/'")
            return head, rest
        inferred = infer_provider_from_model(spec)
        if inferred is None and not api_base:
            raise _unknown_provider(head)
    else:
        inferred = infer_provider_from_model(spec)
    if inferred is not None:
        return inferred, spec
    if api_base:
        return "openai-compatible", spec
    raise ConfigurationError(
        f"cannot tell which provider serves model {spec!r}; write it as provider/model "
        f"(e.g. openai-compatible/{spec} --api-base URL). Known providers: {', '.join(known)}"
    )


@dataclass(frozen=True)
class BaseModelConfig:
    """Which model to use, how to reach it and with which settings — without the key itself.

    `model` is `provider/model` or a bare name (then `provider` may be given, or it is
    inferred). `api_key_env` names the environment variable holding the key; by default the
    provider's usual one. `to_endpoint()` builds the `Endpoint`, reading the key at that moment.
    """

    model: str
    provider: str | None = None
    api_base: str = ""
    api_key_env: str | None = None
    max_tokens: int = 4096
    temperature: float | None = None
    thinking: Mapping[str, Any] | None = None
    max_retries: int = 3
    timeout: float = 120.0
    extra_params: Mapping[str, Any] | None = None
    transport: Literal["auto", "sdk", "http"] = "auto"

    def __post_init__(self) -> None:
        if self.api_key_env is not None and not _ENV_NAME.match(self.api_key_env):
            raise ConfigurationError(
                "api_key_env must be the NAME of an environment variable (letters, digits, _), not "
                "the key itself; put the key in a variable and pass its name"
            )
        if self.api_base and not _URL.match(self.api_base):
            # (the value is not repeated: a key pasted in the wrong place must not be echoed)
            raise ConfigurationError(
                "api_base (--api-base) must be an http:// or https:// URL, e.g. http://127.0.0.1:8000/v1"
            )

    def resolve(self) -> tuple[str, str]:
        """(provider, model name) after parsing `model` and applying `provider`."""
        if self.provider:
            if self.provider not in known_providers():
                raise _unknown_provider(self.provider)
            prefix = f"{self.provider}/"
            return self.provider, self.model[len(prefix) :] if self.model.startswith(prefix) else self.model
        return parse_model_spec(self.model, api_base=self.api_base)

    def infer_provider(self) -> str:
        return self.resolve()[0]

    @property
    def spec(self) -> str:
        """`provider/model`."""
        provider, model = self.resolve()
        return f"{provider}/{model}"

    def key_env_names(self) -> tuple[str, ...]:
        """The environment variables the key is read from (empty: no key needed)."""
        if self.api_key_env:
            return (self.api_key_env,)
        return PROVIDER_KEY_ENV.get(self.resolve()[0], ())

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The key from the environment ('' if the provider needs none); raises
        MissingAPIKeyError naming the variable to set."""
        env = os.environ if environ is None else environ
        names = self.key_env_names()
        if not names:
            return ""
        for name in names:
            value = env.get(name, "").strip()
            if value:
                return value
        provider = self.resolve()[0]
        either = " or ".join(names)
        hint = "" if self.api_key_env else " (or name another variable with --api-key-env NAME)"
        raise MissingAPIKeyError(
            f"{either} is not set: export {names[0]}=... to use {provider}{hint}", variable=names[0]
        )

    def to_endpoint(self, environ: Mapping[str, str] | None = None) -> Endpoint:
        """The Endpoint for this config, with the key read from the environment."""
        provider, model = self.resolve()
        if provider == "scripted":
            from rollouts.providers.scripted_models import BUILTIN_SCRIPTED_MODELS, ensure_builtin_scripted_model

            if model in BUILTIN_SCRIPTED_MODELS:
                ensure_builtin_scripted_model(model)
        if provider == "openai-compatible" and not self.api_base:
            raise ConfigurationError(
                f"openai-compatible/{model} needs the server's URL: pass --api-base URL "
                "(e.g. http://127.0.0.1:8000/v1) or set api_base in the config file"
            )
        return Endpoint(
            provider=provider,
            model=model,
            api_base=self.api_base,
            api_key=self.api_key(environ),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            thinking=self.thinking,
            max_retries=self.max_retries,
            timeout=self.timeout,
            extra_params=self.extra_params,
            transport=self.transport,
        )

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["thinking"] = dict(self.thinking) if self.thinking is not None else None
        d["extra_params"] = dict(self.extra_params) if self.extra_params is not None else None
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> BaseModelConfig:
        """Build from a mapping (e.g. a TOML table). Refuses `api_key` and `oauth_token`: keys stay
        in the environment."""
        if "api_key" in data or "oauth_token" in data:
            raise ConfigurationError(
                f"{source}: API keys may not be written in config files; put the key in an environment "
                'variable and name it with api_key_env = "NAME"'
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(f"{source}: unknown setting(s) {unknown}; known: {sorted(known)}")
        if "model" not in data:
            raise ConfigurationError(f'{source}: needs model = "provider/model"')
        return cls(**dict(data))


# --------------------------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------------------------

_DEFAULT_KEYS = ("model", "max_turns", "sessions_dir", "results_dir", "env", "system_prompt", "max_concurrent")


@dataclass(frozen=True)
class RolloutsConfig:
    """What the config files say: `defaults` and named `endpoints`, plus where they came from."""

    defaults: Mapping[str, Any] = field(default_factory=dict)
    endpoints: Mapping[str, BaseModelConfig] = field(default_factory=dict)
    sources: tuple[Path, ...] = ()


def _user_config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", str(Path.home()))) / ".config")
    return Path(base) / "rollouts" / "config.toml"


def _project_config_path(start: Path) -> Path | None:
    for d in (start, *start.parents):
        candidate = d / "rollouts.toml"
        if candidate.is_file():
            return candidate
    return None


def config_paths(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> list[Path]:
    """The config files that exist, lowest priority first."""
    env = os.environ if environ is None else environ
    paths: list[Path] = []
    user = _user_config_path(env)
    if user.is_file():
        paths.append(user)
    project = _project_config_path((cwd or Path.cwd()).resolve())
    if project is not None and project not in paths:
        paths.append(project)
    explicit = env.get("ROLLOUTS_CONFIG")
    if explicit:
        p = Path(explicit).expanduser()
        if not p.is_file():
            raise ConfigurationError(f"ROLLOUTS_CONFIG points at {p}, which does not exist")
        if p not in paths:
            paths.append(p)
    return paths


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigurationError(f"{path}: not valid TOML: {e}") from None
    unknown = sorted(set(data) - {"defaults", "endpoints"})
    if unknown:
        raise ConfigurationError(f"{path}: unknown table(s) {unknown}; a config has [defaults] and [endpoints.NAME]")
    return data


def load_config(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> RolloutsConfig:
    """Read and merge the config files (later files override earlier ones key by key)."""
    paths = config_paths(cwd, environ)
    defaults: dict[str, Any] = {}
    endpoints: dict[str, BaseModelConfig] = {}
    for path in paths:
        data = _read_toml(path)
        d = data.get("defaults", {})
        if not isinstance(d, dict):
            raise ConfigurationError(f"{path}: [defaults] must be a table")
        bad = sorted(set(d) - set(_DEFAULT_KEYS))
        if bad:
            raise ConfigurationError(f"{path}: unknown [defaults] key(s) {bad}; known: {list(_DEFAULT_KEYS)}")
        defaults.update(d)
        eps = data.get("endpoints", {})
        if not isinstance(eps, dict):
            raise ConfigurationError(f"{path}: [endpoints] must hold tables like [endpoints.NAME]")
        for name, table in eps.items():
            if not isinstance(table, dict):
                raise ConfigurationError(f"{path}: endpoints.{name} must be a table")
            endpoints[name] = BaseModelConfig.from_dict(table, source=f"{path} [endpoints.{name}]")
    return RolloutsConfig(defaults=defaults, endpoints=endpoints, sources=tuple(paths))


def resolve_model(
    spec: str | None,
    config: RolloutsConfig | None = None,
    *,
    api_base: str | None = None,
    api_key_env: str | None = None,
    **overrides: Any,
) -> BaseModelConfig:
    """The BaseModelConfig for `spec`: a named endpoint from the config, or `provider/model`.

    With no `spec`, the config's `defaults.model` is used. Keyword `overrides` (max_tokens,
    temperature, ...) whose value is not None replace the endpoint's settings."""
    cfg = config or RolloutsConfig()
    chosen = spec or cfg.defaults.get("model")
    if not chosen:
        raise ConfigurationError(
            "no model given; pass --model provider/model (e.g. --model anthropic/claude-sonnet-4-5, "
            "--model local/qwen2.5-coder-0.5b) or set [defaults] model in rollouts.toml"
        )
    base = cfg.endpoints.get(chosen)
    if base is None:
        base = BaseModelConfig(model=chosen)
    changes = {k: v for k, v in overrides.items() if v is not None}
    if api_base:
        changes["api_base"] = api_base
    if api_key_env:
        changes["api_key_env"] = api_key_env
    result = replace(base, **changes) if changes else base
    result.resolve()  # fail early on an unknown provider or an ambiguous name
    return result
