"""Flags and helpers shared by the `rollouts` subcommands."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rollouts.config import BaseModelConfig, RolloutsConfig, load_config, resolve_model
from rollouts.dtypes import Endpoint
from rollouts.errors import RolloutsError
from rollouts.redaction import StreamRedactor
from rollouts.store.files import DEFAULT_SESSIONS_DIR, SESSIONS_DIR_ENV

if TYPE_CHECKING:
    from rollouts.environments import Environment
    from rollouts.store import FileSessionStore

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
    """Keeps the examples in epilogs as written."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)


class ArgumentParser(argparse.ArgumentParser):
    """An ArgumentParser that takes no abbreviated long options, so that `--api-key VALUE` can
    never be read as `--api-key-env VALUE` (and a key echoed back as a variable name)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


class _RefuseKeyFlag(argparse.Action):
    """`--api-key VALUE`: refused with a message that never repeats VALUE."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        env_flag = (option or "--api-key") + "-env"
        raise CLIError(
            f"{option} is not accepted: API keys are never taken from flags (they end up in shell history "
            f"and process lists). Put the key in an environment variable: the provider's usual one "
            f"(ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY) or any NAME given with {env_flag} NAME"
        )


def refuse_key_flag(parser: Any, flag: str) -> None:
    """Make `flag` (e.g. --api-key) an error that explains where keys go."""
    parser.add_argument(flag, action=_RefuseKeyFlag)


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
    refuse_key_flag(g, "--api-key")
    g.add_argument("--max-tokens", type=int, metavar="N", help="maximum output tokens per model call")
    g.add_argument("--temperature", type=float, metavar="T", help="sampling temperature")


ENV_HELP = (
    f"the tools the agent gets: {', '.join(sorted(ENVIRONMENTS))}, or your own environment as "
    "module:Class (the module must be importable: from the current directory or PYTHONPATH; the "
    "class, or any callable, is called with no arguments) (default: [defaults] env in rollouts.toml, else basic)"
)


def _env_arg(value: str) -> str:
    """`--env`'s value checked for its form (a built-in name, or module:Class)."""
    if value in ENVIRONMENTS or is_environment_reference(value):
        return value
    raise argparse.ArgumentTypeError(
        f"unknown environment {value!r}: choose one of {', '.join(sorted(ENVIRONMENTS))}, or name your own "
        "as module:Class (e.g. my_tools:MyEnvironment)"
    )


def add_env_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("environment")
    g.add_argument("--env", type=_env_arg, metavar="NAME|module:Class", help=ENV_HELP)
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


def check_model_available(endpoint: Endpoint, user_modules: bool = False) -> None:
    """CLIError now, rather than a failed model call later, for a scripted model nobody defined.
    With `user_modules`, call it after importing them (--score, --prepare): they may define some."""
    if endpoint.provider != "scripted":
        return
    from rollouts.providers.scripted import get_scripted_model
    from rollouts.providers.scripted_models import BUILTIN_SCRIPTED_MODELS

    try:
        get_scripted_model(endpoint.model)
    except RolloutsError:
        raise CLIError(
            f"no scripted model named {endpoint.model!r}; built-in ones: {', '.join(sorted(BUILTIN_SCRIPTED_MODELS))}"
            + (
                " (a --score or --prepare module can define more with ScriptedModel(..., name=...))"
                if user_modules
                else ""
            )
        ) from None


def rekey_endpoint(endpoint: Endpoint, api_key_env: str | None = None, api_base: str | None = None) -> Endpoint:
    """A stored endpoint (saved without its key) with the key read from the environment again
    (and another server URL, if given)."""
    cfg = BaseModelConfig(
        model=endpoint.model,
        provider=endpoint.provider,
        api_base=api_base or endpoint.api_base,
        api_key_env=api_key_env,
    )
    fresh = cfg.to_endpoint()
    return replace(endpoint, api_key=fresh.api_key, api_base=fresh.api_base)


def sessions_dir(args: argparse.Namespace, config: RolloutsConfig) -> Path:
    chosen = (
        getattr(args, "sessions_dir", None)
        or os.environ.get(SESSIONS_DIR_ENV)
        or config.defaults.get("sessions_dir")
        or DEFAULT_SESSIONS_DIR
    )
    return Path(str(chosen)).expanduser()


@contextmanager
def one_line_warnings() -> Iterator[None]:
    """Inside, a SessionRecoveryWarning (the store repaired or skipped crash damage) prints as
    one line, `rollouts: warning: ...` on stderr, not as Python's warning with a source line."""
    from rollouts.store import SessionRecoveryWarning

    with warnings.catch_warnings():
        show = warnings.showwarning

        def show_line(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if issubclass(category, SessionRecoveryWarning):
                print(f"rollouts: warning: {' '.join(str(message).split())}", file=sys.stderr)
            else:
                show(message, category, *args, **kwargs)

        warnings.showwarning = show_line
        yield


def open_session_store(root: Path) -> FileSessionStore:
    """The FileSessionStore at `root`."""
    from rollouts.store import FileSessionStore

    return FileSessionStore(root)


def _import_attr(target: str) -> Any:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def is_environment_reference(name: str) -> bool:
    """Whether `name` has the form `module:Class` (`package.module:Outer.Inner` too)."""
    module, sep, attr = name.partition(":")
    return (
        bool(sep)
        and all(p.isidentifier() for p in module.split("."))
        and all(p.isidentifier() for p in attr.split("."))
    )


def _import_reference(name: str) -> Any:
    """The object `module:Class` names, imported as `uvicorn module:app` does: the current
    directory comes first on the import path (the CLI's own script directory does not)."""
    module_name, _, qualname = name.partition(":")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise CLIError(
            f"environment {name!r}: cannot import module {module_name!r} ({e}); the module must be importable: "
            "run from the directory that holds it, or add that directory to PYTHONPATH"
        ) from None
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise CLIError(f"environment {name!r}: module {module_name!r} has no {qualname!r}") from None
    if not callable(obj):
        raise CLIError(f"environment {name!r} is a {type(obj).__name__}, not a class or factory")
    return obj


def environment_class(name: str) -> Any:
    """The class behind `--env name`: a built-in name, or your own as `module:Class` (any callable
    of no arguments returning an environment). CLIError if unknown, not importable or not installed."""
    target = ENVIRONMENTS.get(name)
    if target is None:
        if is_environment_reference(name):
            return _import_reference(name)
        raise CLIError(
            f"unknown environment {name!r}; choose one of {', '.join(sorted(ENVIRONMENTS))}, or name your own "
            "as module:Class"
        )
    try:
        return _import_attr(target)
    except (ImportError, AttributeError):
        raise CLIError(f"--env {name} is not available in this installation ({target} is missing)") from None


async def make_environment(name: str, cwd: str | None = None, *, confirm: bool = True) -> Environment:
    """A fresh environment for `--env name`. coding and git work in `cwd` (git: in a new
    worktree of the repository there); with `confirm`, shell commands and file writes ask first.
    Your own (`module:Class`) is called with no arguments (awaited if it returns an awaitable)."""
    cls = environment_class(name)  # imported by name (optional extras): constructors differ per name
    if name not in ENVIRONMENTS:
        return await _own_environment(name, cls)
    root = str(await trio.Path(cwd or os.getcwd()).resolve())
    env: Environment
    try:
        if name == "coding":
            env = cls(root, confirm_bash=confirm, confirm_writes=confirm)
        elif name == "git":
            env = await cls.create(root, confirm_bash=confirm, confirm_writes=confirm)
        else:
            env = cls()
    except ValueError as e:
        raise CLIError(f"--env {name}: {e}") from None
    return env


async def _own_environment(name: str, factory: Any) -> Environment:
    try:
        env = factory()
        if hasattr(env, "__await__"):
            env = await env
    except Exception as e:
        raise CLIError(f"--env {name}: making the environment failed: {type(e).__name__}: {e}") from None
    if not all(callable(getattr(env, m, None)) for m in ("get_tools", "exec_tool", "serialize")):
        raise CLIError(
            f"--env {name} made a {type(env).__name__}, not an environment (it needs get_tools, exec_tool, "
            "serialize and deserialize: see docs/environments.md)"
        )
    return env  # type: ignore[no-any-return]


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


def key_variable_names(args: argparse.Namespace | None = None) -> tuple[str, ...]:
    """Every environment variable an API key may be read from in this command: the providers'
    usual ones, those named by flags (--api-key-env, --reflection-api-key-env, ...) and those
    the config files' endpoints name with api_key_env."""
    from rollouts.providers.keys import PROVIDER_KEY_ENV

    names = [n for names in PROVIDER_KEY_ENV.values() for n in names]
    for flag, value in sorted(vars(args).items()) if args is not None else ():
        if flag.endswith("api_key_env") and isinstance(value, str) and value:
            names.append(value)
    try:
        config = load_config()
    except RolloutsError:  # a broken config file is reported by the command that reads it
        config = RolloutsConfig()
    names += [ep.api_key_env for ep in config.endpoints.values() if ep.api_key_env]
    return tuple(dict.fromkeys(names))


class RedactingStream:
    """A text stream wrapper that keeps every known secret (`rollouts.redaction.known_secrets`)
    off the stream, also when a secret is written in pieces: a tail that could be the start of
    a secret is held back until the next write shows it is not, or until `release()`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._redactor = StreamRedactor()

    def write(self, text: str) -> int:
        out = self._redactor.feed(text)
        if out:
            self._stream.write(out)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def release(self) -> None:
        """Write what is held back (the output ends here) and flush."""
        rest = self._redactor.flush()
        if rest:
            self._stream.write(rest)
        self._stream.flush()

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


@asynccontextmanager
async def stopped_by_ctrl_c(message: str) -> AsyncIterator[tuple[trio.CancelScope, trio.Event]]:
    """`(scope, pressed)`: the first Ctrl-C (SIGINT) prints "^C stopping; `message`" to stderr,
    sets `pressed` and cancels `scope`. Run the work under `scope` (or hand it to the work); ask
    `pressed.is_set()` afterwards, not `scope.cancel_called` (the work may set the scope's deadline).
    For `rollouts eval` and `rollouts gepa`; `rollouts run` has its own two-stage interrupts."""
    scope = trio.CancelScope()
    pressed = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for _ in signals:
                    pressed.set()
                    print(f"\n^C stopping; {message}", file=sys.stderr)
                    scope.cancel()
                    return

            nursery.start_soon(watch)
            yield scope, pressed
            nursery.cancel_scope.cancel()
