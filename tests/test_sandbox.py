"""The bubblewrap sandbox of CodingEnvironment's bash: each test is a model-written command that
must fail inside the sandbox, and is first shown to succeed outside it (a plain process)."""

# Assertions inspect real files synchronously on purpose (quick stat calls in tests).
# ruff: noqa: ASYNC240

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from rollouts import RunConfig, ToolCall, ToolResult
from rollouts.environments import CodingEnvironment
from rollouts.environments._sandbox_limits import disk_usage
from rollouts.environments.base import clone_environment
from rollouts.environments.sandbox import (
    BubblewrapSandbox,
    SandboxLimits,
    SandboxUnavailable,
    Unsandboxed,
    resolve_sandbox,
)


async def _bash(env: CodingEnvironment, command: str, limit_s: float | None = None) -> ToolResult:
    args: dict[str, object] = {"command": command}
    if limit_s is not None:
        args["timeout_seconds"] = limit_s
    return await env.exec_tool(ToolCall("c1", "bash", args), None, RunConfig())  # type: ignore[arg-type]


async def _outside(command: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The same command as a plain process: the control showing it works without the sandbox."""
    return await trio.run_process(
        ["bash", "-c", command], cwd=cwd, capture_stdout=True, capture_stderr=True, check=False
    )


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "workspace"
    w.mkdir()
    (w / "main.py").write_text("print('hi')\n")
    return w


def _sandboxed(ws: Path, **limits: int | None) -> CodingEnvironment:
    return CodingEnvironment(ws, sandbox=BubblewrapSandbox(SandboxLimits(**limits)))  # type: ignore[arg-type]


async def test_sandbox_hides_ssh_like_files_outside_the_workspace(tmp_path: Path, ws: Path) -> None:
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY----- secret-material\n")
    cmd = f"cat {key}; cat ~/.ssh/id_ed25519 2>/dev/null; ls {key.parent}"
    assert b"secret-material" in (await _outside(cmd, ws)).stdout
    r = await _bash(_sandboxed(ws), cmd)
    assert r.is_error and "secret-material" not in r.content and "No such file or directory" in r.content
    r = await _bash(_sandboxed(ws), "cat main.py; python3 main.py")  # the workspace itself is there
    assert not r.is_error and "print('hi')\nhi\n" in r.content


async def test_sandbox_refuses_writes_outside_the_workspace(tmp_path: Path, ws: Path) -> None:
    target = tmp_path / "outside.txt"
    cmd = f"echo pwned > {target} && echo pwned > /usr/pwned-by-sandbox-test"
    control = await _outside(f"echo pwned > {target}", ws)
    assert control.returncode == 0 and target.read_text() == "pwned\n"
    target.unlink()
    r = await _bash(_sandboxed(ws), cmd)
    assert r.is_error and "Read-only file system" in r.content
    assert not target.exists(), "a write outside the workspace reached the host"
    assert not Path("/usr/pwned-by-sandbox-test").exists()
    r = await _bash(_sandboxed(ws), "echo made > inside.txt && mkdir -p d && echo x > /tmp/t && cat /tmp/t")
    assert not r.is_error and (ws / "inside.txt").read_text() == "made\n"


async def test_sandbox_has_no_network_to_a_server_on_127_0_0_1(ws: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    accepted: list[int] = []

    async def _serve(stream: trio.SocketStream) -> None:
        accepted.append(1)
        await stream.aclose()

    cmd = (
        f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('connected')\""
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, _serve, listeners)
        assert b"connected" in (await _outside(cmd, ws)).stdout and len(accepted) == 1
        r = await _bash(_sandboxed(ws), cmd)
        assert r.is_error and "connected" not in r.content and "ConnectionRefusedError" in r.content
        assert len(accepted) == 1, "the sandboxed command reached the host's server"
        allowed = CodingEnvironment(ws, sandbox=BubblewrapSandbox(allow_network=True))
        r = await _bash(allowed, cmd)  # the environment may allow it
        assert not r.is_error and "connected" in r.content and len(accepted) == 2
        nursery.cancel_scope.cancel()


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read() == b"sleep\0" + token.encode() + b"\0":
                        found.append(int(entry))
            except OSError:
                continue
    return found


async def test_sandbox_leaves_no_process_behind(ws: Path) -> None:
    token = f"{4000 + os.getpid() % 1000}.{trio.current_time():.0f}"
    await _outside(f"setsid sleep {token} > /dev/null 2>&1 < /dev/null &", ws)
    for _ in range(500):  # the detached child may not have exec'd `sleep` yet when bash returns
        if left := _processes_with(token):
            break
        await trio.sleep(0.01)
    assert left, "the control: outside the sandbox, a setsid'd sleep outlives its command"
    for pid in left:
        os.kill(pid, 9)
    r = await _bash(_sandboxed(ws), f"setsid sleep {token} & nohup setsid sleep {token} >/dev/null 2>&1 & echo started")
    assert not r.is_error and "started" in r.content
    assert _processes_with(token) == [], "a detached process outlived the sandboxed command"


async def test_sandbox_bounds_a_fork_bomb(ws: Path) -> None:
    forks = (
        'python3 -c "import os, time\nn = 0\nfor i in range(100):\n'
        "    if os.fork() == 0:\n        time.sleep(3); os._exit(0)\n    n += 1\nprint('forked', n)\""
    )
    assert b"forked 100" in (await _outside(forks, ws)).stdout
    env = _sandboxed(ws, max_processes=40)
    r = await _bash(env, forks)
    assert r.is_error and "forked 100" not in r.content and "Resource temporarily unavailable" in r.content
    t0 = trio.current_time()
    r = await _bash(env, ":(){ :|:& };:; sleep 1; echo survived", limit_s=10)  # the classic one
    assert trio.current_time() - t0 < 15
    assert r.details is not None and r.details["pid"] is not None


async def test_sandbox_bounds_filling_the_disk(tmp_path: Path, ws: Path) -> None:
    fill = "for i in $(seq 100); do head -c 1000000 /dev/zero > f$i || exit 1; done; echo wrote all"
    scratch = tmp_path / "control"
    scratch.mkdir()
    assert b"wrote all" in (await _outside(fill, scratch)).stdout and disk_usage(str(scratch))[0] >= 100_000_000
    r = await _bash(_sandboxed(ws, disk_bytes=10_000_000), fill)
    assert r.is_error and "wrote all" not in r.content and "disk limit" in r.content
    assert r.details is not None and r.details["stopped"] is True
    assert disk_usage(str(ws))[0] < 80_000_000
    r = await _bash(_sandboxed(ws, file_size_bytes=1_000_000), "head -c 5000000 /dev/zero > big; echo $?")
    assert (ws / "big").stat().st_size <= 1_000_000 and "File size limit exceeded" in r.content
    r = await _bash(_sandboxed(ws, tmp_bytes=2_000_000), "head -c 5000000 /dev/zero > /tmp/big")
    assert r.is_error and "No space left on device" in r.content


async def test_sandbox_refuses_memory_beyond_its_limit(ws: Path) -> None:
    alloc = "python3 -c \"import mmap; m = mmap.mmap(-1, 3 << 30); print('allocated')\""
    assert b"allocated" in (await _outside(alloc, ws)).stdout
    r = await _bash(_sandboxed(ws, memory_bytes=1 << 30), alloc)
    assert r.is_error and "allocated" not in r.content and "Cannot allocate memory" in r.content


async def test_no_sandbox_means_refusal_unless_unsandboxed_is_named(ws: Path) -> None:
    missing = BubblewrapSandbox(bwrap="/nonexistent/bwrap")
    with pytest.raises(SandboxUnavailable, match=r"install bubblewrap.*sandbox='unsandboxed'"):
        CodingEnvironment(ws, sandbox=missing.to_dict())
    with pytest.raises(SandboxUnavailable):
        await missing.run(["true"], workspace=str(ws), timeout_s=5, max_output_bytes=100, env={})
    CodingEnvironment(ws, preset="read_only", sandbox=missing)  # no bash: nothing to refuse
    env = CodingEnvironment(ws, sandbox="unsandboxed")
    assert isinstance(env.sandbox, Unsandboxed)
    r = await _bash(env, "echo direct")
    assert not r.is_error and r.content.startswith("direct")
    with pytest.raises(ValueError, match="unknown sandbox 'chroot'"):
        resolve_sandbox("chroot")


async def test_sandbox_settings_round_trip_through_serialize(ws: Path) -> None:
    box = BubblewrapSandbox(SandboxLimits(memory_bytes=1 << 29, disk_bytes=None), allow_network=True)
    env = CodingEnvironment(ws, sandbox=box)
    data = await env.serialize()
    assert json.loads(json.dumps(data))["sandbox"]["limits"]["memory_bytes"] == 1 << 29
    clone = await clone_environment(env)
    assert isinstance(clone, CodingEnvironment) and clone.sandbox == box
    assert (await clone.serialize()) == data
    assert isinstance(CodingEnvironment(ws).sandbox, BubblewrapSandbox)  # the default


async def test_each_sample_gets_its_own_workspace_removed_afterwards(tmp_path: Path) -> None:
    from rollouts import ScriptedModel, tool_call
    from rollouts.eval.run import EvalConfig, evaluate

    template = tmp_path / "template"
    template.mkdir()
    (template / "log.txt").write_text("start\n")
    copies = tmp_path / "copies"
    copies.mkdir()

    def reply(req: Any) -> Any:
        tools = [m for m in req.messages if m.role == "tool"]
        if not tools:  # every sample appends its name, waits for the others to do the same, reads
            return tool_call("bash", command=f"echo {req.last_user_text} >> log.txt; sleep 0.5; cat log.txt; pwd")
        return f"seen: {tools[-1].content}"

    model = ScriptedModel(reply)
    rows = [{"question": f"sample{i}"} for i in range(8)]
    config = EvalConfig(
        endpoint=model.endpoint,
        environment_factory=lambda: CodingEnvironment.from_template(template, workspaces_dir=copies),
        max_concurrent=8,
    )
    report = await evaluate(rows, config)
    seen = {s.input["question"]: s.response for s in report.samples}  # type: ignore[index]
    roots = set()
    for name, text in seen.items():
        lines = text.removeprefix("seen: ").splitlines()
        assert lines[:2] == ["start", name], f"{name} saw another sample's workspace: {lines}"
        roots.add(lines[2])
    assert len(roots) == 8 and all(r.startswith(str(copies)) for r in roots)
    assert list(copies.iterdir()) == [], "a sample's workspace was left behind"
    assert (template / "log.txt").read_text() == "start\n"


def test_docker_sandbox_command_line_confines_and_carries_no_secret_values() -> None:
    """The Docker backend is not run here (no daemon); its command line is checked."""
    from rollouts.environments.sandbox import DockerSandbox

    box = DockerSandbox("python:3.11-slim", SandboxLimits(max_processes=64, memory_bytes=1 << 30))
    argv = box.argv(["bash", "-c", "make"], "/work/ws", "rollouts-sandbox-x", {"GITHUB_TOKEN": "ghp_secret"})
    line = " ".join(argv)
    for part in ("--rm", "--read-only", "--network none", "--cap-drop ALL", "--pids-limit 64", "--memory 1073741824"):
        assert part in line, part
    assert "-v /work/ws:/work/ws" in line and "-w /work/ws" in line and "--tmpfs /tmp:rw,size=" in line
    assert "-e GITHUB_TOKEN" in line and "ghp_secret" not in line  # the value comes from docker's environment
    assert argv[-3:] == ["bash", "-c", "make"]
    assert resolve_sandbox(box.to_dict()) == box
