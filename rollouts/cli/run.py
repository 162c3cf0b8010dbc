"""`rollouts run`: one question (`-p`) or an interactive chat with an agent.

Every run is a session in the store unless `--no-session`: `--session ID` continues one,
`--session ID --branch-at N` starts a new branch holding its first N messages.

Ctrl-C during a model turn cancels that turn (the partial message is kept and recorded) and
returns to the prompt; a second Ctrl-C exits. Signals are received through trio, so the cancel
is a normal trio cancellation, never a KeyboardInterrupt in the middle of a write.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import trio

from rollouts.agents import run_agent
from rollouts.cli.common import (
    CLIError,
    HelpFormatter,
    add_env_args,
    add_model_args,
    add_sessions_dir_arg,
    check_model_available,
    endpoint_from_args,
    get_config,
    make_environment,
    one_line_warnings,
    open_session_store,
    read_system_prompt,
    rekey_endpoint,
    sessions_dir,
)
from rollouts.cli.mcp_args import add_mcp_args, check_mcp_args, with_mcp
from rollouts.cli.render import JsonRenderer, RunEnd, TerminalRenderer, UserMessage
from rollouts.config import RolloutsConfig
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, StopReason, ToolCall, Trajectory, now_iso
from rollouts.errors import AuthenticationError, ProviderError, RolloutsError
from rollouts.handlers import ToolConfirmResult, confirm_tool_auto_approve, confirm_tool_interactive
from rollouts.redaction import redact_events
from rollouts.run_config import ConfirmTool, RunConfig
from rollouts.store import SessionError, pending_tool_calls, restore_environment

if TYPE_CHECKING:
    from rollouts.environments import Environment
    from rollouts.store import AgentSession, SessionStore

EXAMPLES = """\
examples:
  rollouts run -m anthropic/claude-sonnet-4-5 -p "Explain trio nurseries in two lines"
  rollouts run -m scripted/calculator --env calculator -p "what is 7 + 5 * 3?"
  rollouts run -m local/qwen2.5-coder-0.5b                  # interactive chat, offline
  rollouts run -m openai/gpt-4.1 --env coding --cwd . -p "make the tests pass" --yes
  rollouts run -m openai-compatible/qwen --api-base http://127.0.0.1:8000/v1 -p "hi"
  rollouts run --session ID -p "and then?"                  # continue a session
  rollouts run --session ID --branch-at 2 -p "try again"    # branch after message 2
  rollouts run -m scripted/echo -p hello --json             # one JSON event per line
  echo "a long question" | rollouts run -m scripted/echo -p -

keys come from the provider's variable (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY or
GOOGLE_API_KEY) or the one named by --api-key-env; they are never printed or stored.

interactive: Ctrl-C cancels the current turn, Ctrl-C again (or Ctrl-D, /exit) leaves.

exit status: 0 done, 1 the model or a tool failed, 2 usage or configuration error,
3 stopped early (--max-turns or a budget), 130 interrupted by Ctrl-C.
"""

DEFAULT_MAX_TURNS = 20
_OK_STOPS = (StopReason.TASK_COMPLETED, StopReason.NO_TOOL_CALLED, StopReason.USER_EXIT)
_EARLY_STOPS = (StopReason.MAX_TURNS, StopReason.BUDGET_EXCEEDED)
_MAX_LINE_BYTES = 1 << 20
_MAX_INTERACTIVE_TURNS = 100_000


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run an agent: one question (-p) or an interactive chat",
        description="Run an agent on one question (-p) or chat with it interactively.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("-p", "--prompt", metavar="TEXT", help="ask one question and exit ('-' reads it from stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object per event instead of text")
    add_model_args(p)
    add_env_args(p)
    add_mcp_args(p)
    g = p.add_argument_group("agent")
    g.add_argument("--system-prompt", metavar="TEXT", help="system prompt for a new session")
    g.add_argument("--system-prompt-file", metavar="FILE", help="read the system prompt from FILE")
    g.add_argument("--max-turns", type=int, metavar="N", help=f"model turns per question (default {DEFAULT_MAX_TURNS})")
    g.add_argument("-y", "--yes", action="store_true", help="approve every tool call without asking")
    g.add_argument("--hide-thinking", action="store_true", help="do not show the model's thinking")
    s = p.add_argument_group("sessions")
    s.add_argument("--session", metavar="ID", help="continue this session")
    s.add_argument("--branch-at", type=int, metavar="N", help="with --session: branch it, keeping its first N messages")
    s.add_argument("--no-session", action="store_true", help="do not record this run")
    add_sessions_dir_arg(s)  # type: ignore[arg-type]
    p.set_defaults(func=main)
    return p


# --------------------------------------------------------------------------------------------
# stdin and signals
# --------------------------------------------------------------------------------------------


class _LineReader:
    """Lines from a file descriptor, awaited without a thread (cancellable) where the OS allows."""

    def __init__(self, fd: int = 0) -> None:
        self.fd = fd
        self._buf = b""
        self._eof = False

    async def readline(self) -> str | None:
        """The next line without its newline; None at end of input."""
        while True:
            if b"\n" in self._buf:
                line, _, self._buf = self._buf.partition(b"\n")
                return line.decode("utf-8", errors="replace").rstrip("\r")
            if self._eof:
                if not self._buf:
                    return None
                line, self._buf = self._buf, b""
                return line.decode("utf-8", errors="replace")
            if len(self._buf) > _MAX_LINE_BYTES:
                raise CLIError(f"an input line is longer than {_MAX_LINE_BYTES} bytes")
            try:
                await trio.lowlevel.wait_readable(self.fd)
            except OSError:  # regular files and /dev/null cannot be polled, and never block
                await trio.lowlevel.checkpoint()
            data = os.read(self.fd, 65536)
            if data:
                self._buf += data
            else:
                self._eof = True


class _Interrupts:
    """Turns SIGINT into cancellation: the first cancels the current turn, the next one exits."""

    def __init__(self, renderer: TerminalRenderer, exit_scope: trio.CancelScope) -> None:
        self.renderer = renderer
        self.exit_scope = exit_scope
        self.turn_scope: trio.CancelScope | None = None
        self.armed = False
        self.exit_requested = False

    def on_sigint(self) -> None:
        turn = self.turn_scope
        if turn is not None and not turn.cancel_called:
            turn.cancel()
            self.armed = True
            self.renderer.finish_line()
            self.renderer.status("^C cancelled this turn (Ctrl-C again to exit)")
        elif self.armed or turn is not None:
            self.exit_requested = True
            self.renderer.finish_line()
            self.exit_scope.cancel()
        else:
            self.armed = True
            self.renderer.finish_line()
            self.renderer.status("^C (Ctrl-C again, Ctrl-D or /exit to leave)")

    async def watch(self, signals: AsyncIterator[int]) -> None:
        async for _ in signals:
            self.on_sigint()


# --------------------------------------------------------------------------------------------
# state
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Setup:
    state: AgentState
    env_name: str
    store: SessionStore | None


def _env_name(env: Environment | None) -> str:
    return type(env).__name__ if env is not None else "none"


async def _environment_from_session(session: AgentSession, args: argparse.Namespace) -> Environment:
    """The environment `--env` names, else the session's own as it was after its last message
    (`restore_environment`), else a basic one."""
    if args.env:
        env: Environment = await make_environment(args.env, args.cwd, confirm=not args.yes)
        return await with_mcp(env, args.mcp)
    if args.mcp:
        raise CLIError(
            "--mcp with --session needs --env too: a continued session reconnects to the MCP servers it used"
        )
    try:
        restored = await restore_environment(session)
    except SessionError as e:
        raise CLIError(str(e)) from None
    if restored is None:
        basic: Environment = await make_environment("basic")
        return basic
    return restored


async def _load_session(store: SessionStore, session_id: str) -> tuple[AgentSession, list[Message]]:
    try:
        session, messages = await store.get(session_id)
    except (KeyError, FileNotFoundError, LookupError) as e:
        raise CLIError(f"no session {session_id!r} in {getattr(store, 'root', 'the store')} ({e})") from None
    except RolloutsError as e:
        raise CLIError(str(e)) from None
    return session, list(messages)


async def _branch(store: SessionStore, session_id: str, at: int, n_messages: int) -> str:
    if not 0 <= at <= n_messages:
        raise CLIError(f"--branch-at {at}: session {session_id} has {n_messages} messages (use 0..{n_messages})")
    new = await store.branch(session_id, at, tags={"source": "cli"})
    return str(new.session_id)


def _stored_endpoint(session: AgentSession, args: argparse.Namespace) -> Endpoint:
    """A continued session's own endpoint, its key read again, with the flags given applied."""
    endpoint = rekey_endpoint(session.endpoint, args.api_key_env, args.api_base)
    changes = {k: getattr(args, k) for k in ("max_tokens", "temperature") if getattr(args, k) is not None}
    return replace(endpoint, **changes) if changes else endpoint


async def _setup(
    args: argparse.Namespace, config: RolloutsConfig, store: SessionStore | None, system_prompt: str | None
) -> _Setup:
    if args.session:
        assert store is not None, "main refuses --session with --no-session"
        session, messages = await _load_session(store, args.session)
        session_id = args.session
        if args.branch_at is not None:
            session_id = await _branch(store, args.session, args.branch_at, len(messages))
            session, messages = await _load_session(store, session_id)
        endpoint: Endpoint = endpoint_from_args(args, config) if args.model else _stored_endpoint(session, args)
        env = await _environment_from_session(session, args)
        calls, done = pending_tool_calls(messages)
        state = AgentState(
            actor=Actor(Trajectory(tuple(messages)), endpoint),
            environment=env,
            session_id=session_id,
            pending_tool_calls=calls,
            next_tool_idx=done,
        )
        return _Setup(state, _env_name(env), store)
    endpoint = endpoint_from_args(args, config)
    check_model_available(endpoint)
    env_name = args.env or str(config.defaults.get("env") or "basic")
    env = await with_mcp(await make_environment(env_name, args.cwd, confirm=not args.yes), args.mcp)
    initial: tuple[Message, ...] = (Message("system", system_prompt),) if system_prompt else ()
    return _Setup(AgentState(actor=Actor(Trajectory(initial), endpoint), environment=env), env_name, store)


async def _close_unanswered(state: AgentState, store: SessionStore | None) -> AgentState:
    """After a cancelled turn, answer the calls that never ran so the conversation stays valid
    (a reply cut short mid-stream asks for nothing: see `pending_tool_calls`)."""
    calls, done = pending_tool_calls(state.messages)
    added = [
        Message.tool_result(call, "Not executed: the user interrupted the turn.", is_error=True, timestamp=now_iso())
        for call in calls[done:]
    ]
    state = replace(state.with_messages(*added), pending_tool_calls=(), next_tool_idx=0)
    if added and store is not None and state.session_id is not None:
        with trio.CancelScope(shield=True):
            await store.append_messages(state.session_id, added, expected_count=len(state.messages) - len(added))
    return state


# --------------------------------------------------------------------------------------------
# running turns
# --------------------------------------------------------------------------------------------


class _Runner:
    def __init__(
        self,
        args: argparse.Namespace,
        setup: _Setup,
        renderer: TerminalRenderer,
        json_out: JsonRenderer | None,
        reader: _LineReader,
        max_turns: int,
    ) -> None:
        self.args = args
        self.state = setup.state
        self.store = setup.store
        self.renderer = renderer
        self.json_out = json_out
        self.reader = reader
        self.interrupts: _Interrupts | None = None
        interactive_confirm = sys.stdin.isatty()

        async def on_input(prompt: str) -> str:
            self.renderer.finish_line()
            sys.stderr.write(prompt)
            sys.stderr.flush()
            line = await self.reader.readline()
            return line or ""

        async def confirm_denied(
            call: ToolCall, state: AgentState, rc: RunConfig
        ) -> tuple[AgentState, ToolConfirmResult]:
            self.renderer.status(f"denied {call.name}: needs confirmation (run with --yes to approve tool calls)")
            return state, ToolConfirmResult(False, "tool calls need confirmation and none was possible (no terminal)")

        confirm: ConfirmTool
        if args.yes:
            confirm = confirm_tool_auto_approve
        elif interactive_confirm:
            confirm = confirm_tool_interactive
        else:
            confirm = confirm_denied
        self.run_config = RunConfig(
            # secrets masked in the events, also when cut across deltas (--json consumers join them)
            on_chunk=redact_events(json_out.on_chunk if json_out is not None else renderer.on_chunk),
            on_input=on_input,
            confirm_tool=confirm,
            session_store=self.store,
            max_turns=max_turns,
            session_tags={"source": "cli"},
        )

    @property
    def has_pending_tools(self) -> bool:
        return self.state.next_tool_idx < len(self.state.pending_tool_calls)

    async def ask(self, text: str | None) -> AgentState:
        """Run one user message to the end of the agent's turn (or until Ctrl-C cancels it).
        With `text=None`, continue a resumed session's unfinished tool calls instead."""
        state = replace(self.state, stop=None, error=None, turn_idx=0)
        if text is not None:
            message = Message("user", text, timestamp=now_iso())
            state = state.with_messages(message)
            if self.json_out is not None:
                self.json_out.record(UserMessage(text))
            if self.store is not None and state.session_id is not None:
                # conditional: if another process continued this session, SessionConflictError
                await self.store.append_message(state.session_id, message, expected_count=len(state.messages) - 1)
        scope = trio.CancelScope()
        if self.interrupts is not None:
            self.interrupts.turn_scope = scope
        try:
            states = await run_agent(state, replace(self.run_config, cancel_scope=scope))
        except Exception as e:  # e.g. a rejected key: `--json` readers still get the run's end
            if self.json_out is not None:
                stop = StopReason.PROVIDER_ERROR.value if isinstance(e, ProviderError) else None
                self.json_out.record(RunEnd(state.session_id, stop, f"{type(e).__name__}: {e}", 0, ""))
            raise
        finally:
            if self.interrupts is not None:
                self.interrupts.turn_scope = None
        final = states[-1]
        if final.stop == StopReason.ABORTED:
            final = await _close_unanswered(final, self.store)
        self.renderer.finish_line()
        self.state = final
        self._report(final)
        return final

    def _report(self, final: AgentState) -> None:
        if self.json_out is not None:
            last = next((m for m in reversed(final.messages) if m.role == "assistant"), None)
            self.json_out.record(
                RunEnd(
                    session_id=final.session_id,
                    stop=final.stop.value if final.stop else None,
                    error=final.error,
                    turns=final.turn_idx,
                    text=last.text if last is not None else "",
                    usage=final.actor.trajectory.total_usage(),
                )
            )
            return
        if final.stop in (StopReason.PROVIDER_ERROR, StopReason.CONTEXT_TOO_LONG, StopReason.TOOL_ERROR):
            self.renderer.status(f"error: {final.error or final.stop.value}", error=True)
        elif final.stop in _EARLY_STOPS or final.stop == StopReason.EMPTY_MESSAGE:
            self.renderer.status(f"stopped: {final.error or final.stop.value}", error=True)


def _exit_code(state: AgentState) -> int:
    if state.stop is None or state.stop in _OK_STOPS:
        return 0
    if state.stop == StopReason.ABORTED:
        return 130
    if state.stop in _EARLY_STOPS:
        return 3
    return 1


def _session_note(runner: _Runner) -> None:
    sid = runner.state.session_id
    if sid and runner.json_out is None:
        runner.renderer.status(f"session {sid}  (continue: rollouts run --session {sid})")


async def _one_shot(runner: _Runner, prompt: str) -> int:
    final: AgentState | None = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            runner.interrupts = _Interrupts(runner.renderer, nursery.cancel_scope)
            nursery.start_soon(runner.interrupts.watch, signals)
            if runner.has_pending_tools:
                runner.renderer.status("continuing the session's unfinished tool calls")
                final = await runner.ask(None)
                if final.stop == StopReason.ABORTED:
                    nursery.cancel_scope.cancel()
                    return _exit_code(final)
            final = await runner.ask(prompt)
            nursery.cancel_scope.cancel()
    _session_note(runner)
    if final is None:  # a second Ctrl-C left before the cancelled turn had returned
        return 130
    return _exit_code(final)


def _show_status(runner: _Runner, state: AgentState) -> None:
    """The environment's one-line status after a turn (e.g. the calculator's value)."""
    env = state.environment
    if runner.json_out is not None or env is None:
        return
    try:
        info = env.get_status_info()
    except Exception:  # a status line is a nicety, never a reason to stop
        return
    if info:
        runner.renderer.status("[" + ", ".join(f"{k}: {v}" for k, v in info.items()) + "]")


_HELP = "commands: /exit (or Ctrl-D) leaves, /session shows the session id, /help shows this"


async def _interactive(runner: _Runner, banner: str) -> int:
    tty = sys.stdin.isatty()
    json_mode = runner.json_out is not None
    if not json_mode:
        runner.renderer.status(banner)
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            interrupts = _Interrupts(runner.renderer, nursery.cancel_scope)
            runner.interrupts = interrupts
            nursery.start_soon(interrupts.watch, signals)
            if runner.has_pending_tools:
                runner.renderer.status("continuing the session's unfinished tool calls")
                await runner.ask(None)
            for _ in range(_MAX_INTERACTIVE_TURNS):
                if tty and not json_mode:
                    runner.renderer.finish_line()
                    sys.stdout.write("> ")
                    sys.stdout.flush()
                line = await runner.reader.readline()
                if line is None:
                    if tty and not json_mode:
                        sys.stdout.write("\n")
                    break
                text = line.strip()
                if not text:
                    continue
                if text in ("/exit", "/quit"):
                    break
                if text == "/help":
                    runner.renderer.status(_HELP)
                    continue
                if text == "/session":
                    runner.renderer.status(f"session {runner.state.session_id or '(none yet)'}")
                    continue
                interrupts.armed = False
                try:
                    final = await runner.ask(text)
                    _show_status(runner, final)
                except AuthenticationError:
                    raise
                except RolloutsError as e:
                    runner.renderer.finish_line()
                    runner.renderer.status(f"error: {e}", error=True)
            nursery.cancel_scope.cancel()
    _session_note(runner)
    return 130 if interrupts.exit_requested else 0


async def _main_async(
    args: argparse.Namespace, config: RolloutsConfig, store: SessionStore | None, system_prompt: str | None
) -> int:
    setup = await _setup(args, config, store, system_prompt)
    renderer = TerminalRenderer(show_thinking=not args.hide_thinking, environment=setup.state.environment)
    json_out = JsonRenderer() if args.json else None
    max_turns = args.max_turns or int(config.defaults.get("max_turns") or DEFAULT_MAX_TURNS)
    reader = _LineReader(sys.stdin.fileno())
    runner = _Runner(args, setup, renderer, json_out, reader, max_turns)
    if args.prompt is not None:
        prompt = args.prompt
        if prompt == "-":
            lines = []
            for _ in range(1_000_000):
                line = await reader.readline()
                if line is None:
                    break
                lines.append(line)
            prompt = "\n".join(lines)
        if not prompt.strip():
            raise CLIError("the prompt is empty")
        return await _one_shot(runner, prompt)
    ep = setup.state.actor.endpoint
    where = f"session {setup.state.session_id}" if setup.state.session_id else "a new session"
    if store is None:
        where = "no session (--no-session)"
    banner = (
        f"rollouts: {ep.provider}/{ep.model}, env {setup.env_name}, {where}. "
        "Ctrl-C cancels a turn; Ctrl-D or /exit leaves."
    )
    return await _interactive(runner, banner)


def main(args: argparse.Namespace) -> int:
    if args.branch_at is not None and not args.session:
        raise CLIError("--branch-at needs --session ID (the session to branch)")
    if args.no_session and args.session:
        raise CLIError("--no-session and --session contradict each other")
    if args.session and (args.system_prompt or args.system_prompt_file):
        raise CLIError("--system-prompt applies to new sessions; a continued session keeps its own")
    if args.max_turns is not None and args.max_turns < 1:
        raise CLIError("--max-turns must be at least 1")
    if args.cwd and not os.path.isdir(args.cwd):
        raise CLIError(f"--cwd {args.cwd}: no such directory")
    check_mcp_args(args.mcp)
    config = get_config()
    system_prompt = read_system_prompt(args, config)
    store = None if args.no_session else open_session_store(sessions_dir(args, config))
    with one_line_warnings():
        return trio.run(_main_async, args, config, store, system_prompt)


__all__ = ["add_parser", "main"]
