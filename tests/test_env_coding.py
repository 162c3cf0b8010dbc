"""CodingEnvironment on real files and real processes: confinement, edits, bash limits, presets."""

# Assertions inspect real files synchronously on purpose (quick stat calls in tests).
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from _env_helpers import calls, is_running, run, session_members, tool_messages, wait_dead, wait_session_empty

from rollouts import AgentState, RunConfig, StopReason, ToolCall
from rollouts.environments import CodingEnvironment, check_environment
from rollouts.environments.base import clone_environment
from rollouts.handlers import ToolConfirmResult
from rollouts.providers.scripted import tool_call


async def _call(env: CodingEnvironment, name: str, **args):
    return await env.exec_tool(ToolCall("c1", name, args), None, RunConfig())  # type: ignore[arg-type]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "work"
    r.mkdir()
    (r / "src").mkdir()
    (r / "src" / "app.py").write_text("def greet(name):\n    return 'hello ' + name\n")
    (r / "notes.txt").write_text("\n".join(f"line {i}" for i in range(1, 101)) + "\n")
    (tmp_path / "secret.txt").write_text("top secret\n")
    return r


# ---- confinement ------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["read", "write", "edit", "ls", "grep"])
async def test_dotdot_escape_is_refused_by_every_path_tool(root: Path, tool: str) -> None:
    env = CodingEnvironment(root)
    args = {"path": "../secret.txt"}
    if tool == "write":
        args["content"] = "pwned"
    if tool == "edit":
        args.update(old_text="top", new_text="pwned")
    if tool == "grep":
        args["pattern"] = "secret"
    r = await _call(env, tool, **args)
    assert r.is_error
    assert "outside the working directory" in r.content
    assert (root.parent / "secret.txt").read_text() == "top secret\n"


async def test_absolute_path_outside_is_refused_but_inside_is_allowed(root: Path) -> None:
    env = CodingEnvironment(root)
    r = await _call(env, "read", path=str(root.parent / "secret.txt"))
    assert r.is_error and "Access denied" in r.content
    r = await _call(env, "write", path="/tmp/rollouts-should-not-exist.txt", content="x")
    assert r.is_error and not Path("/tmp/rollouts-should-not-exist.txt").exists()
    r = await _call(env, "read", path=str(root / "src" / "app.py"))
    assert not r.is_error and "hello" in r.content
    r = await _call(env, "read", path="src/../notes.txt", offset=1, limit=1)
    assert not r.is_error and "line 1" in r.content


async def test_symlinks_that_escape_are_refused(root: Path) -> None:
    os.symlink(root.parent / "secret.txt", root / "link.txt")
    os.symlink(root.parent, root / "up")
    os.symlink(root / "src", root / "inside")  # stays within the root: fine
    env = CodingEnvironment(root)
    for path in ("link.txt", "up/secret.txt"):
        r = await _call(env, "read", path=path)
        assert r.is_error and "symlink" in r.content, r.content
    r = await _call(env, "write", path="up/new.txt", content="x")
    assert r.is_error and not (root.parent / "new.txt").exists()
    r = await _call(env, "edit", path="link.txt", old_text="top", new_text="pwned")
    assert r.is_error and (root.parent / "secret.txt").read_text() == "top secret\n"
    r = await _call(env, "read", path="inside/app.py")
    assert not r.is_error and "greet" in r.content
    # glob and grep do not follow links out of the root
    r = await _call(env, "grep", pattern="top secret")
    assert "secret" not in r.content.replace("No matches for 'top secret'.", "")


async def test_bash_runs_in_the_root(root: Path) -> None:
    env = CodingEnvironment(root)
    r = await _call(env, "bash", command="pwd && ls src")
    assert not r.is_error
    assert r.content.splitlines()[0] == os.path.realpath(root)
    assert "app.py" in r.content and r.content.endswith("[exit code 0]")


# ---- read / write / edit ------------------------------------------------------------------------


async def test_read_line_ranges_and_size_cap(root: Path) -> None:
    env = CodingEnvironment(root, max_read_chars=200)
    r = await _call(env, "read", path="notes.txt", offset=10, limit=3)
    assert r.content.splitlines()[:3] == ["10\tline 10", "11\tline 11", "12\tline 12"]
    assert "Use offset=13" in r.content
    r = await _call(env, "read", path="notes.txt")
    shown = [ln for ln in r.content.splitlines() if "\tline " in ln]
    assert 5 < len(shown) < 100 and sum(len(s) + 1 for s in shown) <= 200
    assert f"Use offset={len(shown) + 1} to read more" in r.content
    r = await _call(env, "read", path="notes.txt", offset=500)
    assert r.is_error and "100 lines" in r.content
    r = await _call(env, "read", path="missing.py")
    assert r.is_error and "File not found" in r.content
    (root / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    r = await _call(env, "read", path="blob.bin")
    assert r.is_error and "binary" in r.content


async def test_read_refuses_files_over_the_size_limit_and_cuts_huge_lines(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rollouts.environments.coding as coding

    env = CodingEnvironment(root, max_read_chars=100)
    (root / "wide.txt").write_text("x" * 1000 + "\nshort\n")
    r = await _call(env, "read", path="wide.txt")
    first = r.content.splitlines()[0]
    assert first.endswith(" [line truncated]") and len(first) < 130
    assert "Use offset=2" in r.content
    monkeypatch.setattr(coding, "_MAX_READ_FILE_BYTES", 500)
    r = await _call(env, "read", path="wide.txt")
    assert r.is_error and "too large to read whole" in r.content and "grep" in r.content


async def test_write_creates_directories_and_edit_replaces_exactly(root: Path) -> None:
    env = CodingEnvironment(root)
    r = await _call(env, "write", path="pkg/deep/mod.py", content="a = 1\na = 1\nb = 2\n")
    assert not r.is_error and (root / "pkg/deep/mod.py").read_text() == "a = 1\na = 1\nb = 2\n"
    r = await _call(env, "edit", path="pkg/deep/mod.py", old_text="c = 3", new_text="c = 4")
    assert r.is_error and "not found" in r.content
    r = await _call(env, "edit", path="pkg/deep/mod.py", old_text="a = 1", new_text="a = 9")
    assert r.is_error and "occurs 2 times" in r.content and "replace_all" in r.content
    assert (root / "pkg/deep/mod.py").read_text() == "a = 1\na = 1\nb = 2\n"
    r = await _call(env, "edit", path="pkg/deep/mod.py", old_text="b = 2", new_text="b = 3")
    assert not r.is_error and (root / "pkg/deep/mod.py").read_text() == "a = 1\na = 1\nb = 3\n"
    r = await _call(env, "edit", path="pkg/deep/mod.py", old_text="a = 1", new_text="a = 0", replace_all=True)
    assert "2 occurrences" in r.content and (root / "pkg/deep/mod.py").read_text() == "a = 0\na = 0\nb = 3\n"
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00 a = 1")
    r = await _call(env, "edit", path="blob.bin", old_text="a = 1", new_text="a = 2")
    assert r.is_error and "not UTF-8 text" in r.content and (root / "blob.bin").read_bytes() == b"\xff\xfe\x00 a = 1"
    r = await _call(env, "edit", path="missing.py", old_text="a", new_text="b")
    assert r.is_error and "File not found" in r.content


async def test_ls_glob_grep(root: Path) -> None:
    env = CodingEnvironment(root)
    (root / "src" / "util.py").write_text("import os\nGREETING = 'hi'\n")
    (root / ".git").mkdir()
    (root / ".git" / "x.py").write_text("GREETING\n")
    assert (await _call(env, "ls")).content.splitlines() == [".git/", "notes.txt", "src/"]
    assert (await _call(env, "glob", pattern="**/*.py")).content.splitlines() == ["src/app.py", "src/util.py"]
    assert (await _call(env, "glob", pattern="*.txt")).content == "notes.txt"
    r = await _call(env, "grep", pattern="greet|GREETING", ignore_case=True, include="*.py")
    assert r.content.splitlines() == ["src/app.py:1: def greet(name):", "src/util.py:2: GREETING = 'hi'"]
    assert (await _call(env, "glob", pattern="../*")).is_error
    assert (await _call(env, "grep", pattern="(")).is_error


async def test_a_backtracking_grep_neither_freezes_the_loop_nor_outlives_its_limit(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`re` holds the GIL for a whole match: (a+)+$ on this line runs for minutes, which in a
    thread would freeze the event loop. In its own process it is killed at the limit or on
    cancellation, and the loop keeps running meanwhile."""
    import rollouts.environments.coding as coding

    env = CodingEnvironment(root)
    (root / "evil.txt").write_text("a" * 40 + "!\n")
    ticks = 0

    async def _tick() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.05)
            ticks += 1

    monkeypatch.setattr(coding, "_GREP_TIMEOUT_S", 1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_tick)
        t0 = trio.current_time()
        r = await _call(env, "grep", pattern="(a+)+$", path="evil.txt")
        elapsed = trio.current_time() - t0
        nursery.cancel_scope.cancel()
    assert r.is_error and "grep stopped after 1s" in r.content and "(a+)+" in r.content
    assert elapsed < 3.0 and ticks >= 8, (elapsed, ticks)

    monkeypatch.setattr(coding, "_GREP_TIMEOUT_S", 300.0)
    t0 = trio.current_time()
    with trio.move_on_after(0.5) as scope:
        await _call(env, "grep", pattern="(a+)+$", path="evil.txt")
    assert scope.cancelled_caught and trio.current_time() - t0 < 2.0
    assert _grep_workers(root) == [], "the grep process outlived the cancellation"


def _grep_workers(root: Path) -> list[int]:
    """Pids of running grep worker processes searching under `root` (from a full /proc listing)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                    if b"_grep_worker.py" in cmdline and str(root).encode() in cmdline and is_running(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def test_grep_reports_too_many_files_and_caps_matches(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rollouts.environments.coding as coding

    monkeypatch.setattr(coding, "_MAX_LIST", 5)
    r = await _call(CodingEnvironment(root), "grep", pattern="line", path="notes.txt")
    assert r.content.count("notes.txt:") == 5 and "more than 5 matches" in r.content
    monkeypatch.setattr(coding, "_MAX_WALK_FILES", 1)
    r = await _call(CodingEnvironment(root), "grep", pattern="x")
    assert r.is_error and "More than 1 files" in r.content


async def test_glob_semantics_and_no_catastrophic_patterns(root: Path) -> None:
    from rollouts.environments.coding import _glob_match

    (root / "src" / "deep" / "er").mkdir(parents=True)
    (root / "src" / "deep" / "er" / "x.py").write_text("")
    env = CodingEnvironment(root)
    assert (await _call(env, "glob", pattern="src/*.py")).content == "src/app.py"
    assert (await _call(env, "glob", pattern="src/**/x.py")).content == "src/deep/er/x.py"
    assert (await _call(env, "glob", pattern="**/**/?pp.[p]y")).content == "src/app.py"
    assert not _glob_match("*.txt", "a/notes.txt") and _glob_match("a/**/b", "a/b")
    # One regex for the whole glob backtracks for ages on these (holding the GIL); this does not.
    (root / ("a" * 60)).write_text("")
    with trio.fail_after(5):
        r = await _call(env, "glob", pattern="*a" * 15 + "b")
        assert r.content.startswith("No files match")
        r = await _call(env, "glob", pattern="**/" * 40 + "z")
        assert r.content.startswith("No files match")


# ---- bash: timeout, cancellation, output cap -----------------------------------------------------


# A process tree: a background child, a double-forked grandchild re-parented to init (still in
# the command's session) and a foreground child; all of them write their pids. The tests that
# read those pids run unsandboxed: they check the supervisor, and inside the sandbox's PID
# namespace the pids a command sees are not the host's (the setsid tests below find processes
# by command line and run sandboxed).
_HOST_PIDS = "unsandboxed"
_TREE = "sleep 300 & echo $! >> pids; (sleep 300 & echo $! >> pids) ; bash -c 'echo $$ >> pids; sleep 300' & "


async def test_bash_timeout_kills_the_whole_process_group(root: Path) -> None:
    env = CodingEnvironment(root, bash_timeout=2, sandbox=_HOST_PIDS)
    t0 = trio.current_time()
    r = await _call(env, "bash", command=_TREE + "echo $$ >> pids; echo started; sleep 300")
    elapsed = trio.current_time() - t0
    assert r.is_error and "Timed out after 2s" in r.content and "started" in r.content
    assert 2 <= elapsed < 3.5, f"killed after {elapsed:.2f}s, not at its 2s timeout"
    assert r.details is not None and r.details["timed_out"] is True
    pids = [int(x) for x in (root / "pids").read_text().split()]
    assert len(pids) == 4 and r.details["pid"] in pids
    assert await wait_session_empty(r.details["pid"]) == [], "processes of the command outlived its timeout"
    for pid in pids:
        assert await wait_dead(pid), f"process {pid} survived the timeout (orphan)"


async def test_bash_cancellation_kills_the_whole_process_group(root: Path) -> None:
    env = CodingEnvironment(root, bash_timeout=300, sandbox=_HOST_PIDS)
    pid_file = root / "pids"
    with trio.move_on_after(30) as guard:
        async with trio.open_nursery() as nursery:

            async def _run() -> None:
                await _call(env, "bash", command=_TREE + "echo $$ > shell.pid; echo $$ >> pids; wait")

            nursery.start_soon(_run)
            for _ in range(1000):
                if pid_file.exists() and len(pid_file.read_text().split()) == 4:
                    break
                await trio.sleep(0.01)
            pids = [int(x) for x in pid_file.read_text().split()]
            shell = int((root / "shell.pid").read_text())
            assert len(pids) == 4 and shell in pids and all(is_running(p) for p in pids)
            assert set(pids) <= set(session_members(shell)), "the listing sees the whole tree while it runs"
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught
    assert await wait_session_empty(shell) == [], "processes of the command outlived its cancellation"
    for pid in pids:
        assert await wait_dead(pid), f"process {pid} survived cancellation (orphan)"


async def test_background_jobs_do_not_outlive_the_command(root: Path) -> None:
    env = CodingEnvironment(root, sandbox=_HOST_PIDS)
    r = await _call(env, "bash", command=_TREE + "echo started")
    assert not r.is_error and "started" in r.content
    assert r.details is not None and await wait_session_empty(r.details["pid"]) == []
    for pid in (int(x) for x in (root / "pids").read_text().split()):
        assert await wait_dead(pid)


async def test_huge_output_is_capped_keeping_head_and_tail(root: Path) -> None:
    env = CodingEnvironment(root, max_output_bytes=4000)
    r = await _call(env, "bash", command="seq 1 2000000")
    assert not r.is_error
    assert len(r.content) < 4200
    assert r.content.startswith("1\n2\n3\n")
    assert "2000000\n[exit code 0]" in r.content
    assert "bytes of output omitted" in r.content
    assert r.details is not None and r.details["truncated"] is True


async def test_bash_reports_failure_and_stderr(root: Path) -> None:
    env = CodingEnvironment(root)
    r = await _call(env, "bash", command="echo out; echo err >&2; exit 7")
    assert r.is_error and r.details is not None and r.details["exit_code"] == 7
    assert "out" in r.content and "err" in r.content and "[exit code 7]" in r.content
    r = await _call(env, "bash", command="true", timeout_seconds=10_000)
    assert r.is_error and "timeout must be between" in r.content


# ---- presets, confirmation, protocol ----------------------------------------------------------------


async def test_presets_choose_the_tools(root: Path) -> None:
    names = lambda env: [t.name for t in env.get_tools()]  # noqa: E731
    assert names(CodingEnvironment(root, preset="read_only")) == ["read", "ls", "glob", "grep"]
    assert names(CodingEnvironment(root, preset="no_write")) == ["read", "bash", "ls", "glob", "grep"]
    assert names(CodingEnvironment(root)) == ["read", "write", "edit", "bash", "ls", "glob", "grep"]
    ro = CodingEnvironment(root, preset="read_only")
    r = await _call(ro, "write", path="x.txt", content="x")
    assert r.is_error and "Unknown tool" in r.content and not (root / "x.txt").exists()
    with pytest.raises(ValueError, match="unknown preset"):
        CodingEnvironment(root, preset="yolo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an existing directory"):
        CodingEnvironment(root / "nope")


async def test_confirmation_is_configurable_and_a_denial_leaves_files_alone(root: Path) -> None:
    env = CodingEnvironment(root, confirm_writes=True)
    assert env.requires_confirmation(ToolCall("1", "write", {}))
    assert env.requires_confirmation(ToolCall("1", "edit", {}))
    assert not env.requires_confirmation(ToolCall("1", "bash", {}))
    assert CodingEnvironment(root, confirm_bash=True).requires_confirmation(ToolCall("1", "bash", {}))
    asked: list[str] = []

    async def deny(call: ToolCall, state: AgentState, rc: RunConfig):
        asked.append(call.name)
        return state, ToolConfirmResult(False, reason="not today")

    states = await run(
        env,
        [tool_call("read", path="notes.txt", limit=1), tool_call("write", path="x.txt", content="x"), "ok"],
        confirm_tool=deny,
    )
    assert asked == ["write"]
    msgs = tool_messages(states[-1])
    assert "line 1" in msgs[0].text and "denied" in msgs[1].text
    assert not (root / "x.txt").exists()


async def test_check_environment_and_serialize_captures_settings(root: Path) -> None:
    env = CodingEnvironment(root, preset="no_write", bash_timeout=3, confirm_bash=True, bash_env={"A": "1"})
    await check_environment(env, calls=[ToolCall("1", "bash", {"command": "echo $A"}), ToolCall("2", "ls", {})])
    clone = await clone_environment(env)
    assert isinstance(clone, CodingEnvironment)
    assert await clone.serialize() == await env.serialize()
    assert clone.requires_confirmation(ToolCall("1", "bash", {}))
    assert (await _call(clone, "bash", command="echo $A")).content.startswith("1\n")


async def test_agent_run_survives_a_json_round_trip_mid_run(root: Path) -> None:
    env = CodingEnvironment(root)
    first = await run(env, [tool_call("write", path="todo.md", content="- [ ] ship\n"), "paused"])
    mid = first[-1]
    assert mid.stop == StopReason.NO_TOOL_CALLED
    assert mid.environment is not None
    data = json.loads(json.dumps(await mid.environment.serialize()))
    restored = await CodingEnvironment.deserialize(data)
    second = await run(
        restored,
        [
            calls(("edit", {"path": "todo.md", "old_text": "[ ]", "new_text": "[x]"}), ("read", {"path": "todo.md"})),
            "done",
        ],
        state=mid,
    )
    msgs = tool_messages(second[-1])
    assert [m.details["tool_name"] for m in msgs] == ["write", "edit", "read"]  # type: ignore[index]
    assert "- [x] ship" in msgs[-1].text
    assert (root / "todo.md").read_text() == "- [x] ship\n"


async def test_bash_does_not_inherit_credentials_unless_asked(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUTS_TEST_API_KEY", "sk-should-not-leak")
    monkeypatch.setenv("ROLLOUTS_TEST_PLAIN", "visible")
    cmd = 'echo "${ROLLOUTS_TEST_API_KEY:-unset} $ROLLOUTS_TEST_PLAIN $EXPLICIT_TOKEN"'
    r = await _call(CodingEnvironment(root, bash_env={"EXPLICIT_TOKEN": "given"}), "bash", command=cmd)
    assert r.content.startswith("unset visible given\n")
    r = await _call(CodingEnvironment(root, pass_secrets=True), "bash", command=cmd)
    assert r.content.startswith("sk-should-not-leak visible \n")
    # One credential passed by name: its value reaches bash but never the serialized state.
    env = CodingEnvironment(root, pass_env=["ROLLOUTS_TEST_API_KEY"])
    clone = await clone_environment(env)
    assert "sk-should-not-leak" not in json.dumps(await clone.serialize())
    r = await _call(clone, "bash", command=cmd)  # type: ignore[arg-type]
    assert r.content.startswith("sk-should-not-leak visible \n")


async def test_cancelling_the_run_mid_bash_aborts_cleanly_without_orphans(root: Path) -> None:
    env = CodingEnvironment(root, bash_timeout=300, sandbox=_HOST_PIDS)
    scope = trio.CancelScope()
    cmd = "echo $$ > pids.tmp; sleep 300 & echo $! >> pids.tmp; mv pids.tmp pids; wait"
    result: list[list[AgentState]] = []
    async with trio.open_nursery() as nursery:

        async def _go() -> None:
            result.append(await run(env, [tool_call("bash", command=cmd), "never reached"], cancel_scope=scope))

        nursery.start_soon(_go)
        for _ in range(1000):
            if (root / "pids").exists():
                break
            await trio.sleep(0.01)
        pids = [int(x) for x in (root / "pids").read_text().split()]
        scope.cancel()
    final = result[0][-1]
    assert final.stop == StopReason.ABORTED
    assert [c.name for c in final.pending_tool_calls] == ["bash"] and final.next_tool_idx == 0
    assert await wait_session_empty(pids[0]) == []
    for pid in pids:
        assert await wait_dead(pid), f"process {pid} outlived the cancelled run"


def _processes_with(token: str, *, sleeps_only: bool = False) -> list[int]:
    """Every live (non-zombie) process on the machine whose command line holds `token` (only
    the `sleep TOKEN` processes themselves with `sleeps_only`): a full listing of /proc, so a
    process that left the command's session and group is found too."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        hit = cmdline == b"sleep\0" + token.encode() + b"\0" if sleeps_only else token.encode() in cmdline
        if hit and is_running(int(entry)):
            found.append(int(entry))
    return found


def _token() -> str:
    return f"933.{os.getpid()}{trio.current_time():.0f}{id(object()) % 100000}"  # sleep takes a fraction


# Every way out of the group: setsid, a double fork into a new session, nohup + setsid.
_ESCAPES = 'setsid sleep {t} & (setsid sh -c "sleep {t} & exit" &) ; nohup setsid sleep {t} >/dev/null 2>&1 & '


async def test_item6_setsid_background_jobs_do_not_outlive_the_command(root: Path) -> None:
    env = CodingEnvironment(root)
    t = _token()
    r = await _call(env, "bash", command=f"setsid sleep {t} & echo x")
    assert not r.is_error and r.content.startswith("x\n"), r.content
    assert _processes_with(t) == [], "a setsid'd background job outlived the command"
    r = await _call(
        env, "bash", command=_ESCAPES.format(t=t) + f"while [ $(pgrep -xfc 'sleep {t}') -lt 3 ]; do :; done"
    )
    assert not r.is_error, r.content
    assert _processes_with(t) == [], "a detached process outlived the command"


async def test_item6_setsid_processes_are_killed_at_the_timeout(root: Path) -> None:
    env = CodingEnvironment(root, bash_timeout=1)
    t = _token()
    r = await _call(env, "bash", command=_ESCAPES.format(t=t) + "echo started; sleep 300")
    assert r.is_error and "Timed out after 1s" in r.content and "started" in r.content
    assert r.details is not None and r.details["timed_out"] is True
    assert _processes_with(t) == [], "a detached process outlived the timeout"


async def test_item6_setsid_processes_are_killed_on_cancellation(root: Path) -> None:
    env = CodingEnvironment(root, bash_timeout=300)
    t = _token()
    with trio.move_on_after(60) as guard:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _call(env, "bash", command=_ESCAPES.format(t=t) + "sleep 300"))
            for _ in range(3000):  # until the three detached processes run
                if len(_processes_with(t, sleeps_only=True)) == 3:
                    break
                await trio.sleep(0.01)
            assert len(_processes_with(t, sleeps_only=True)) == 3
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught
    assert _processes_with(t) == [], "a detached process outlived the cancellation"
