"""Flags and helpers shared by the `rollouts` subcommands."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from rollouts.config import BaseModelConfig, RolloutsConfig, load_config, resolve_model
from rollouts.dtypes import Endpoint
from rollouts.errors import ConfigurationError, RolloutsError
from rollouts.store.files import DEFAULT_SESSIONS_DIR, SESSIONS_DIR_ENV

ENVIRONMENTS: dict[str, str] = {
    "basic": "rollouts.environments.basic:BasicEnvironment",
    "calculator": "rollouts.environments.calculator:CalculatorEnvironment",
    "coding": "rollouts.environments.coding:CodingEnvironment",
    "git": "rollouts.environments.git_worktree:GitWorktreeEnvironment",
    "browsing": "rollouts.environments.browsing:BrowsingEnvironment",
}


class CLIError(RolloutsError):
    """A user error the CLI reports as one line and an exit code."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written, with defaults shown for flags."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument(
        "-m",
        "--model",
        metavar="PROVIDER/MODEL",
        help="e.g. anthropic/claude-sonnet-4-5, openai/gpt-4.1, google/gemini-2.5-flash, "
        "local/qwen2.5-coder-0.5b, openai-compatible/NAME (with --api-base), scripted/echo; "
        "a bare name works when the provider is clear (claude-*, gpt-*, gemini-*), and so does "
        "an endpoint name from rollouts.toml",
    )
    g.add_argument("--api-base", metavar="URL", help="server URL (required for openai-compatible)")
    g.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="read the API key from this environment variable instead of the provider's usual one "
        "(keys are never taken from flags)",
    )
    g.add_argument("--max-tokens", type=int, metavar="N", help="maximum output tokens per model call")
    g.add_argument("--temperature", type=float, metavar="T", help="sampling temperature")


def add_env_args(parser: argparse.ArgumentParser, default: str | None = "basic") -> None:
    g = parser.add_argument_group("environment")
    g.add_argument(
        "--env",
        choices=sorted(ENVIRONMENTS),
        default=default,
        help="the tools the agent gets (default: %(default)s)",
    )
    g.add_argument("--cwd", metavar="DIR", help="working directory for --env coding/git (default: current directory)")


def add_sessions_dir_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sessions-dir",
        metavar="DIR",
        help=f"where sessions are stored (default: ${SESSIONS_DIR_ENV}, rollouts.toml, or {DEFAULT_SESSIONS_DIR})",
    )


def get_config() -> RolloutsConfig:
    return load_config()


def model_config_from_args(args: argparse.Namespace, config: RolloutsConfig) -> BaseModelConfig:
    return resolve_model(
        getattr(args, "model", None),
        config,
        api_base=getattr(args, "api_base", None),
        api_key_env=getattr(args, "api_key_env", None),
        max_tokens=getattr(args, "max_tokens", None),
        temperature=getattr(args, "temperature", None),
    )


def endpoint_from_args(args: argparse.Namespace, config: RolloutsConfig) -> Endpoint:
    """The Endpoint the flags (and config files) select, with its key read from the environment."""
    return model_config_from_args(args, config).to_endpoint()


def rekey_endpoint(endpoint: Endpoint, api_key_env: str | None = None) -> Endpoint:
    """A stored endpoint (saved without its key) with the key read from the environment again."""
    cfg = BaseModelConfig(
        model=endpoint.model, provider=endpoint.provider, api_base=endpoint.api_base, api_key_env=api_key_env
    )
    fresh = cfg.to_endpoint()
    return replace(endpoint, api_key=fresh.api_key)


def sessions_dir(args: argparse.Namespace, config: RolloutsConfig) -> Path:
    chosen = (
        getattr(args, "sessions_dir", None)
        or os.environ.get(SESSIONS_DIR_ENV)
        or config.defaults.get("sessions_dir")
        or DEFAULT_SESSIONS_DIR
    )
    return Path(str(chosen)).expanduser()


def open_session_store(root: Path) -> Any:
    """The FileSessionStore at `root`."""
    from rollouts.store import FileSessionStore

    return FileSessionStore(root)


def _import_attr(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def environment_class(name: str) -> Any:
    """The class behind `--env name` (CLIError if unknown or not installed)."""
    target = ENVIRONMENTS.get(name)
    if target is None:
        raise CLIError(f"unknown environment {name!r}; choose one of {', '.join(sorted(ENVIRONMENTS))}")
    try:
        return _import_attr(target)
    except (ImportError, AttributeError):
        raise CLIError(f"--env {name} is not available in this installation ({target} is missing)") from None


async def make_environment(name: str, cwd: str | None = None, *, confirm: bool = True) -> Any:
    """A fresh environment for `--env name`. coding and git work in `cwd` (git: in a new
    worktree of the repository there); with `confirm`, shell commands and file writes ask first."""
    cls = environment_class(name)
    root = str(await trio.Path(cwd or os.getcwd()).resolve())
    try:
        if name == "coding":
            return cls(root, confirm_bash=confirm, confirm_writes=confirm)
        if name == "git":
            return await cls.create(root, confirm_bash=confirm, confirm_writes=confirm)
        return cls()
    except ValueError as e:
        raise CLIError(f"--env {name}: {e}") from None


def load_callable(ref: str, what: str) -> Callable[..., Any]:
    """Import `module:function` (or `path/to/file.py:function`); the current directory is importable."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"{what} must look like module:function (e.g. my_evals:score), got {ref!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = Path(module_name).resolve()
            if not path.is_file():
                raise CLIError(f"{what}: no such file {module_name}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise CLIError(f"{what}: cannot import {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise CLIError(f"{what}: {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def read_system_prompt(args: argparse.Namespace, config: RolloutsConfig) -> str | None:
    text = getattr(args, "system_prompt", None)
    path = getattr(args, "system_prompt_file", None)
    if text and path:
        raise CLIError("give --system-prompt or --system-prompt-file, not both")
    if path:
        try:
            return Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise CLIError(f"--system-prompt-file: cannot read {path}: {e.strerror}") from None
    if text:
        return str(text)
    default = config.defaults.get("system_prompt")
    return str(default) if default else None


def config_error_exit_code(e: Exception) -> int:
    return 2 if isinstance(e, ConfigurationError) else 1


def secret_values(extra_env_names: tuple[str, ...] = ()) -> list[str]:
    """The values of every API-key variable we know of (to scrub them from messages)."""
    from rollouts.config import PROVIDER_KEY_ENV

    names = {n for names in PROVIDER_KEY_ENV.values() for n in names} | set(extra_env_names)
    return [v for v in (os.environ.get(n, "").strip() for n in names) if len(v) >= 4]


def redact(text: str, extra_env_names: tuple[str, ...] = ()) -> str:
    """`text` with any API key value replaced by ***."""
    for value in secret_values(extra_env_names):
        text = text.replace(value, "***")
    return text


class RedactingStream:
    """A text stream wrapper that replaces API key values before they are written."""

    def __init__(self, stream: Any, secrets: list[str]) -> None:
        self._stream = stream
        self._secrets = sorted(set(secrets), key=len, reverse=True)

    def write(self, text: str) -> int:
        for value in self._secrets:
            if value in text:
                text = text.replace(value, "***")
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def unwrap_group(e: BaseException) -> BaseException:
    """The single real error inside (nested) exception groups, or `e` itself."""
    for _ in range(100):
        if not isinstance(e, BaseExceptionGroup):
            return e
        real = [x for x in e.exceptions if not isinstance(x, trio.Cancelled)]
        if len(real) != 1:
            return e
        e = real[0]
    return e
