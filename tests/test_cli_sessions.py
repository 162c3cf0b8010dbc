"""Every `rollouts run` is a session: resume with --session, branch with --branch-at, opt out with
--no-session; a cancelled turn's partial message is recorded; no key in any session file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pexpect
from cli_support import CLI, FAKE_KEYS, cli_env, files_containing, run_cli

from rollouts.store import FileSessionStore

_SESSION = re.compile(r"session (\S+)  \(continue")


def _session_id(stderr: str) -> str:
    m = _SESSION.search(stderr)
    assert m, f"no session id in: {stderr!r}"
    return m.group(1)


async def _read(tmp: Path, session_id: str) -> tuple[Any, list[Any]]:
    session, messages = await FileSessionStore(tmp / "sessions").get(session_id)
    return session, list(messages)


async def test_a_run_is_recorded_and_resumes_with_its_environment(tmp_path: Path) -> None:
    first = run_cli("run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3?", tmp=tmp_path)
    assert first.returncode == 0, first.stderr
    sid = _session_id(first.stderr)
    session, messages = await _read(tmp_path, sid)
    assert session.status == "completed"
    assert messages[0].role == "user" and messages[0].text == "what is 2 + 3?"
    assert messages[-1].role == "tool" and "Final result: 5" in messages[-1].text
    assert session.environment_state == {"current_value": 5.0}
    n_first = len(messages)

    # the calculator's value (5) comes back from the session: add 4 -> 9, times 2 -> 18
    second = run_cli("run", "--session", sid, "-p", "what is 4 * 2?", tmp=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "The answer is 18." in second.stdout
    assert _session_id(second.stderr) == sid
    _, messages = await _read(tmp_path, sid)
    assert messages[n_first].role == "user" and messages[n_first].text == "what is 4 * 2?"
    assert len(messages) == 2 * n_first


async def test_branch_at_keeps_the_first_n_messages(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "one", tmp=tmp_path)
    sid = _session_id(r.stderr)
    r = run_cli("run", "--session", sid, "-p", "two", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    _, original = await _read(tmp_path, sid)
    assert [m.text for m in original] == ["one", "You said: one", "two", "You said: two"]

    r = run_cli("run", "--session", sid, "--branch-at", "2", "-p", "other", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "You said: other\n"
    branch_id = _session_id(r.stderr)
    assert branch_id != sid
    branch, messages = await _read(tmp_path, branch_id)
    assert [m.text for m in messages] == ["one", "You said: one", "other", "You said: other"]
    assert branch.parent_id == sid and branch.branch_point == 2
    _, again = await _read(tmp_path, sid)
    assert [m.text for m in again] == [m.text for m in original]  # the original is untouched

    bad = run_cli("run", "--session", sid, "--branch-at", "9", "-p", "x", tmp=tmp_path)
    assert bad.returncode == 2 and "has 4 messages" in bad.stderr


def test_session_errors(tmp_path: Path) -> None:
    r = run_cli("run", "--session", "no-such-session", "-p", "hi", tmp=tmp_path)
    assert r.returncode == 2 and "no-such-session" in r.stderr
    r = run_cli("run", "-m", "scripted/echo", "--branch-at", "1", "-p", "hi", tmp=tmp_path)
    assert r.returncode == 2 and "--branch-at needs --session" in r.stderr


def test_no_session_records_nothing(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/echo", "-p", "hi", "--no-session", tmp=tmp_path)
    assert r.returncode == 0
    sessions = tmp_path / "sessions"
    assert not sessions.exists() or not any(sessions.iterdir())


async def test_ctrl_c_records_the_partial_message(tmp_path: Path) -> None:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], "run", "-m", "scripted/slow"],
        cwd=str(tmp_path),
        env=cli_env(tmp_path),
        encoding="utf-8",
        timeout=30,
    )
    child.expect_exact("> ")
    child.sendline("go")
    child.expect_exact("word4 ")
    child.sendintr()
    child.expect_exact("cancelled this turn")
    child.expect_exact("> ")
    child.sendline("/session")
    child.expect(r"session (\S+)\r?\n")
    sid = child.match.group(1)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130  # left with Ctrl-C (issue 13 item 14)
    session, messages = await _read(tmp_path, sid)
    assert session.status == "aborted"
    last = messages[-1]
    assert last.role == "assistant" and last.details and last.details.get("aborted") is True
    assert last.text.startswith("Here is a long answer: word1 word2 word3 word4")
    assert "word400" not in last.text


def test_no_key_in_session_files(tmp_path: Path) -> None:
    env = cli_env(tmp_path, **FAKE_KEYS)
    r = run_cli("run", "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 1 + 2?", tmp=tmp_path,
                env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "sessions").rglob("*"))
    assert files_containing(tmp_path, list(FAKE_KEYS.values())) == []


async def test_item5_two_chats_continuing_one_session_the_later_one_gets_a_clear_error(tmp_path: Path) -> None:
    first = run_cli("run", "-m", "scripted/echo", "-p", "one", tmp=tmp_path)
    sid = _session_id(first.stderr)

    def chat() -> Any:
        child = pexpect.spawn(
            CLI[0], [*CLI[1:], "run", "--session", sid], cwd=str(tmp_path), env=cli_env(tmp_path), encoding="utf-8"
        )
        child.timeout = 30
        child.expect_exact("> ")  # resumed: it has read the session
        return child

    a, b = chat(), chat()  # both read the session at 2 messages
    a.sendline("from A")
    a.expect_exact("You said: from A")
    a.expect_exact("> ")
    b.sendline("from B")  # B's state is behind the session now: refused, nothing written
    b.expect_exact(f"error: session {sid} now holds 4 messages, not the 2 this append expected")
    b.expect_exact(f"rollouts run --session {sid}`) to continue from its latest message")
    b.expect_exact("> ")  # the chat goes on; what it says next is refused the same way
    b.sendline("/exit")
    b.expect(pexpect.EOF)
    b.close()
    a.sendline("/exit")
    a.expect(pexpect.EOF)
    a.close()
    _, messages = await _read(tmp_path, sid)
    assert [m.text for m in messages] == ["one", "You said: one", "from A", "You said: from A"]
