"""What a request may make the service use, decided by the operator, never by the request.

A workspace token holder names an agent's model, its endpoint and the code its tasks run; the
service's processes hold provider keys and can reach hosts. The operator's policy (a TOML file
given to `serve` and to every `worker` with `--policy FILE` or `$ROLLOUTS_SERVICE_POLICY`) says:

    [credentials.vllm]                       # a name requests use: endpoint.credential = "vllm"
    key_env = "VLLM_KEY"                     # the variable holding its key (omit: no key is sent)
    base_urls = ["http://10.0.0.5:8000/v1"]  # the only addresses it may be sent to
    providers = ["openai-compatible"]        # (optional) the providers that may use it

    [imports]
    allow = ["mypkg.envs", "mypkg.scorers:grade"]   # modules (and their submodules) or module:attr

    [endpoint]
    extra_params = ["my_server_param"]       # extra_params keys allowed beside the built-in ones
    providers = ["transformers"]             # providers allowed beside the built-in ones

    [mcp.github]                             # MCP servers a request may name: environment "mcp/github"
    command = "npx -y @modelcontextprotocol/server-github"   # stdio (or url = "https://..." for HTTP)
    pass_env = ["GITHUB_TOKEN"]              # variables passed to it (headers_from_env for a URL)

Built in, with no file: one credential per hosted provider (`anthropic`: ANTHROPIC_API_KEY,
`openai`: OPENAI_API_KEY, `google`: GEMINI_API_KEY or GOOGLE_API_KEY), each sent only to its
provider's own API (an endpoint that uses it gives no `api_base`), and the built-in environments
and scorers. An endpoint names no key variable (`api_key_env` is refused) and gives an
`api_base` only when its credential lists it; without a credential it sends no key and reaches
no address (the `local` and `scripted` models). No credential may read a variable of the
service's own configuration (`ROLLOUTS_SERVICE_*`, `PG*`, `DATABASE_URL`).

`ServicePolicy.check_endpoint` answers the API (PolicyError names the field: a 422);
`ServicePolicy.endpoint` builds the Endpoint in a worker or the server, checking again (a row
written before the policy changed is refused there, not run).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rollouts.config import BaseModelConfig
from rollouts.dtypes import Endpoint
from rollouts.environments.mcp import MCPServer
from rollouts.errors import ConfigurationError
from rollouts.providers.keys import PROVIDER_KEY_ENV

__all__ = [
    "POLICY_ENV",
    "BUILTIN_EXTRA_PARAMS",
    "Credential",
    "PolicyError",
    "ServicePolicy",
]

POLICY_ENV = "ROLLOUTS_SERVICE_POLICY"

# Variables no credential may read: the service's own configuration (its database URL carries
# the PostgreSQL password; libpq reads PG*).
_OWN_CONFIG = re.compile(r"^(ROLLOUTS_SERVICE_\w*|PG\w*|DATABASE_URL)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"^https?://[^/\s@]+(/[^\s]*)?$", re.IGNORECASE)
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

# Providers a request may name: the hosted APIs, self-hosted OpenAI-compatible servers, the
# embedded model and scripted models. (`transformers` loads weights from a path or a hub name:
# only if the operator adds it.)
BUILTIN_PROVIDERS = frozenset(
    {"anthropic", "google", "local", "llamacpp", "openai", "openai-compatible", "openai-responses", "scripted"}
    | {"sglang", "vllm"}
)

# extra_params keys a request may set: sampling and format parameters, and the ones rollouts
# reads itself. Never keys an SDK or client reads as its own settings (extra_headers,
# extra_query, extra_body, http_options, base_url, api_key, timeout, ...).
BUILTIN_EXTRA_PARAMS = frozenset(
    {
        "api",
        "keepalive",
        "prompt_caching",
        "reasoning_effort",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_sequences",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logprobs",
        "top_logprobs",
        "parallel_tool_calls",
        "tool_choice",
        "response_format",
        "max_completion_tokens",
        "verbosity",
        "service_tier",
    }
)


class PolicyError(ConfigurationError):
    """A request asks for something the operator's policy does not allow; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


@dataclass(frozen=True)
class Credential:
    """A named key the operator lets requests use: read from `key_env` (None: no key is sent),
    sent only to `base_urls` (empty: only to the provider's own API, no `api_base`), by
    `providers` (empty: any allowed provider)."""

    name: str
    key_env: tuple[str, ...] = ()
    base_urls: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for var in self.key_env:
            if not _ENV_NAME.match(var):
                raise ConfigurationError(f"credential {self.name!r}: key_env must be a variable's name, got {var!r}")
            if _OWN_CONFIG.match(var):
                raise ConfigurationError(
                    f"credential {self.name!r}: key_env {var!r} is the service's own configuration, never a "
                    "provider key: put the key in another variable"
                )
        for url in self.base_urls:
            if not _URL.match(url):
                raise ConfigurationError(
                    f"credential {self.name!r}: base_urls must be http:// or https:// URLs without user info, "
                    f"got {url!r}"
                )

    def key(self, environ: Mapping[str, str]) -> str:
        """The key ('' without key_env); raises ConfigurationError naming the variable when unset."""
        for var in self.key_env:
            value = environ.get(var, "").strip()
            if value:
                return value
        if self.key_env:
            raise ConfigurationError(
                f"credential {self.name!r}: {' or '.join(self.key_env)} is not set in this process's environment"
            )
        return ""


def _norm(url: str) -> str:
    return url.rstrip("/")


_BUILTIN_CREDENTIALS = {
    name: Credential(name, tuple(PROVIDER_KEY_ENV[p]), (), provs)
    for name, p, provs in (
        ("anthropic", "anthropic", ("anthropic",)),
        ("openai", "openai", ("openai", "openai-responses")),
        ("google", "google", ("google",)),
    )
}


@dataclass(frozen=True)
class ServicePolicy:
    """The operator's policy (see the module docstring). `ServicePolicy()` is the built-in one."""

    credentials: Mapping[str, Credential] = field(default_factory=lambda: dict(_BUILTIN_CREDENTIALS))
    imports: tuple[str, ...] = ()
    extra_params: frozenset[str] = BUILTIN_EXTRA_PARAMS
    providers: frozenset[str] = BUILTIN_PROVIDERS
    mcp_servers: Mapping[str, MCPServer] = field(default_factory=dict)

    # ---- building ---------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        credentials: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        imports: tuple[str, ...] | list[str] = (),
        extra_params: tuple[str, ...] | list[str] = (),
        providers: tuple[str, ...] | list[str] = (),
        mcp: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> ServicePolicy:
        """The built-in policy plus these credentials (name -> {key_env, base_urls, providers};
        a built-in name is replaced), imports, extra_params keys, providers and MCP servers
        (name -> {command | url, env, pass_env, cwd, headers_from_env})."""
        creds = dict(_BUILTIN_CREDENTIALS)
        for name, spec in (credentials or {}).items():
            creds[name] = _credential(name, spec)
        for ref in imports:
            module, _, attr = str(ref).partition(":")
            if not _MODULE.match(module) or (attr and not _MODULE.match(attr)):
                raise ConfigurationError(f"imports.allow: {ref!r} is not a module or module:attribute")
        return cls(
            credentials=creds,
            imports=tuple(str(r) for r in imports),
            extra_params=BUILTIN_EXTRA_PARAMS | frozenset(str(p) for p in extra_params),
            providers=BUILTIN_PROVIDERS | frozenset(str(p) for p in providers),
            mcp_servers={name: _mcp_server(name, spec) for name, spec in (mcp or {}).items()},
        )

    @classmethod
    def load(cls, path: str | Path) -> ServicePolicy:
        """The policy in a TOML file (ConfigurationError naming the file and the problem)."""
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigurationError(f"service policy {path}: {e}") from None
        unknown = sorted(set(data) - {"credentials", "imports", "endpoint", "mcp"})
        if unknown:
            raise ConfigurationError(f"service policy {path}: unknown section(s) {unknown}")
        try:
            return cls.build(
                data.get("credentials") or {},
                imports=list((data.get("imports") or {}).get("allow", [])),
                extra_params=list((data.get("endpoint") or {}).get("extra_params", [])),
                providers=list((data.get("endpoint") or {}).get("providers", [])),
                mcp=data.get("mcp") or {},
            )
        except ConfigurationError as e:
            raise ConfigurationError(f"service policy {path}: {e}") from None

    @classmethod
    def from_env(cls, path: str | None = None) -> ServicePolicy:
        """The policy in `path`, else in `$ROLLOUTS_SERVICE_POLICY`, else the built-in one."""
        chosen = path or os.environ.get(POLICY_ENV)
        return cls.load(chosen) if chosen else cls()

    # ---- endpoints --------------------------------------------------------------------------

    def check_endpoint(
        self, spec: Mapping[str, Any], field: str = "endpoint", model: str | None = None
    ) -> dict[str, Any]:
        """The endpoint spec if the policy allows it (with `model` replacing its model, when
        given); raises PolicyError naming the field otherwise."""
        self._checked(spec, field, model)
        return dict(spec)

    def endpoint(
        self, spec: Mapping[str, Any], model: str | None = None, environ: Mapping[str, str] | None = None
    ) -> Endpoint:
        """The Endpoint `spec` describes, its key read from its credential's variable."""
        config, cred = self._checked(spec, "endpoint", model)
        key = cred.key(os.environ if environ is None else environ) if cred is not None else ""
        # (the key only ever comes from the credential: never from a variable the spec names)
        endpoint = config.to_endpoint(environ={name: key for name in config.key_env_names()} if key else {})
        return replace(endpoint, api_key=key)

    def _checked(
        self, spec: Mapping[str, Any], field: str, model: str | None
    ) -> tuple[BaseModelConfig, Credential | None]:
        data = dict(spec)
        if "api_key" in data:
            raise PolicyError(
                f"{field}.api_key",
                "API keys are never sent to the service: the operator configures credentials; name one with "
                "`credential`",
            )
        if "api_key_env" in data:
            raise PolicyError(
                f"{field}.api_key_env",
                "a request does not choose which variable a key is read from: name one of the operator's "
                f"credentials with `credential` ({self._names()})",
            )
        cred_name = data.pop("credential", None)
        if cred_name is not None and not isinstance(cred_name, str):
            raise PolicyError(f"{field}.credential", "must be a string")
        if model:
            data["model"] = model
        try:
            config = BaseModelConfig.from_dict(data, source=field)
            provider, _ = config.resolve()
        except (ConfigurationError, TypeError, ValueError) as e:
            raise PolicyError(field, str(e)) from None
        if provider not in self.providers:
            raise PolicyError(
                f"{field}.model",
                f"provider {provider!r} is not allowed on this service (allowed: {', '.join(sorted(self.providers))})",
            )
        if config.extra_params is not None and not isinstance(config.extra_params, Mapping):
            raise PolicyError(f"{field}.extra_params", "must be an object")
        for k in config.extra_params or {}:
            if k not in self.extra_params:
                raise PolicyError(
                    f"{field}.extra_params.{k}",
                    "is not a parameter this service lets requests set (the operator may allow it in the policy's "
                    "[endpoint] extra_params)",
                )
        cred = self._credential_for(cred_name, provider, field)
        base = _norm(config.api_base)
        if cred is None:
            if provider in PROVIDER_KEY_ENV:
                raise PolicyError(
                    f"{field}.credential",
                    f"{provider} needs a key: name one of the operator's credentials ({self._names()})",
                )
            if base:
                raise PolicyError(
                    f"{field}.api_base",
                    "an address needs a credential that lists it: name one with `credential` "
                    f"({self._names()}); the operator configures credentials",
                )
            return config, None
        if cred.providers and provider not in cred.providers:
            raise PolicyError(
                f"{field}.credential", f"credential {cred.name!r} is for {', '.join(cred.providers)}, not {provider}"
            )
        if not cred.key_env and provider in PROVIDER_KEY_ENV:
            raise PolicyError(f"{field}.credential", f"credential {cred.name!r} has no key; {provider} needs one")
        allowed = [_norm(u) for u in cred.base_urls]
        if allowed and base not in allowed:
            raise PolicyError(
                f"{field}.api_base", f"credential {cred.name!r} may only be sent to {', '.join(cred.base_urls)}"
            )
        if not allowed and base:
            raise PolicyError(
                f"{field}.api_base",
                f"credential {cred.name!r} is only sent to {provider}'s own API: give no api_base",
            )
        return config, cred

    def _credential_for(self, name: str | None, provider: str, field: str) -> Credential | None:
        if name is None:
            return self.credentials.get(provider)
        cred = self.credentials.get(name)
        if cred is None:
            raise PolicyError(f"{field}.credential", f"no credential {name!r} on this service ({self._names()})")
        return cred

    def _names(self) -> str:
        return "configured: " + (", ".join(sorted(self.credentials)) or "none")

    # ---- MCP servers ------------------------------------------------------------------------

    def mcp_server(self, name: str, field: str) -> MCPServer:
        """The operator's MCP server `name` (a request names it as environment `mcp/<name>`);
        PolicyError when the policy defines none by that name."""
        server = self.mcp_servers.get(name)
        if server is None:
            configured = ", ".join(sorted(self.mcp_servers)) or "none"
            raise PolicyError(
                field,
                f"no MCP server {name!r} on this service (configured: {configured}); the operator defines them "
                "in the policy's [mcp.NAME] tables",
            )
        return server

    # ---- imports ----------------------------------------------------------------------------

    def check_import(self, ref: str, field: str) -> None:
        """Raise PolicyError unless `module:attr` is allowed (a listed module or one of its
        submodules, or the exact reference); attributes starting with `_` never are."""
        module, _, attr = ref.partition(":")
        if not attr or attr.startswith("_") or any(p.startswith("_") for p in attr.split(".")):
            raise PolicyError(field, f"{ref!r} is not an allowed module:attribute")
        for allowed in self.imports:
            a_mod, _, a_attr = allowed.partition(":")
            if a_attr:
                if ref == allowed:
                    return
            elif module == a_mod or module.startswith(a_mod + "."):
                return
        raise PolicyError(
            field,
            f"{module!r} is not a module this service may import for requests (the operator allows modules in the "
            "policy's [imports] allow; built-in names need no import)",
        )


def _credential(name: str, spec: Mapping[str, Any]) -> Credential:
    if not isinstance(spec, Mapping):
        raise ConfigurationError(f"credentials.{name} must be a table")
    unknown = sorted(set(spec) - {"key_env", "base_urls", "providers"})
    if unknown:
        raise ConfigurationError(
            f"credentials.{name}: unknown setting(s) {unknown}; known: base_urls, key_env, providers"
        )

    def strings(key: str) -> tuple[str, ...]:
        v = spec.get(key, ())
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list | tuple) or not all(isinstance(x, str) for x in v):
            raise ConfigurationError(f"credentials.{name}.{key} must be a string or a list of strings")
        return tuple(v)

    return Credential(name, strings("key_env"), strings("base_urls"), strings("providers"))


_MCP_KEYS = ("command", "url", "env", "pass_env", "cwd", "headers_from_env")


def _mcp_server(name: str, spec: Mapping[str, Any]) -> MCPServer:
    if not isinstance(spec, Mapping) or not _ENV_NAME.match(name):
        raise ConfigurationError(f"mcp.{name} must be a table, named with letters, digits and _")
    unknown = sorted(set(spec) - set(_MCP_KEYS))
    if unknown:
        raise ConfigurationError(f"mcp.{name}: unknown setting(s) {unknown}; known: {', '.join(_MCP_KEYS)}")
    variables = [*spec.get("pass_env", []), *dict(spec.get("headers_from_env", {})).values()]
    for var in variables:
        if not isinstance(var, str) or not _ENV_NAME.match(var) or _OWN_CONFIG.match(var):
            raise ConfigurationError(
                f"mcp.{name}: {var!r} is not a variable an MCP server may be given (a name, not the service's own "
                "configuration)"
            )
    if "url" in spec:
        return MCPServer.http(str(spec["url"]), headers_from_env=dict(spec.get("headers_from_env", {})))
    if "command" not in spec:
        raise ConfigurationError(f"mcp.{name} needs command (stdio) or url (streamable HTTP)")
    return MCPServer.stdio(
        spec["command"], env=dict(spec.get("env", {})), pass_env=list(spec.get("pass_env", [])), cwd=spec.get("cwd")
    )
