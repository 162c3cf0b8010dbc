"""Interactive `rollouts run` through a pseudo-terminal: type, read the stream, Ctrl-C, leave."""

from __future__ import annotations

import re
from pathlib import Path

import pexpect
from cli_support import CLI, cli_env


def _spawn(tmp: Path, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "run", *args],
        cwd=str(tmp),
        env=cli_env(tmp),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 200),
    )
    child.expect("Ctrl-C cancels a turn")
    child.expect_exact("> ")
    return child


def _finish(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus is None, f"killed by signal {child.signalstatus}"
    return int(child.exitstatus)


def test_type_a_question_and_read_the_streamed_answer(tmp_path: Path) -> None:
    child = _spawn(tmp_path, "-m", "scripted/echo", "--no-session")
    child.sendline("what is up")
    child.expect_exact("thinking: The user wants their words back.")
    child.expect_exact("You said: what is up")
    child.expect_exact("> ")
    child.sendline("second question")
    child.expect_exact("You said: second question")
    child.expect_exact("> ")
    child.sendline("/exit")
    assert _finish(child) == 0


def test_tools_render_in_a_chat(tmp_path: Path) -> None:
    child = _spawn(tmp_path, "-m", "scripted/calculator", "--env", "calculator", "--no-session")
    child.sendline("what is 6 * 7?")
    child.expect_exact("→ multiply(value=7)")
    child.expect_exact("← Multiplied 6 by 7. Current value: 42")
    child.expect_exact("The answer is 42.")
    child.expect_exact("> ")
    child.sendeof()
    assert _finish(child) == 0


def test_ctrl_c_cancels_a_long_turn_then_a_second_ctrl_c_exits(tmp_path: Path) -> None:
    child = _spawn(tmp_path, "-m", "scripted/slow", "--no-session")
    child.sendline("tell me everything")
    child.expect_exact("word3 ")  # the answer is streaming (it would take ~30 s to finish)
    child.sendintr()
    child.expect_exact("cancelled this turn")
    child.expect_exact("> ")  # back at the prompt, the process alive
    assert child.isalive()
    child.sendline("/session")
    child.expect_exact("session (none yet)")
    child.expect_exact("> ")
    child.sendintr()
    assert _finish(child) == 130  # left with Ctrl-C: 130, as documented
    assert "word399" not in (child.before or "")


def test_ctrl_c_at_an_idle_prompt_warns_first(tmp_path: Path) -> None:
    child = _spawn(tmp_path, "-m", "scripted/echo", "--no-session")
    child.sendintr()
    child.expect_exact("Ctrl-C again")
    child.sendline("still here")
    child.expect_exact("You said: still here")
    child.expect_exact("> ")
    child.sendintr()
    child.expect_exact("Ctrl-C again")
    child.sendintr()
    assert _finish(child) == 130


def test_tool_confirmation_prompt_denies_then_approves(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    child = _spawn(tmp_path, "-m", "scripted/shell", "--env", "coding", "--cwd", str(work), "--no-session")
    child.sendline("echo hi > made.txt")
    child.expect_exact("Run bash(command='echo hi > made.txt')? [y/N]")
    child.sendline("n")
    child.expect_exact("The command did not run: The user denied this tool call: n")
    child.expect_exact("> ")
    assert not (work / "made.txt").exists()
    child.sendline("echo hi > made.txt")
    child.expect_exact("[y/N]")
    child.sendline("y")
    child.expect_exact("Done. Output:")
    child.expect_exact("> ")
    assert (work / "made.txt").read_text() == "hi\n"
    child.sendline("/exit")
    assert _finish(child) == 0


def test_ctrl_c_in_a_one_shot_run_exits_130(tmp_path: Path) -> None:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "run", "-m", "scripted/slow", "-p", "go on", "--no-session"],
        cwd=str(tmp_path),
        env=cli_env(tmp_path),
        encoding="utf-8",
        timeout=30,
    )
    child.expect_exact("word2 ")
    child.sendintr()
    child.expect_exact("cancelled this turn")
    assert _finish(child) == 130


def test_thinking_is_dimmed_on_a_colour_terminal(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env(tmp_path).items() if k != "NO_COLOR"}
    env["TERM"] = "xterm-256color"
    child = pexpect.spawn(CLI[0], [*CLI[1:], "run", "-m", "scripted/echo", "--no-session"], cwd=str(tmp_path),
                          env=env, encoding="utf-8", timeout=30)  # fmt: skip
    child.expect_exact("> ")
    child.sendline("hi")
    child.expect_exact("You said: hi")
    shown = child.before + child.after
    child.expect_exact("> ")
    shown += child.before
    dimmed = "".join(re.findall(r"\x1b\[2m([^\x1b]*)\x1b\[0m", shown))  # ANSI faint ... reset
    assert "thinking: The user wants their words back." in dimmed
    assert "You said: hi" in shown and "You said" not in dimmed  # the answer itself is plain
    child.sendline("/exit")
    assert _finish(child) == 0


def test_leaving_chat_with_ctrl_c_exits_130_as_documented(tmp_path: Path) -> None:
    """Issue 13 item 14: Ctrl-C twice at the prompt left with 0; `rollouts run --help` says 130."""
    child = _spawn(tmp_path, "-m", "scripted/echo", "--no-session")
    child.sendline("hello")
    child.expect_exact("You said: hello")
    child.expect_exact("> ")
    child.sendintr()
    child.expect_exact("Ctrl-C again")
    child.sendintr()
    assert _finish(child) == 130
    # leaving with /exit or Ctrl-D is a normal end
    child = _spawn(tmp_path, "-m", "scripted/echo", "--no-session")
    child.sendeof()
    assert _finish(child) == 0
