"""Issue 29: what bounds the processes of a sandboxed command, run as root.

The kernel never applies RLIMIT_NPROC to a process whose real uid is root (a user namespace that
maps root to another uid inside does not change that), so as root the sandbox's process bound is
a cgroup's `pids.max`. It came only from the cgroup v1 `pids` hierarchy: on a machine with cgroup
v2 only (today's default), a root user's fork bomb was not bounded. The group is now made in a
cgroup v2 hierarchy with a `pids` controller where v1 has none.

This machine is a cgroup v1/v2 hybrid whose `pids` controller is on v1 and whose tests run as
root: the fork bomb below is bounded by a v1 group, and the v2 choice is checked on a cgroup2
tree laid out as the kernel shows one (its `pids` controller cannot move to v2 here while v1
holds it).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollouts import RunConfig, ToolCall, ToolResult
from rollouts.environments import CodingEnvironment
from rollouts.environments import _sandbox_limits as limits
from rollouts.environments.sandbox import BubblewrapSandbox, SandboxLimits

FORKS = (
    'python3 -c "import os, time\nn = 0\nfor i in range(100):\n'
    "    if os.fork() == 0:\n        time.sleep(3); os._exit(0)\n    n += 1\nprint('forked', n)\""
)


async def _bash(env: CodingEnvironment, command: str) -> ToolResult:
    return await env.exec_tool(ToolCall("c1", "bash", {"command": command}), None, RunConfig())  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "workspace"
    w.mkdir()
    return w


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    """The cached choice of cgroup hierarchy, made again for the test and after it."""
    limits.pids_cgroup_parent.cache_clear()
    yield
    limits.pids_cgroup_parent.cache_clear()


async def test_root_fork_bomb_is_bounded_by_the_pids_cgroup_not_by_rlimit_nproc(
    ws: Path, fresh_choice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert os.geteuid() == 0, "this test shows the bound root gets: the test command runs as root"
    env = CodingEnvironment(ws, sandbox=BubblewrapSandbox(SandboxLimits(max_processes=40)))
    assert limits.pids_cgroup_supported()
    r = await _bash(env, FORKS)
    assert r.is_error and "forked 100" not in r.content and "Resource temporarily unavailable" in r.content

    # without a pids cgroup (a machine where none is writable) RLIMIT_NPROC alone does not bound
    # root: the same command forks all 100
    monkeypatch.setattr(limits, "pids_cgroup_parent", lambda: None)
    r = await _bash(env, FORKS)
    assert "forked 100" in r.content


def _cgroup2_tree(tmp_path: Path, own: str, controllers: dict[str, str]) -> Path:
    """A cgroup2 mount as the kernel lays it out (the interface files of each directory), the
    mounts table naming it, and /proc/self/cgroup placing this process at `own`."""
    root = tmp_path / "cgroup2"
    for rel, available in controllers.items():
        d = root / rel if rel else root
        d.mkdir(parents=True, exist_ok=True)
        (d / "cgroup.controllers").write_text(available + "\n")
        (d / "cgroup.subtree_control").write_text("\n")
        (d / "cgroup.procs").write_text("")
    (tmp_path / "mounts").write_text(
        f"proc /proc proc rw 0 0\ncgroup2 {root} cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\ntmpfs /tmp tmpfs rw 0 0\n"
    )
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    return root


@pytest.mark.parametrize(
    ("own", "controllers", "chosen"),
    [
        # a host: pids available at the hierarchy's root
        (
            "/user.slice/session-1.scope",
            {"": "cpu io memory pids", "user.slice/session-1.scope": "cpu memory pids"},
            "",
        ),
        # a container with its own cgroup namespace root... given as a subtree: the root lacks
        # pids (not delegated there), this process's own cgroup has it
        ("/ctr", {"": "cpu memory", "ctr": "cpu memory pids"}, "ctr"),
    ],
)
async def test_cgroup_v2_only_machine_gets_a_pids_group_where_v1_is_absent(
    tmp_path: Path,
    fresh_choice: None,
    monkeypatch: pytest.MonkeyPatch,
    own: str,
    controllers: dict[str, str],
    chosen: str,
) -> None:
    root = _cgroup2_tree(tmp_path, own, controllers)
    monkeypatch.setattr(limits, "_PIDS_ROOT", str(tmp_path / "no-v1-pids"))
    monkeypatch.setattr(limits, "_MOUNTS", str(tmp_path / "mounts"))
    monkeypatch.setattr(limits, "_OWN_CGROUP", str(tmp_path / "cgroup"))
    under = root / chosen if chosen else root
    parent = limits.pids_cgroup_parent()
    assert parent == str(under / limits._GROUP_DIR)
    # pids enabled for the children of the chosen cgroup and of the sandbox's directory
    assert (under / "cgroup.subtree_control").read_text() == "+pids"
    assert (under / limits._GROUP_DIR / "cgroup.subtree_control").read_text() == "+pids"
    limits._make_group(os.path.join(parent, "1-0"), 43)
    assert (under / limits._GROUP_DIR / "1-0" / "pids.max").read_text() == "43"


async def test_cgroup_v2_without_a_pids_controller_gives_no_group(
    tmp_path: Path, fresh_choice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(As this machine's own v2 hierarchy: only hugetlb there.) Nothing is made in it."""
    root = _cgroup2_tree(tmp_path, "/", {"": "hugetlb"})
    monkeypatch.setattr(limits, "_PIDS_ROOT", str(tmp_path / "no-v1-pids"))
    monkeypatch.setattr(limits, "_MOUNTS", str(tmp_path / "mounts"))
    monkeypatch.setattr(limits, "_OWN_CGROUP", str(tmp_path / "cgroup"))
    assert limits.pids_cgroup_parent() is None and not limits.pids_cgroup_supported()
    assert sorted(p.name for p in root.iterdir()) == ["cgroup.controllers", "cgroup.procs", "cgroup.subtree_control"]


async def test_leftover_pids_groups_of_gone_processes_are_removed(tmp_path: Path, fresh_choice: None) -> None:
    """A group whose last processes were reaped only after its removal's retries (a loaded
    machine) or whose process was killed stayed behind; `sweep_dead_groups`, run by a process's
    first sandboxed command, removes the empty groups of processes that are gone, and no other."""
    parent = limits.pids_cgroup_parent()
    assert parent is not None  # (as root here: see the first test)
    dead_pid = _a_dead_pid()
    mine, other = f"{os.getpid()}-999999", "1-999999"  # this process's own, and a live process's
    leftover = f"{dead_pid}-0"
    for name in (mine, other, leftover):
        os.makedirs(os.path.join(parent, name), exist_ok=True)
    try:
        assert limits.sweep_dead_groups(parent, min_age_s=0) >= 1
        names = set(os.listdir(parent))
        assert leftover not in names and {mine, other} <= names
    finally:
        for name in (mine, other, leftover):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir(os.path.join(parent, name))


def _a_dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid
