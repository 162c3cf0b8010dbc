"""GitWorktreeEnvironment on real git repositories made in a temp dir."""

# Assertions inspect real files synchronously on purpose (quick stat calls in tests).
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio
from _env_helpers import calls, run, tool_messages

from rollouts import RunConfig, StopReason, ToolCall
from rollouts.environments import GitWorktreeEnvironment, check_environment, compose
from rollouts.environments.base import clone_environment
from rollouts.environments.git_worktree import default_branch
from rollouts.providers.scripted import tool_call

BUGGY = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\nassert add(2, 3) == 5, f'add(2, 3) = {add(2, 3)}'\nprint('tests passed')\n"


def git(cwd: Path | str, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, branch: str = "main") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", branch)
    (path / "calc.py").write_text(BUGGY)
    (path / "test_calc.py").write_text(TEST)
    (path / ".gitignore").write_text("__pycache__/\n")
    git(path, "add", ".")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "initial")
    return path


def worktrees(repo: Path) -> list[str]:
    return [
        ln.split()[1] for ln in git(repo, "worktree", "list", "--porcelain").splitlines() if ln.startswith("worktree ")
    ]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo")


@pytest.fixture
async def env(repo: Path, tmp_path: Path):
    e = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    try:
        yield e
    finally:
        await e.aclose()


@pytest.mark.parametrize("name", ["main", "master", "trunk"])
async def test_default_branch_is_detected_whatever_its_name(tmp_path: Path, name: str) -> None:
    repo = make_repo(tmp_path / "r", branch=name)
    git(repo, "checkout", "-q", "--detach")  # no branch checked out: fall back to the usual names
    assert await default_branch(str(repo)) == name


async def test_item12_default_branch_is_the_checked_out_branch_not_a_stale_master(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "r", branch="master")
    git(repo, "checkout", "-q", "-b", "feature")
    (repo / "calc.py").write_text("feature work\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "feature")
    assert await default_branch(str(repo)) == "feature"
    env = await GitWorktreeEnvironment.create(repo)
    try:
        assert env.base_commit == git(repo, "rev-parse", "feature")
        assert (Path(env.root) / "calc.py").read_text() == "feature work\n"
    finally:
        await env.aclose()


async def test_default_branch_of_a_clone_with_detached_head_follows_origin_head(tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "upstream", branch="trunk")
    git(tmp_path, "clone", "-q", str(upstream), "clone")
    clone = tmp_path / "clone"
    git(clone, "checkout", "-q", "-b", "main")  # a local branch with a "default-looking" name
    assert await default_branch(str(clone)) == "main"  # the checked-out branch comes first
    git(clone, "checkout", "-q", "--detach")
    assert await default_branch(str(clone)) == "trunk"
    git(clone, "branch", "-q", "-D", "trunk")  # only origin/trunk is left
    assert await default_branch(str(clone)) == "origin/trunk"


async def test_agent_fixes_a_bug_and_every_change_is_a_commit(env: GitWorktreeEnvironment, repo: Path) -> None:
    replies = [
        tool_call("bash", command="python test_calc.py"),
        tool_call("read", path="calc.py"),
        tool_call("edit", path="calc.py", old_text="return a - b", new_text="return a + b"),
        calls(
            ("write", {"path": "test_more.py", "content": "from calc import add\nassert add(-1, 1) == 0\n"}),
            ("bash", {"command": "python test_calc.py && python test_more.py"}),
        ),
        "Fixed: add() subtracted instead of adding.",
    ]
    states = await run(env, replies, prompt="The tests fail. Fix the bug.")
    final = states[-1]
    assert final.stop == StopReason.NO_TOOL_CALLED
    results = tool_messages(final)
    assert "AssertionError" in results[0].text and results[0].details["is_error"]  # type: ignore[index]
    assert "return a - b" in results[1].text
    assert results[-1].text.startswith("tests passed") and "[exit code 0]" in results[-1].text
    final_env = final.environment
    assert isinstance(final_env, GitWorktreeEnvironment)
    assert await final_env.commits() == ["edit: calc.py", "write: test_more.py"]
    # Each committing tool result names its commit, and the branch head is the last one.
    shas = [m.details["result"]["commit"] for m in results if "commit" in (m.details or {}).get("result", {})]  # type: ignore[union-attr]
    assert len(shas) == 2 and git(repo, "rev-parse", final_env.branch) == shas[-1] == final_env.head
    assert git(repo, "show", f"{shas[0]}:calc.py") == "def add(a, b):\n    return a + b"
    assert "Tool-Call-Id: call_3_0" in git(repo, "log", "-1", "--format=%B", shas[0])
    # The base repository's own branch and files are untouched.
    assert (repo / "calc.py").read_text() == BUGGY
    assert git(repo, "log", "--format=%s", "main") == "initial"


async def test_sessions_are_isolated_from_each_other(repo: Path, tmp_path: Path) -> None:
    a = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    b = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    try:
        assert a.root != b.root and a.branch != b.branch
        await a.exec_tool(ToolCall("1", "write", {"path": "calc.py", "content": "A\n"}), None, RunConfig())  # type: ignore[arg-type]
        assert (Path(b.root) / "calc.py").read_text() == BUGGY
        assert await a.commits() == ["write: calc.py"] and await b.commits() == []
    finally:
        await a.aclose()
        await b.aclose()


async def test_clone_reattaches_instead_of_creating_a_worktree(env: GitWorktreeEnvironment, repo: Path) -> None:
    before = worktrees(repo)
    clone = await clone_environment(env)
    assert isinstance(clone, GitWorktreeEnvironment)
    assert worktrees(repo) == before and len(before) == 2
    assert (clone.root, clone.branch, clone.base_commit) == (env.root, env.branch, env.base_commit)
    await check_environment(env, calls=[ToolCall("1", "write", {"path": "x.txt", "content": "x\n"})])
    assert worktrees(repo) == before


async def test_round_trip_mid_run_then_the_run_continues(env: GitWorktreeEnvironment, repo: Path) -> None:
    first = await run(env, [tool_call("edit", path="calc.py", old_text="a - b", new_text="a + b"), "paused"])
    mid = first[-1]
    assert mid.environment is not None
    data = json.loads(json.dumps(await mid.environment.serialize()))
    restored = await GitWorktreeEnvironment.deserialize(data)
    assert restored.head == git(repo, "rev-parse", env.branch)
    second = await run(restored, [tool_call("bash", command="python test_calc.py > out.txt"), "done"], state=mid)
    assert "exit code 0" in tool_messages(second[-1])[-1].text
    assert await restored.commits() == ["edit: calc.py", "bash: python test_calc.py > out.txt"]
    assert git(repo, "show", f"{env.branch}:out.txt") == "tests passed"


async def test_cleanup_removes_the_worktree_and_keeps_the_history(repo: Path, tmp_path: Path) -> None:
    env = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    await env.on_session_start("s123")
    assert env.branch == "rollouts/session-s123"
    assert git(repo, "branch", "--list", "rollouts/session-s123")
    await env.exec_tool(ToolCall("1", "write", {"path": "new.txt", "content": "n\n"}), None, RunConfig())  # type: ignore[arg-type]
    data = await env.serialize()
    root = env.root
    async with env:
        pass  # __aexit__ -> aclose
    assert not os.path.exists(root)
    assert root not in worktrees(repo)
    assert git(repo, "log", "-1", "--format=%s", "rollouts/session-s123") == "write: new.txt"
    await env.cleanup()  # idempotent
    gone = await env.exec_tool(ToolCall("2", "read", {"path": "new.txt"}), None, RunConfig())  # type: ignore[arg-type]
    assert gone.is_error and "no longer exists" in gone.content
    # Resuming from the serialized state re-adds the worktree for the same branch.
    resumed = await GitWorktreeEnvironment.deserialize(data)
    try:
        assert os.path.isdir(root) and (Path(root) / "new.txt").read_text() == "n\n"
    finally:
        await resumed.cleanup(delete_branch=True)
    assert not git(repo, "branch", "--list", "rollouts/session-s123")


async def test_explicit_branch_name_is_kept_and_errors_are_clear(repo: Path, tmp_path: Path) -> None:
    env = await GitWorktreeEnvironment.create(repo, branch="agent/fix-1", preset="read_only")
    try:
        await env.on_session_start("zzz")
        assert env.branch == "agent/fix-1"
        assert [t.name for t in env.get_tools()] == ["read", "ls", "glob", "grep"]
        r = await env.exec_tool(ToolCall("1", "read", {"path": "../repo/calc.py"}), None, RunConfig())  # type: ignore[arg-type]
        assert r.is_error and "outside the working directory" in r.content
    finally:
        await env.aclose()
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a git repository"):
        await GitWorktreeEnvironment.create(tmp_path / "plain")
    with pytest.raises(ValueError, match="base_ref 'nope'"):
        await GitWorktreeEnvironment.create(repo, base_ref="nope")


async def test_composed_worktree_closes_through_compose(repo: Path, tmp_path: Path) -> None:
    env = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    composed = compose(env)
    clone = await clone_environment(composed)
    r = await clone.exec_tool(ToolCall("1", "write", {"path": "c.txt", "content": "c\n"}), None, RunConfig())  # type: ignore[arg-type]
    assert r.details is not None and "commit" in r.details
    await composed.aclose()
    assert not os.path.exists(env.root)


@pytest.mark.parametrize("name", ["develop", "release/2024", "trunk-v2"])
async def test_any_default_branch_name_works(tmp_path: Path, name: str) -> None:
    repo = make_repo(tmp_path / "r", branch=name)
    assert await default_branch(str(repo)) == name
    env = await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")
    try:
        assert env.base_commit == git(repo, "rev-parse", name)
        r = await env.exec_tool(ToolCall("1", "write", {"path": "n.txt", "content": "n\n"}), None, RunConfig())  # type: ignore[arg-type]
        assert r.details is not None and "commit" in r.details
        assert await env.commits() == ["write: n.txt"]
        assert git(repo, "log", "--format=%s", name) == "initial"  # the base branch is untouched
    finally:
        await env.aclose()


async def test_a_call_cancelled_half_way_commits_what_it_did_under_its_own_name(
    env: GitWorktreeEnvironment, repo: Path
) -> None:
    root = Path(env.root)
    with trio.move_on_after(30) as guard:
        async with trio.open_nursery() as nursery:

            async def _bash() -> None:
                cmd = "echo partial > half.txt; sleep 300"
                await env.exec_tool(ToolCall("c1", "bash", {"command": cmd}), None, RunConfig())  # type: ignore[arg-type]

            nursery.start_soon(_bash)
            # The shell creates the file before it writes to it: wait for the content, not the name.
            for _ in range(1000):
                if (root / "half.txt").exists() and (root / "half.txt").read_text() == "partial\n":
                    break
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert not guard.cancelled_caught
    assert await env.commits() == ["bash: echo partial > half.txt; sleep 300 (interrupted)"]
    assert git(repo, "show", f"{env.branch}:half.txt") == "partial"
    # The next call's commit holds only its own change.
    await env.exec_tool(ToolCall("c2", "write", {"path": "next.txt", "content": "x\n"}), None, RunConfig())  # type: ignore[arg-type]
    assert git(repo, "show", "--name-only", "--format=", env.branch) == "next.txt"


async def test_evaluate_gives_each_sample_its_own_worktree_and_removes_them(repo: Path, tmp_path: Path) -> None:
    from rollouts import EvalConfig, Message, ScriptedModel, evaluate
    from rollouts.providers.scripted import ScriptedRequest

    def reply(req: ScriptedRequest) -> object:
        if req.messages[-1].role == "user":
            n = req.last_user_text
            return tool_call("bash", command=f"echo {n} > answer.txt && python test_calc.py; true")
        return "done"

    async def factory() -> GitWorktreeEnvironment:
        return await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt")

    model = ScriptedModel(reply)
    config = EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["n"]))],
        environment_factory=factory,
        max_concurrent=6,
        show_progress=False,
    )
    report = await evaluate([{"n": i} for i in range(6)], config)
    assert [s.status for s in report.samples] == ["completed"] * 6, [s.error for s in report.samples]
    assert worktrees(repo) == [str(repo)]  # every sample's worktree was removed
    branches = git(repo, "branch", "--list", "rollouts/*", "--format=%(refname:short)").split()
    assert len(branches) == 6
    answers = sorted(git(repo, "show", f"{b}:answer.txt") for b in branches)
    assert answers == [str(i) for i in range(6)]
    assert all(git(repo, "log", "-1", "--format=%s", b).startswith("bash: echo") for b in branches)


async def test_concurrent_creates_and_cleanups_in_one_repository(repo: Path, tmp_path: Path) -> None:
    """Unlocked, concurrent `git worktree add`s in one repository fail now and then
    ("failed to read .git/worktrees/.../commondir"); each round makes and removes 12 at once."""
    for _ in range(3):
        envs: list[GitWorktreeEnvironment] = []

        async def make(into: list[GitWorktreeEnvironment]) -> None:
            into.append(await GitWorktreeEnvironment.create(repo, worktrees_dir=tmp_path / "wt"))

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(make, envs)
        assert len({e.root for e in envs}) == 12 and len(worktrees(repo)) == 13
        async with trio.open_nursery() as nursery:
            for e in envs:
                nursery.start_soon(e.cleanup)
        assert worktrees(repo) == [str(repo)]
