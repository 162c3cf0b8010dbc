"""`rollouts run` one-shot, driven through the real command in a subprocess (no network)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from cli_support import FAKE_KEYS, cli_env, files_containing, run_cli

from rollouts.cli.render import event_from_dict
from rollouts.dtypes import Message, ToolCall, ToolResult
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamStart,
    TextDelta,
    TextEnd,
    ThinkingDelta,
    ThinkingEnd,
    ToolCallEnd,
    ToolResultReceived,
)
from rollouts.store import FileSessionStore


def test_one_shot_streams_the_answer_to_stdout(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "hello world", "--no-session", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "You said: hello world\n"
    # thinking and status go to stderr, so stdout holds only the answer
    assert "thinking: The user wants their words back." in r.stderr


def test_prompt_from_stdin(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "-", "--no-session", tmp=tmp_path, input="from a pipe\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "You said: from a pipe\n"


def test_calculator_environment_shows_tool_calls_compactly(tmp_path: Path) -> None:
    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 7 + 5 * 3?", "--no-session",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "The answer is 36." in r.stdout
    err_lines = r.stderr.splitlines()
    assert "  → add(value=7)" in err_lines
    assert "  → multiply(value=3)" in err_lines
    assert "  ← Multiplied 12 by 3. Current value: 36" in err_lines
    assert '  → complete_task(final_result="36")' in err_lines


def test_json_output_parses_back_into_events(tmp_path: Path) -> None:
    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--json", "--no-session",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    records = r.json_lines()
    assert records[0] == {"type": "user_message", "text": "what is 2 + 3?"}
    assert records[-1]["type"] == "run_end"
    assert records[-1]["stop"] == "task_completed"
    assert records[-1]["turns"] == 2
    events = [event_from_dict(d) for d in records[1:-1]]
    assert isinstance(events[0], LLMCallStart) and events[0].model == "calculator"
    assert isinstance(events[1], StreamStart)
    calls = [e.tool_call for e in events if isinstance(e, ToolCallEnd)]
    assert all(isinstance(c, ToolCall) for c in calls)
    assert [(c.name, dict(c.arguments)) for c in calls] == [
        ("add", {"value": 2}),
        ("add", {"value": 3}),
        ("complete_task", {"final_result": "5"}),
    ]
    results = [e.result for e in events if isinstance(e, ToolResultReceived)]
    assert all(isinstance(x, ToolResult) for x in results)
    assert results[1].content == "Added 3 to 2. Current value: 5"
    assert results[-1].stop_reason == "task_completed"
    # text deltas of the first turn add up to its TextEnd
    first_text = "".join(e.delta for e in events[: events.index(next(e for e in events if isinstance(e, TextEnd)))]
                         if isinstance(e, TextDelta))  # fmt: skip
    assert first_text == next(e.text for e in events if isinstance(e, TextEnd))
    assert sum(isinstance(e, StreamDone) for e in events) == 2


def test_json_thinking_events(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "hi", "--json", "--no-session", tmp=tmp_path)
    events = [event_from_dict(d) for d in r.json_lines()[1:-1]]
    thinking = "".join(e.delta for e in events if isinstance(e, ThinkingDelta))
    end = next(e for e in events if isinstance(e, ThinkingEnd))
    assert thinking == end.thinking == "The user wants their words back."
    assert r.json_lines()[-1]["text"] == "You said: hi"


def test_provider_failure_exits_non_zero(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/fail", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 1
    assert "error: ProviderError: scripted/fail always fails" in r.stderr
    assert r.stdout == ""


def test_json_run_failure_exits_non_zero(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/fail", "-p", "hi", "--json", "--no-session", "--max-turns", "1", tmp=tmp_path)
    assert r.returncode == 1
    end = r.json_lines()[-1]
    assert end["type"] == "run_end" and end["stop"] == "provider_error"
    assert "scripted/fail always fails" in end["error"]


def test_max_turns_stops_early_with_exit_3(tmp_path: Path) -> None:
    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--max-turns", "1",
        "--no-session", tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 3
    assert "stopped:" in r.stderr and "max_turns=1" in r.stderr


def test_unknown_provider_lists_the_known_ones(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "nosuch/model-x", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unknown provider 'nosuch'" in lines[0]
    assert "known providers:" in lines[0] and "scripted" in lines[0]


def test_ambiguous_bare_model_name_says_how_to_write_it(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "llama3", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert "openai-compatible/llama3 --api-base URL" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("model", "variable"),
    [
        ("anthropic/claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("claude-sonnet-4-5", "ANTHROPIC_API_KEY"),
        ("openai/gpt-4.1", "OPENAI_API_KEY"),
        ("gemini-2.5-flash", "GEMINI_API_KEY"),
    ],
)
def test_missing_key_is_one_line_naming_the_variable(tmp_path: Path, model: str, variable: str) -> None:
    r = run_cli("run", "-m", model, "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert variable in lines[0] and "is not set" in lines[0]


def test_api_key_env_names_the_variable_to_read(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "openai/gpt-4.1", "--api-key-env", "MY_TEAM_KEY", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert "MY_TEAM_KEY is not set" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_api_key_env_refuses_a_key_value(tmp_path: Path) -> None:
    key = "sk-this-is-a-key-not-a-name-12345"
    r = run_cli("run", "-m", "openai/gpt-4.1", "--api-key-env", key, "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert "NAME of an environment variable" in r.stderr
    assert key not in r.stderr and key not in r.stdout


def test_system_prompt_flags_conflict(tmp_path: Path) -> None:
    (tmp_path / "sp.txt").write_text("be brief")
    r = run_cli(
        "run", "-m", "scripted/echo", "--system-prompt", "x", "--system-prompt-file", "sp.txt", "-p", "hi",
        "--no-session", tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2
    assert "not both" in r.stderr


def test_named_endpoint_from_project_config(tmp_path: Path) -> None:
    (tmp_path / "rollouts.toml").write_text(
        '[defaults]\nmodel = "parrot"\n\n[endpoints.parrot]\nmodel = "scripted/echo"\nmax_tokens = 100\n'
    )
    r = run_cli("run", "-p", "from config", "--no-session", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "You said: from config\n"


def test_config_file_may_not_hold_a_key(tmp_path: Path) -> None:
    (tmp_path / "rollouts.toml").write_text('[endpoints.x]\nmodel = "openai/gpt-4.1"\napi_key = "sk-nope-123456"\n')
    r = run_cli("run", "-m", "x", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert "API keys may not be written in config files" in r.stderr
    assert "sk-nope-123456" not in r.stderr


def test_no_key_in_output_with_fake_keys_set(tmp_path: Path) -> None:
    env = cli_env(tmp_path, **FAKE_KEYS)
    outs = []
    for args in (
        ("run", "-m", "scripted/echo", "-p", "hi", "--json", "--no-session"),
        ("run", "-m", "scripted/fail", "-p", "hi", "--no-session"),
        ("doctor", "--json", "--no-verify"),
        ("doctor", "--no-verify"),
    ):
        r = run_cli(*args, tmp=tmp_path, env=env)
        outs.append(r.stdout + r.stderr)
    blob = "\n".join(outs)
    for key in FAKE_KEYS.values():
        assert key not in blob
    assert files_containing(tmp_path, list(FAKE_KEYS.values())) == []


def test_tool_needing_confirmation_is_denied_without_a_terminal_unless_yes(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    args = ("run", "-m", "scripted/shell", "--env", "coding", "--cwd", str(work), "-p", "echo hi > made.txt",
            "--no-session")  # fmt: skip
    r = run_cli(*args, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "run with --yes to approve tool calls" in r.stderr
    assert not (work / "made.txt").exists()
    r = run_cli(*args, "--yes", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (work / "made.txt").read_text() == "hi\n"
    assert "Done. Output:" in r.stdout


@pytest.mark.parametrize(
    "flags",
    [
        ("run", "-m", "openai/gpt-4.1", "--api-key", "sk123abc456secret"),
        ("run", "-m", "openai/gpt-4.1", "--api-key=sk123abc456secret"),
        ("eval", "data.jsonl", "-m", "openai/gpt-4.1", "--api-key", "sk123abc456secret"),
        ("gepa", "data.jsonl", "-m", "openai/gpt-4.1", "--reflection-api-key", "sk123abc456secret"),
    ],
    ids=["run", "run=", "eval", "gepa-reflection"],
)
def test_a_key_given_as_a_flag_is_refused_and_never_repeated(tmp_path: Path, flags: tuple[str, ...]) -> None:
    r = run_cli(*flags, "-p", "hi", tmp=tmp_path) if flags[0] == "run" else run_cli(*flags, tmp=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "is not accepted: API keys are never taken from flags" in lines[0]
    assert "-env NAME" in lines[0]
    assert "sk123abc456secret" not in r.stdout + r.stderr


def test_long_options_are_never_abbreviated(tmp_path: Path) -> None:
    # argparse would read `--api-key-e VALUE` as `--api-key-env VALUE` and then name VALUE in an error
    r = run_cli("run", "-m", "openai/gpt-4.1", "--api-key-e", "sk123abc456secret", "-p", "hi", tmp=tmp_path)
    assert r.returncode == 2
    assert "unrecognized arguments" in r.stderr
    assert "is not set" not in r.stderr
    # and an unknown flag's value, if it is a key in the environment, is scrubbed from argparse's message
    env = cli_env(tmp_path, **FAKE_KEYS)
    key = FAKE_KEYS["OPENAI_API_KEY"]
    r = run_cli("run", "-m", "openai/gpt-4.1", "--apikey", key, "-p", "hi", tmp=tmp_path, env=env)
    assert r.returncode == 2 and "unrecognized arguments: --apikey ***" in r.stderr
    assert key not in r.stderr


def test_openai_compatible_needs_a_server_url(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "openai-compatible/my-model", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "openai-compatible/my-model needs the server's URL: pass --api-base URL" in r.stderr


def test_api_base_must_be_a_url_and_is_not_repeated(tmp_path: Path) -> None:
    r = run_cli(
        "run", "-m", "openai-compatible/m", "--api-base", "sk-not-a-url-123456", "-p", "hi", "--no-session",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2
    assert "must be an http:// or https:// URL" in r.stderr
    assert "sk-not-a-url-123456" not in r.stderr


def test_unknown_scripted_model_lists_the_built_in_ones(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/nosuch", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "rollouts: error: no scripted model named 'nosuch'; built-in ones: calculator, echo, fail, shell, slow"
    )


async def _session(tmp: Path, stderr: str) -> tuple[object, list[Message]]:
    m = re.search(r"session (\S+)  \(continue", stderr)
    assert m, stderr
    session, messages = await FileSessionStore(tmp / "sessions").get(m.group(1))
    return session, list(messages)


def _git_repo(path: Path) -> Path:
    path.mkdir()
    for cmd in (
        ["init", "-q"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "0"],
    ):
        subprocess.run(["git", *cmd], cwd=path, check=True)
    return path


@pytest.mark.parametrize(
    ("env", "type_name"),
    [
        ("basic", "rollouts.environments.basic:BasicEnvironment"),
        ("calculator", "rollouts.environments.calculator:CalculatorEnvironment"),
        ("coding", "rollouts.environments.coding:CodingEnvironment"),
        ("git", "rollouts.environments.git_worktree:GitWorktreeEnvironment"),
        ("browsing", "rollouts.environments.browsing:BrowsingEnvironment"),
    ],
)
async def test_every_env_is_built_and_recorded(tmp_path: Path, env: str, type_name: str) -> None:
    work = _git_repo(tmp_path / "work")  # --cwd for coding and git (the others ignore it)
    r = run_cli("run", "-m", "scripted/echo", "--env", env, "--cwd", str(work), "-p", "hi", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    session, _ = await _session(tmp_path, r.stderr)
    assert session.environment_type == type_name  # type: ignore[attr-defined]


def test_cwd_chooses_the_directory_coding_and_git_work_in(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "--env", "git", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 2 and "is not a git repository" in r.stderr  # tmp_path is not one
    repo = _git_repo(tmp_path / "repo")
    r = run_cli("run", "-m", "scripted/shell", "--env", "git", "--cwd", str(repo), "-p", "echo hi > made.txt", "--yes",
                tmp=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (repo / "made.txt").exists()  # the agent works in its own worktree of the repository...
    branches = subprocess.run(["git", "branch", "--list", "rollouts/*"], cwd=repo, capture_output=True, text=True)
    (branch,) = branches.stdout.split()[-1:]
    show = subprocess.run(["git", "show", f"{branch}:made.txt"], cwd=repo, capture_output=True, text=True)
    assert show.stdout == "hi\n"  # ...and commits there
    work = tmp_path / "work"
    work.mkdir()
    r = run_cli("run", "-m", "scripted/shell", "--env", "coding", "--cwd", "work", "-p", "pwd", "--yes",
                "--no-session", tmp=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert str(work.resolve()) in r.stdout


@pytest.mark.parametrize("how", ["text", "file"])
async def test_system_prompt_starts_the_conversation(tmp_path: Path, how: str) -> None:
    prompt = "You are terse.\nAnswer in one line."
    (tmp_path / "sp.txt").write_text(prompt)
    flag = ("--system-prompt", prompt) if how == "text" else ("--system-prompt-file", "sp.txt")
    r = run_cli("run", "-m", "scripted/echo", *flag, "-p", "hi", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    _, messages = await _session(tmp_path, r.stderr)
    assert [(m.role, m.text) for m in messages] == [("system", prompt), ("user", "hi"), ("assistant", "You said: hi")]


def test_user_config_file_gives_defaults(tmp_path: Path) -> None:
    config = tmp_path / "config" / "rollouts" / "config.toml"  # $XDG_CONFIG_HOME/rollouts/config.toml
    config.parent.mkdir(parents=True)
    config.write_text('[defaults]\nmodel = "calc"\nenv = "calculator"\nmax_turns = 1\n\n'
                      '[endpoints.calc]\nmodel = "scripted/calculator"\n')  # fmt: skip
    r = run_cli("run", "-p", "what is 2 + 3?", "--no-session", tmp=tmp_path)
    assert r.returncode == 3, r.stderr  # one turn allowed: stopped before the answer
    assert "  → add(value=2)" in r.stderr.splitlines()  # the calculator's tools
    assert "max_turns=1" in r.stderr
    r = run_cli("run", "-p", "what is 2 + 3?", "--max-turns", "5", "--no-session", tmp=tmp_path)  # flags win
    assert r.returncode == 0, r.stderr
    assert "The answer is 5." in r.stdout


# ------------------------------------------------------------------------------------------
# Issue 13 item 14 (the smaller ones): what `run` accepts, prints and records
# ------------------------------------------------------------------------------------------


def test_smaller_event_from_dict_parses_every_line_run_json_prints(tmp_path: Path) -> None:
    from rollouts.cli.render import RunEnd, UserMessage, event_to_dict

    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--json", "--no-session",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    records = r.json_lines()
    parsed = [event_from_dict(d) for d in records]  # the first line and the last one included
    assert parsed[0] == UserMessage("what is 2 + 3?")
    assert isinstance(parsed[-1], RunEnd) and parsed[-1].stop == "task_completed" and parsed[-1].usage.output_tokens
    assert [event_to_dict(e) for e in parsed] == records  # and back, line for line
    with pytest.raises(ValueError, match="unknown event type 'nonsense'"):
        event_from_dict({"type": "nonsense"})


async def test_smaller_run_json_ends_with_run_end_on_a_rejected_key(tmp_path: Path) -> None:
    import trio

    from rollouts.testing import FakeTurn, open_fake_server

    key = "team-FAKEKEY-rejected-0123456789"
    turn = FakeTurn(status=401, error_message="Incorrect API key provided", error_code="invalid_api_key")
    async with open_fake_server([turn]) as srv:
        args = ["run", "-m", "openai-compatible/m", "--api-base", srv.base_url, "--api-key-env", "TEAM_KEY",
                "-p", "hi", "--json", "--no-session"]  # fmt: skip
        result = await trio.to_thread.run_sync(
            lambda: run_cli(*args, tmp=tmp_path, env=cli_env(tmp_path, TEAM_KEY=key))
        )
    assert result.returncode == 1
    records = result.json_lines()
    types = [r["type"] for r in records]
    assert types[0] == "user_message" and types[-1] == "run_end" and types.count("run_end") == 1
    end = event_from_dict(records[-1])
    assert end.stop == "provider_error" and "AuthenticationError" in (end.error or "")  # type: ignore[union-attr]
    assert key not in result.stdout + result.stderr


async def test_smaller_a_run_stopped_by_max_turns_is_recorded_as_max_turns(tmp_path: Path) -> None:
    from rollouts.store import SessionStatus

    r = run_cli(
        "run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", "--max-turns", "1",
        tmp=tmp_path,
    )  # fmt: skip
    assert r.returncode == 3, r.stderr
    session, _ = await _session(tmp_path, r.stderr)
    assert session.status == SessionStatus.MAX_TURNS  # not "completed"
    r = run_cli("run", "-m", "scripted/echo", "-p", "hi", tmp=tmp_path)
    session, _ = await _session(tmp_path, r.stderr)
    assert session.status == SessionStatus.COMPLETED


async def test_smaller_a_session_recovery_warning_is_one_clean_line(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "hi", tmp=tmp_path)
    session, _ = await _session(tmp_path, r.stderr)
    log = tmp_path / "sessions" / session.session_id / "messages.jsonl"  # type: ignore[attr-defined]
    log.write_bytes(log.read_bytes() + b'{"role": "user", "con')  # a write torn by a crash
    r = run_cli("run", "--session", session.session_id, "-p", "again", tmp=tmp_path)  # type: ignore[attr-defined]
    assert r.returncode == 0, r.stderr
    warning_lines = [line for line in r.stderr.splitlines() if "incomplete last line" in line]
    assert warning_lines and all(line.startswith("rollouts: warning: ") for line in warning_lines), r.stderr
    assert "SessionRecoveryWarning" not in r.stderr and "warnings.warn" not in r.stderr
    assert "You said: again" in r.stdout
