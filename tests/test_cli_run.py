"""`rollouts run` one-shot, driven through the real command in a subprocess (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import FAKE_KEYS, cli_env, files_containing, run_cli

from rollouts.cli.render import event_from_dict
from rollouts.dtypes import ToolCall, ToolResult
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


@pytest.mark.parametrize("command", [None, "run", "eval", "doctor"])
def test_help_shows_examples(tmp_path: Path, command: str | None) -> None:
    args = ("--help",) if command is None else (command, "--help")
    r = run_cli(*args, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "examples:" in r.stdout
    assert "rollouts " in r.stdout.split("examples:")[1]


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
