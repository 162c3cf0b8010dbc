"""Sandboxes for model-written code: bubblewrap (default), Docker, or none by explicit choice.

    sandbox = BubblewrapSandbox(SandboxLimits(memory_bytes=1 << 30), allow_network=False)
    result = await sandbox.run(["bash", "-c", "make test"], workspace="/tmp/ws", timeout_s=60,
                               max_output_bytes=30_000, env={"PATH": "/usr/bin:/bin"})

`BubblewrapSandbox` (`bwrap`, Debian package `bubblewrap`; needs no privileges) runs the
command with:

* a read-only view of the system (`/usr`, the library dirs, a few harmless files of `/etc`,
  the running Python's install) and nothing else of the host: no home directory, no `~/.ssh`;
* the workspace as the only writable host directory (same path inside), a private `/tmp`
  (a size-limited tmpfs), a fresh `/dev` and `/proc`;
* no network (its own network namespace, loopback only) unless `allow_network=True`;
* a private PID namespace: when the command ends, every process it started dies with it;
  no capabilities, its own session (no terminal injection), killed if the caller dies;
* limits (`SandboxLimits`): CPU seconds, address space, processes, file size (rlimits set inside
  the sandbox by `prlimit`), a cgroup `pids.max` where one is writable, v1 or v2 (root ignores
  `RLIMIT_NPROC`: see `_sandbox_limits`), and a bound on how much the command may add to the workspace (checked every
  50 ms; the command is stopped past it).

`DockerSandbox` has the same interface, runs `docker run` with the equivalent options, and needs
a Docker daemon; this repository's tests do not exercise it (no daemon there). `Unsandboxed`
runs commands directly, as before sandboxes existed: it must be asked for by name
(`sandbox="unsandboxed"`). `resolve_sandbox("auto")` picks bubblewrap and refuses, with
`SandboxUnavailable`, when it cannot run.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import trio

from rollouts.environments._process import CommandResult, run_command
from rollouts.environments._sandbox_limits import pids_cgroup, watch_disk
from rollouts.errors import ConfigurationError

__all__ = [
    "BubblewrapSandbox",
    "DockerSandbox",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "Unsandboxed",
    "resolve_sandbox",
]

_INSTALL_HINT = (
    "install bubblewrap (`apt-get install bubblewrap`; it needs no privileges), give "
    "sandbox=DockerSandbox(...) where a Docker daemon runs, or opt into running model-written code "
    "without a sandbox with sandbox='unsandboxed'"
)
# The system, read-only. Merged-/usr systems have symlinks here; they are recreated as symlinks.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The harmless parts of /etc, copied once per process into a directory shown as the sandbox's
# /etc (one mount instead of one per file: each mount costs about half a millisecond).
_ETC_ITEMS = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "bash.bashrc",
    "profile",
    "inputrc",
    "os-release",
    "debian_version",
)
_NETWORK_ETC = ("hosts", "host.conf", "resolv.conf", "gai.conf")
_SANDBOX_HOME = "/tmp"


class SandboxUnavailable(ConfigurationError):
    """No sandbox can run model-written code here; the message says what to install or choose."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one command may use.

    Attributes:
        cpu_seconds: CPU time per process (RLIMIT_CPU).
        memory_bytes: address space per process (RLIMIT_AS).
        max_processes: processes at once (RLIMIT_NPROC inside the sandbox, and a cgroup's
            `pids.max` where one is writable).
        file_size_bytes: the largest file a process may write (RLIMIT_FSIZE).
        disk_bytes: how much one command may add to the workspace (checked every 50 ms, less often
            for a workspace slow to walk, which also may not gain 100,000 files; a workspace of
            over a million entries is not checked; None: no check).
        tmp_bytes: the size of the private `/tmp`.
    """

    cpu_seconds: int = 300
    memory_bytes: int = 4 << 30
    max_processes: int = 512
    file_size_bytes: int = 1 << 30
    disk_bytes: int | None = 2 << 30
    tmp_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise ValueError(f"SandboxLimits.{f.name} must be a positive integer, got {v!r}")

    def prlimit_args(self) -> list[str]:
        """The `prlimit` options that set the rlimits (hard and soft alike)."""
        return [
            f"--cpu={self.cpu_seconds}",
            f"--as={self.memory_bytes}",
            f"--nproc={self.max_processes}",
            f"--fsize={self.file_size_bytes}",
            "--core=0",
        ]


SandboxResult = CommandResult
"""What `Sandbox.run` returns (`stopped` is set when a sandbox limit ended the command; the
reason is the last line of `output`)."""


@runtime_checkable
class Sandbox(Protocol):
    """Runs one command confined to a workspace directory."""

    @property
    def kind(self) -> str:
        """The backend's name ("bwrap", "docker", "unsandboxed")."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe settings; `resolve_sandbox(d)` rebuilds an equal sandbox."""
        ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str,
        timeout_s: float,
        max_output_bytes: int,
        env: Mapping[str, str],
    ) -> SandboxResult:
        """Run `argv` in `workspace`; every process it starts ends with it."""
        ...


def _limits_dict(limits: SandboxLimits) -> dict[str, Any]:
    return dataclasses.asdict(limits)


@functools.cache
def _bwrap_problem(bwrap: str) -> str | None:
    """None when `bwrap` can make a sandbox here (tried once per process), else why not."""
    exe = shutil.which(bwrap)
    if exe is None:
        return f"{bwrap!r} is not installed"
    try:
        p = subprocess.run(
            [exe, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "true"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{exe} could not be run: {e}"
    if p.returncode != 0:
        err = p.stderr.decode(errors="replace").strip()[-300:]
        return f"{exe} cannot create a sandbox here (user namespaces disabled?): {err}"
    return None


@functools.cache
def _sandbox_etc(network: bool) -> str:
    """A private copy of the harmless parts of /etc (made once per process, removed at exit)."""
    root = tempfile.mkdtemp(prefix="rollouts-sandbox-etc-")
    atexit.register(shutil.rmtree, root, True)
    for name in _ETC_ITEMS + (_NETWORK_ETC if network else ()):
        src, dst = os.path.join("/etc", name), os.path.join(root, name)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)
            elif os.path.exists(src):
                shutil.copy2(src, dst)
        except OSError:
            continue  # unreadable or vanished: the sandbox goes without it
    os.chmod(root, 0o755)
    return root


def _python_dirs() -> list[str]:
    """The running interpreter's install, so `python` works inside (read-only)."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
    return sorted(d for d in dirs if not d.startswith(_SYSTEM_DIRS))


async def _run_watched(
    argv: Sequence[str],
    *,
    workspace: str,
    timeout_s: float,
    max_output_bytes: int,
    env: Mapping[str, str],
    limits: SandboxLimits,
    cgroups: Sequence[str] = (),
    bwrap: bool = False,
) -> CommandResult:
    """`run_command` with the workspace's growth watched (see `_sandbox_limits.watch_disk`)."""
    if limits.disk_bytes is None:
        return await run_command(
            argv,
            cwd=workspace,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            env=env,
            cgroups=cgroups,
            bwrap=bwrap,
        )
    stop = trio.Event()
    why: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_disk, workspace, limits.disk_bytes, stop, why)
        r = await run_command(
            argv,
            cwd=workspace,
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            env=env,
            stop=stop,
            cgroups=cgroups,
            bwrap=bwrap,
        )
        nursery.cancel_scope.cancel()
    if r.stopped and why:
        r = dataclasses.replace(r, output=f"{r.output.rstrip()}\n[{why[0]}]")
    return r


@dataclasses.dataclass(frozen=True)
class BubblewrapSandbox:
    """Commands under bubblewrap (see the module docstring for what they can and cannot do).

    Args:
        limits: CPU, memory, processes, file size, workspace growth, /tmp size.
        allow_network: share the host's network (and its resolver files).
        read_only_paths: more host paths to show read-only (e.g. a toolchain under /opt).
        bwrap: the bubblewrap executable.
    """

    limits: SandboxLimits = SandboxLimits()
    allow_network: bool = False
    read_only_paths: tuple[str, ...] = ()
    bwrap: str = "bwrap"

    @property
    def kind(self) -> str:
        return "bwrap"

    def check(self) -> None:
        """Raise `SandboxUnavailable` unless bubblewrap can make a sandbox on this machine."""
        problem = _bwrap_problem(self.bwrap)
        if problem is not None:
            raise SandboxUnavailable(f"cannot sandbox model-written code: {problem}; {_INSTALL_HINT}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "limits": _limits_dict(self.limits),
            "allow_network": self.allow_network,
            "read_only_paths": list(self.read_only_paths),
            "bwrap": self.bwrap,
        }

    def argv(self, command: Sequence[str], workspace: str) -> list[str]:
        """The full `bwrap ... prlimit ... -- command` line for `command` in `workspace`."""
        # No --die-with-parent: it fires when the *thread* that started bwrap ends, and trio
        # starts processes from worker threads that retire. `run_command(bwrap=True)` kills the
        # sandbox's init instead, and the PID namespace takes every process with it.
        a = [shutil.which(self.bwrap) or self.bwrap, "--unshare-all", "--new-session"]
        a += ["--cap-drop", "ALL", "--hostname", "sandbox"]
        if self.allow_network:
            a.append("--share-net")
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        a += ["--ro-bind", _sandbox_etc(self.allow_network), "/etc"]
        a += ["--proc", "/proc", "--dev", "/dev", "--size", str(self.limits.tmp_bytes), "--tmpfs", "/tmp"]
        for p in [*_python_dirs(), *self.read_only_paths]:
            a += ["--ro-bind-try", p, p]
        a += ["--bind", workspace, workspace, "--chdir", workspace, "--setenv", "HOME", _SANDBOX_HOME]
        prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
        return [*a, "--", prlimit, *self.limits.prlimit_args(), "--", *command]

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str,
        timeout_s: float,
        max_output_bytes: int,
        env: Mapping[str, str],
    ) -> SandboxResult:
        self.check()
        workspace = await trio.to_thread.run_sync(os.path.realpath, workspace)
        # headroom in the cgroup for the supervisor, bwrap and bwrap's init inside
        async with pids_cgroup(self.limits.max_processes + 3) as group:
            return await _run_watched(
                self.argv(argv, workspace),
                workspace=workspace,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
                env={**env, "HOME": _SANDBOX_HOME},
                limits=self.limits,
                cgroups=(group,) if group else (),
                bwrap=True,  # no supervisor: the PID namespace ends every process with bwrap's init
            )


@dataclasses.dataclass(frozen=True)
class DockerSandbox:
    """Commands in a throwaway Docker container (`docker run --rm`) with the workspace mounted at
    the same path: read-only root filesystem, private `/tmp` tmpfs, no network unless allowed,
    `--pids-limit`, `--memory`, CPU and file-size ulimits, all capabilities dropped, no new
    privileges. The image must contain what the commands need (bash, python, ...).

    Needs a running Docker daemon. Not exercised by this repository's tests (they run where no
    daemon is available); the bubblewrap sandbox is the tested default."""

    image: str = "python:3.11-slim"
    limits: SandboxLimits = SandboxLimits()
    allow_network: bool = False
    docker: str = "docker"

    @property
    def kind(self) -> str:
        return "docker"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "image": self.image,
            "limits": _limits_dict(self.limits),
            "allow_network": self.allow_network,
            "docker": self.docker,
        }

    def argv(self, command: Sequence[str], workspace: str, name: str, env: Mapping[str, str]) -> list[str]:
        lim = self.limits
        a = [self.docker, "run", "--rm", "-i", "--name", name, "--init", "--read-only"]
        a += ["--network", "bridge" if self.allow_network else "none", "--cap-drop", "ALL"]
        a += ["--security-opt", "no-new-privileges", "--pids-limit", str(lim.max_processes)]
        a += ["--memory", str(lim.memory_bytes), "--memory-swap", str(lim.memory_bytes)]
        a += ["--ulimit", f"cpu={lim.cpu_seconds}", "--ulimit", f"fsize={lim.file_size_bytes}"]
        a += ["--tmpfs", f"/tmp:rw,size={lim.tmp_bytes}", "-v", f"{workspace}:{workspace}", "-w", workspace]
        a += ["--user", f"{os.getuid()}:{os.getgid()}", "-e", f"HOME={_SANDBOX_HOME}"]
        for k in env:
            a += ["-e", k]  # the value is taken from docker's own environment, never the command line
        return [*a, self.image, *command]

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str,
        timeout_s: float,
        max_output_bytes: int,
        env: Mapping[str, str],
    ) -> SandboxResult:
        if shutil.which(self.docker) is None:
            raise SandboxUnavailable(f"{self.docker!r} is not installed; {_INSTALL_HINT}")
        workspace = await trio.to_thread.run_sync(os.path.realpath, workspace)
        name = f"rollouts-sandbox-{uuid.uuid4().hex[:16]}"
        try:
            return await _run_watched(
                self.argv(argv, workspace, name, env),
                workspace=workspace,
                timeout_s=timeout_s,
                max_output_bytes=max_output_bytes,
                # the client needs its own settings (DOCKER_HOST, config); only `env`'s names reach the container
                env={**os.environ, **env},
                limits=self.limits,
            )
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(30):
                # killing the client does not stop the container: remove it (quietly if gone)
                await trio.run_process(
                    [self.docker, "rm", "-f", name], capture_stdout=True, capture_stderr=True, check=False
                )


@dataclasses.dataclass(frozen=True)
class Unsandboxed:
    """No sandbox: commands run as this process's user, seeing and reaching everything it can
    (only the supervisor's cleanup of leftover processes and the timeout apply). Choose it by
    name, `sandbox="unsandboxed"`, and only for code you trust."""

    @property
    def kind(self) -> str:
        return "unsandboxed"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    async def run(
        self,
        argv: Sequence[str],
        *,
        workspace: str,
        timeout_s: float,
        max_output_bytes: int,
        env: Mapping[str, str],
    ) -> SandboxResult:
        return await run_command(argv, cwd=workspace, timeout_s=timeout_s, max_output_bytes=max_output_bytes, env=env)


def _limits_from(data: Mapping[str, Any] | None) -> SandboxLimits:
    return SandboxLimits(**dict(data or {}))


def resolve_sandbox(spec: str | Sandbox | Mapping[str, Any]) -> Sandbox:
    """A sandbox from a name ("auto" or "bwrap": bubblewrap, checked to work here; "docker";
    "unsandboxed"), from `to_dict()` output, or a `Sandbox` as is. Raises `SandboxUnavailable`
    when "auto"/"bwrap" cannot run here, `ConfigurationError` for an unknown name."""
    if isinstance(spec, Sandbox):
        return spec
    data: dict[str, Any] = {"kind": spec} if isinstance(spec, str) else dict(spec)
    kind = data.pop("kind", None)
    if kind in ("auto", "bwrap"):
        sb = BubblewrapSandbox(
            limits=_limits_from(data.get("limits")),
            allow_network=bool(data.get("allow_network", False)),
            read_only_paths=tuple(data.get("read_only_paths", ())),
            bwrap=str(data.get("bwrap", "bwrap")),
        )
        sb.check()
        return sb
    if kind == "docker":
        return DockerSandbox(
            image=str(data.get("image", DockerSandbox.image)),
            limits=_limits_from(data.get("limits")),
            allow_network=bool(data.get("allow_network", False)),
            docker=str(data.get("docker", "docker")),
        )
    if kind == "unsandboxed":
        return Unsandboxed()
    raise ConfigurationError(f"unknown sandbox {kind!r}: choose 'auto', 'bwrap', 'docker' or 'unsandboxed'")
