"""`rollouts sessions list | show | tree | branch | export`, driven as a real subprocess."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli_support import run_cli

from rollouts import Message
from rollouts.store import FileSessionStore

_SESSION = re.compile(r"session (\S+)  \(continue")


def _run(tmp: Path, *args: str) -> str:
    r = run_cli("run", *args, tmp=tmp)
    assert r.returncode == 0, r.stderr
    m = _SESSION.search(r.stderr)
    assert m, r.stderr
    return m.group(1)


def _calculator_session(tmp: Path) -> str:
    return _run(tmp, "-m", "scripted/calculator", "--env", "calculator", "-p", "what is 2 + 3 * 4?")


def test_list_shows_sessions_newest_first_with_filters_and_json(tmp_path: Path) -> None:
    calc = _calculator_session(tmp_path)
    echo = _run(tmp_path, "-m", "scripted/echo", "-p", "hello there")
    r = run_cli("sessions", "list", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "MSGS"]
    assert lines[1].startswith(echo) and "completed" in lines[1] and "scripted/echo" in lines[1]
    assert "hello there" in lines[1]
    assert lines[2].startswith(calc) and " 7 " in lines[2] and "what is 2 + 3 * 4?" in lines[2]

    r = run_cli("sessions", "list", "--limit", "1", "--json", tmp=tmp_path)
    records = r.json_lines()
    assert [x["session_id"] for x in records] == [echo]
    assert records[0]["message_count"] == 2 and records[0]["status"] == "completed"
    assert "api_key" not in records[0]["endpoint"]

    r = run_cli("sessions", "list", "--status", "aborted", tmp=tmp_path)
    assert r.returncode == 0 and r.stdout == "" and "no sessions" in r.stderr
    r = run_cli("sessions", "list", "--tag", "source=cli", "--json", tmp=tmp_path)
    assert [x["session_id"] for x in r.json_lines()] == [echo, calc]
    r = run_cli("sessions", "list", "--tag", "nonsense", tmp=tmp_path)
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr


def test_show_renders_every_kind_of_block(tmp_path: Path) -> None:
    calc = _calculator_session(tmp_path)
    echo = _run(tmp_path, "-m", "scripted/echo", "-p", "hi")
    r = run_cli("sessions", "show", calc, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith(f"session {calc}\n")
    assert "status       completed" in out and "model        scripted/calculator" in out
    assert 'CalculatorEnvironment {"current_value": 20.0}' in out
    assert "[0] user\n    what is 2 + 3 * 4?" in out
    assert "-> add(value=2)  [call_1_0]" in out or "→ add(value=2)  [call_1_0]" in out
    assert "[2] tool  add\n" in out and "Added 2 to 0. Current value: 2" in out
    assert "The answer is 20." in out and "Final result: 20" in out

    r = run_cli("sessions", "show", echo, tmp=tmp_path)
    assert "thinking: The user wants their words back." in r.stdout
    assert "You said: hi" in r.stdout


def test_branch_tree_and_continue_a_branch(tmp_path: Path) -> None:
    calc = _calculator_session(tmp_path)
    r = run_cli("sessions", "branch", calc, "--at", "3", "--tag", "try=two", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    branch = r.stdout.strip()
    assert f"rollouts run --session {branch}" in r.stderr
    r = run_cli("sessions", "branch", branch, "--at", "1", tmp=tmp_path)
    grandchild = r.stdout.strip()

    # the branch resumes the interrupted turn with the environment of message 3 (value 2)
    r = run_cli("run", "--session", branch, "-p", "what is 1 + 1?", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Added 3 to 2. Current value: 5" in r.stderr

    r = run_cli("sessions", "tree", branch, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(calc) and "7 msgs" in lines[0]
    assert re.match(rf"^(└── |`-- )@3 {branch}  completed .*<- this one$", lines[1]), lines[1]
    assert re.match(rf"^    (└── |`-- )@1 {grandchild}  pending +1 msgs", lines[2]), lines[2]
    assert len(lines) == 3

    r = run_cli("sessions", "list", "--tag", "try=two", "--json", tmp=tmp_path)
    assert [x["session_id"] for x in r.json_lines()] == [grandchild, branch]  # a branch inherits tags

    r = run_cli("sessions", "branch", calc, "--at", "8", tmp=tmp_path)
    assert r.returncode == 2 and "it has 7 messages (use 0..7)" in r.stderr


async def test_export_formats(tmp_path: Path) -> None:
    sid = _run(tmp_path, "-m", "scripted/echo", "-p", "<script>alert(1)</script> ``` fence")
    store = FileSessionStore(tmp_path / "sessions")
    _, messages = await store.get(sid)

    r = run_cli("sessions", "export", sid, "--format", "jsonl", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [Message.from_dict(json.loads(line)) for line in r.stdout.splitlines()] == list(messages)

    r = run_cli("sessions", "export", sid, tmp=tmp_path)  # markdown by default
    md = r.stdout
    assert md.startswith(f"# Session {sid}\n")
    assert "## [1] assistant  scripted/echo" in md
    assert "<details><summary>thinking</summary>" in md and "The user wants their words back." in md
    assert "<script>alert(1)</script> ``` fence" in md

    out = tmp_path / "chat.html"
    r = run_cli("sessions", "export", sid, "--format", "html", "-o", str(out), tmp=tmp_path)
    assert r.returncode == 0 and r.stdout == "" and "wrote" in r.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "You said: &lt;script&gt;" in page


def test_errors_and_help(tmp_path: Path) -> None:
    for action in ("show", "tree", "export"):
        r = run_cli("sessions", action, "no-such-id", tmp=tmp_path)
        assert r.returncode == 2 and "no session 'no-such-id'" in r.stderr, r.stderr
    r = run_cli("sessions", "branch", "no-such-id", "--at", "0", tmp=tmp_path)
    assert r.returncode == 2 and "no-such-id" in r.stderr

    sid = _run(tmp_path, "-m", "scripted/echo", "-p", "x")
    (tmp_path / "sessions" / sid / "session.json").write_text("{")
    r = run_cli("sessions", "show", sid, tmp=tmp_path)
    assert r.returncode == 1 and "session.json is not valid JSON" in r.stderr
    r = run_cli("sessions", "list", tmp=tmp_path)
    assert r.returncode == 0 and "warning: skipped a damaged session" in r.stderr

    r = run_cli("sessions", "--help", tmp=tmp_path)
    assert r.returncode == 0 and "examples:" in r.stdout and "rollouts sessions branch ID --at 4" in r.stdout
    r = run_cli("sessions", tmp=tmp_path)
    assert r.returncode == 2 and "list" in r.stdout


def test_item13_list_and_tree_show_the_rest_and_mark_a_damaged_session(tmp_path: Path) -> None:
    calc = _calculator_session(tmp_path)
    branch = run_cli("sessions", "branch", calc, "--at", "3", tmp=tmp_path).stdout.strip()
    sibling = run_cli("sessions", "branch", calc, "--at", "1", tmp=tmp_path).stdout.strip()
    echo = _run(tmp_path, "-m", "scripted/echo", "-p", "still here")
    (tmp_path / "sessions" / branch / "messages.jsonl").write_text('{"role": garbage\n')  # damaged log

    r = run_cli("sessions", "list", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert set(rows) == {calc, branch, sibling, echo}
    assert rows[branch].split()[1] == "DAMAGED" and "messages.jsonl:1: not valid JSON" in rows[branch]
    assert "still here" in rows[echo] and " 7 " in rows[calc]
    r = run_cli("sessions", "list", "--json", tmp=tmp_path)
    records = {x["session_id"]: x for x in r.json_lines()}
    assert "not valid JSON" in records[branch]["damaged"] and records[echo]["message_count"] == 2

    r = run_cli("sessions", "tree", sibling, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(calc) and "7 msgs" in lines[0]
    assert re.match(rf"^(├── |\|-- )@3 {branch}  DAMAGED: .*not valid JSON", lines[1]), lines[1]
    assert re.match(rf"^(└── |`-- )@1 {sibling}  pending +1 msgs .*<- this one$", lines[2]), lines[2]
