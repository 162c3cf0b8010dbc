"""The `rollouts` command line.

Subcommands live in their own modules and are imported only when used, so `rollouts --help` stays
fast and a piece that is not installed gives a clear error instead of breaking every command.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import signal
import sys
import threading
from collections.abc import Sequence

from rollouts import tracing
from rollouts.cli.common import (
    ArgumentParser,
    CLIError,
    HelpFormatter,
    RedactingStream,
    key_variable_names,
    unwrap_group,
)
from rollouts.redaction import redact_text, register_secret_env

EXAMPLES = """\
examples:
  rollouts run -m anthropic/claude-sonnet-4-5 -p "What is a trio nursery?"
  rollouts run -m local/qwen2.5-coder-0.5b            # chat offline with the embedded model
  rollouts run -m scripted/calculator --env calculator -p "what is 7 + 5 * 3?"
  rollouts run -m openai-compatible/qwen --api-base http://127.0.0.1:8000/v1 -p "hi"
  rollouts eval data.jsonl -m openai/gpt-4.1 --score exact_match --output results/
  rollouts eval-set a.jsonl b.jsonl --models openai/gpt-4.1,anthropic/claude-haiku-4-5 --epochs 3
  rollouts gepa train.jsonl -m local/qwen2.5-coder-0.5b --reflection-model anthropic/claude-sonnet-4-5 \\
      --score exact_match --system-prompt "Answer briefly." --budget 200
  rollouts sessions list
  rollouts view results/ ~/.rollouts/sessions        # browse sessions, eval runs and GEPA runs
  rollouts service serve --workers 2                 # the rollout service: HTTP API + 2 workers, embedded DB
  rollouts train grpo --model smollm2-135m --data prompts.jsonl --score my_task:score --steps 10 --output runs/sum
  rollouts demo                                      # the whole stack offline, no key
  rollouts doctor

models are written provider/model; API keys are read from the provider's environment variable
(ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY/GOOGLE_API_KEY) or --api-key-env NAME.
Named endpoints and defaults can live in rollouts.toml or ~/.config/rollouts/config.toml.
`rollouts COMMAND --help` shows each command's options and examples.
"""

# name -> (module, one-line help). The module defines add_parser(subparsers).
_COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("rollouts.cli.run", "run an agent: one question (-p) or an interactive chat"),
    "eval": ("rollouts.cli.eval", "run a dataset through an agent and score it"),
    "eval-set": ("rollouts.cli.eval_set", "run several datasets with several models into one compared set"),
    "sessions": ("rollouts.cli.sessions", "list, show, branch and export recorded sessions"),
    "gepa": ("rollouts.cli.gepa", "evolve a prompt with GEPA"),
    "view": ("rollouts.cli.view", "browse sessions, evaluations and GEPA runs in a web page"),
    "demo": ("rollouts.cli.demo", "run the demo on the embedded local model (offline, no key)"),
    "doctor": ("rollouts.cli.doctor", "check the installation, keys, local model and storage"),
    "service": ("rollouts.cli.service", "run the rollout service (API + workers) and manage its tokens"),
    "train": ("rollouts.cli.train", "train a model on rollouts (GRPO)"),
}


def _chosen_command(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if arg in _COMMANDS:
            return arg
        if not arg.startswith("-"):
            return None
    return None


def _missing(reason: str, name: str) -> int:
    raise CLIError(f"`rollouts {name}` is not available in this installation ({reason})", exit_code=1)


def _add_command(sub: argparse._SubParsersAction, name: str) -> None:  # type: ignore[type-arg]
    module_name, help_text = _COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        reason = f"{module_name} is missing" if e.name == module_name else f"{module_name}: {e}"
        p = sub.add_parser(name, help=help_text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=lambda args: _missing(reason, name))
        return
    module.add_parser(sub)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. Only the subcommand named in `argv` is imported and fully built."""
    parser = ArgumentParser(
        prog="rollouts",
        description="Run LLM agents as composable, reproducible rollouts.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    from rollouts import __version__

    parser.add_argument("--version", action="version", version=f"rollouts {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen_command(sys.argv[1:] if argv is None else argv)
    for name, (_, help_text) in _COMMANDS.items():
        if name == chosen:
            _add_command(sub, name)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _guard_output(names: tuple[str, ...]) -> None:
    """From now on, the values of the variables `names` (and every other known secret) never
    reach stdout or stderr, not even cut into pieces across writes."""
    register_secret_env(*names)
    if isinstance(sys.stdout, RedactingStream) and isinstance(sys.stderr, RedactingStream):
        return
    for name in ("stdout", "stderr"):
        if not isinstance(getattr(sys, name), RedactingStream):
            setattr(sys, name, RedactingStream(getattr(sys, name)))
    atexit.register(_release_output)  # (also after a traceback printed at exit)


def _release_output() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, RedactingStream):
            stream.release()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    finally:
        if tracing.tracer is not None:
            tracing.disable_tracing()  # (exports the spans still buffered)
        _release_output()  # what the redacting streams hold back: the output ends here


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        # Started with SIGINT ignored (a background job of a non-interactive shell, some CI
        # runners): Ctrl-C / `kill -INT` still means "stop cleanly, keep what is done", as it does
        # once the commands' own SIGINT receivers are installed (they override SIG_IGN anyway).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # before parsing too: argparse repeats arguments it does not know (`--apikey $KEY`)
        _guard_output(key_variable_names())
        parser = build_parser(args_list)
        args = parser.parse_args(args_list)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        _guard_output(key_variable_names(args))  # + the variables named by flags
        tracing.enable_tracing_from_env()  # ROLLOUTS_OTEL=1: OpenTelemetry spans over OTLP (OTEL_* variables)
        try:
            return int(args.func(args) or 0)
        except BaseExceptionGroup as group:
            single = unwrap_group(group)
            if single is group:
                raise
            raise single from None
    except CLIError as e:
        print(f"rollouts: error: {redact_text(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rollouts.errors import ConfigurationError, RolloutsError

        if not isinstance(e, RolloutsError):
            raise
        code = 2 if isinstance(e, ConfigurationError) else 1
        message = " ".join(redact_text(str(e)).split())  # one line
        print(f"rollouts: error: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
