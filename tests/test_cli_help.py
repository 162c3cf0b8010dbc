"""The console script itself, and `--help` of every command (with examples)."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

import pytest
from cli_support import CLI, CONSOLE_SCRIPT, run_cli

import rollouts
from rollouts.cli import _COMMANDS

SESSION_ACTIONS = ("list", "show", "tree", "branch", "export")


def test_the_tests_drive_the_installed_console_script(tmp_path: Path) -> None:
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="rollouts")
    assert entry.value == "rollouts.cli:main"
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT} is missing: pip install -e ."
    assert CLI == [str(CONSOLE_SCRIPT)]
    r = run_cli("--version", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"rollouts {rollouts.__version__}"


def _examples(text: str) -> list[str]:
    assert "examples:" in text, text
    return [line.strip() for line in text.split("examples:", 1)[1].splitlines() if line.strip().startswith("rollouts ")]


@pytest.mark.parametrize(
    "command", [(), *((c,) for c in _COMMANDS), *(("sessions", a) for a in SESSION_ACTIONS)], ids=" ".join
)
def test_help_shows_examples(tmp_path: Path, command: tuple[str, ...]) -> None:
    r = run_cli(*command, "--help", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    examples = _examples(r.stdout)
    assert examples, r.stdout
    if command:  # a command's examples are of that command
        assert all(e.split()[1] == command[0] or e.startswith("rollouts run --session") for e in examples), examples


def test_top_level_help_has_an_example_of_every_command(tmp_path: Path) -> None:
    r = run_cli("--help", tmp=tmp_path)
    shown = {e.split()[1] for e in _examples(r.stdout)}
    assert shown == set(_COMMANDS), shown
    for command in _COMMANDS:
        assert re.search(rf"^    {command} ", r.stdout, re.M), f"{command} is not listed"


def test_no_command_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    r = run_cli(tmp=tmp_path)
    assert r.returncode == 2
    assert "examples:" in r.stdout
    r = run_cli("sessions", tmp=tmp_path)
    assert r.returncode == 2 and "ACTION" in r.stdout


def _readme_command_lines() -> list[str]:
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    text = text.replace("\\\n", " ")  # continued lines
    parts = [part.strip().removeprefix("$ ") for line in text.splitlines() for part in line.split("&&")]
    return [part for part in parts if part.startswith("rollouts ")]


def test_readme_command_lines_parse() -> None:
    from rollouts.cli import build_parser

    commands = _readme_command_lines()
    assert {c.split()[1] for c in commands} >= {"run", "eval", "sessions", "gepa", "demo"}, commands
    for line in commands:
        argv = shlex.split(line, comments=True)[1:]
        args = build_parser(argv).parse_args(argv)
        assert args.func is not None, line
