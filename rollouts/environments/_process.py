"""Run a shell command under trio: own session, timeout, capped output, no orphans.

The command runs under a small supervisor (`_reaper.py`, a child subreaper) that kills every
process the command started, even one that left its session or process group (`setsid`),
when the command ends, at the timeout and on cancellation."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

import trio

# After the command's main process ends (or is killed), how long to wait for the rest of its
# process group to close the output pipe before giving up on reading.
_DRAIN_GRACE_S = 2.0
_REAP_TIMEOUT_S = 5.0
_REAPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What a command did. `output` is stdout and stderr interleaved, capped with a marker."""

    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    total_bytes: int
    pid: int
    stopped: bool = False
    """Ended early because the caller's `stop` event was set (e.g. a sandbox limit was hit)."""


class _CappedBuffer:
    """Keeps the first `head` and the last `tail` bytes of a stream and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes | bytearray) -> None:
        self.total += len(data)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        if not self.truncated:
            return head + self.tail.decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        tail = self.tail.decode("utf-8", errors="replace")
        return f"{head}\n\n[... {omitted} bytes of output omitted ...]\n\n{tail}"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _open_sandbox_init(info: bytes) -> int | None:
    """A pidfd of the init process bwrap's `--info-fd` names (checked to be a bwrap process, so a
    pid reused after a very short command ends is never touched); None if it is gone."""
    try:
        pid = int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            if f.read().strip() == b"bwrap":
                return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _kill_sandbox_init(holder: list[int]) -> None:
    """SIGKILL bwrap's init through its pidfd (ending its PID namespace), once."""
    fd = holder.pop()
    try:
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        os.close(fd)


def _terminate(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


def _command_line(argv: Sequence[str], pid_write: int, cgroups: Sequence[str], bwrap: bool) -> list[str]:
    """What run_command starts: the supervisor running `argv`, or `argv` (a bubblewrap command
    line) reporting its init on `pid_write`, after joining `cgroups`."""
    if not bwrap:
        return [sys.executable, "-I", "-S", _REAPER, str(pid_write), *(f"--cgroup={c}" for c in cgroups), "--", *argv]
    full = [argv[0], "--info-fd", str(pid_write), *argv[1:]]
    if cgroups:  # joined before bwrap starts, so nothing the command forks escapes the limit
        joins = "".join(f'echo $$ > "{os.path.join(c, "cgroup.procs")}" && ' for c in cgroups)
        full = ["/bin/sh", "-c", joins + 'exec "$@"', "sh", *full]
    return full


async def _open_process(
    full: list[str], cwd: str, env: Mapping[str, str] | None, pid_read: int, pid_write: int
) -> trio.Process:
    """`full` started in a new session, its output on a pipe, `pid_write` passed to it (and
    closed here); `pid_read` closed too if it cannot start."""
    try:
        return await trio.lowlevel.open_process(
            full,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(pid_write,),
        )
    except BaseException:
        os.close(pid_read)
        raise
    finally:
        os.close(pid_write)


async def _wait_exit_or_stop(proc: trio.Process, stop: trio.Event | None) -> bool:
    """Wait until `proc` exits or `stop` is set: whether `stop` ended the wait."""
    if stop is None:
        await proc.wait()
        return False
    stopped = False
    async with trio.open_nursery() as waiters:

        async def _wait_stop() -> None:
            nonlocal stopped
            await stop.wait()
            stopped = True
            waiters.cancel_scope.cancel()

        async def _wait_exit() -> None:
            await proc.wait()
            waiters.cancel_scope.cancel()

        waiters.start_soon(_wait_stop)
        waiters.start_soon(_wait_exit)
    return stopped


async def run_command(
    argv: Sequence[str],
    *,
    cwd: str,
    timeout_s: float,
    max_output_bytes: int,
    env: Mapping[str, str] | None = None,
    stop: trio.Event | None = None,
    cgroups: Sequence[str] = (),
    bwrap: bool = False,
) -> CommandResult:
    """Run `argv` in `cwd` in a new session, under the supervisor (see the module docstring).

    Output is read as it comes and capped (head and tail kept). On timeout and on cancellation
    the supervisor is told to stop (SIGTERM): it SIGKILLs the command and every descendant,
    however detached; when the command exits by itself, the supervisor kills what it left
    behind (background jobs) before exiting. Cancellation propagates after that cleanup.
    `CommandResult.pid` is the command's own pid (the leader of its session).

    `stop`: when set, the command is killed as at the timeout (`CommandResult.stopped`).
    `cgroups`: cgroup directories the supervisor joins before it starts the command, so the
    command and everything it starts count against their limits (e.g. `pids.max`).
    `bwrap=True`: `argv` is a bubblewrap command line with a PID namespace, run without the
    supervisor (whose start costs more than bwrap's): bwrap reports its sandbox's init process
    (`--info-fd`), and when the command ends, times out or is cancelled that init is killed,
    which kills every process left in the namespace, however detached."""
    assert timeout_s > 0 and max_output_bytes > 0
    assert sys.executable, "the supervisor runs with this Python"
    pid_read, pid_write = os.pipe()
    proc = await _open_process(_command_line(argv, pid_write, cgroups, bwrap), cwd, env, pid_read, pid_write)
    pgid = proc.pid  # start_new_session: the supervisor leads its own group
    pid_stream = trio.lowlevel.FdStream(pid_read)
    command_pid = bytearray()
    buf = _CappedBuffer(max_output_bytes)
    timed_out = False
    stopped_by_caller = False
    assert proc.stdout is not None

    async def _reader() -> None:
        assert proc.stdout is not None
        while True:
            chunk = await proc.stdout.receive_some(65536)
            if not chunk:
                return
            buf.feed(chunk)

    sandbox_init: list[int] = []  # a pidfd of bwrap's init, once known
    pid_read_done = trio.Event()

    async def _read_pid() -> None:
        while len(command_pid) < 4096:  # "<pid>\n" from the supervisor, JSON from bwrap; then EOF
            chunk = await pid_stream.receive_some(4096)
            if not chunk:
                break
            command_pid.extend(chunk)
        if bwrap:
            init = _open_sandbox_init(bytes(command_pid))
            if init is not None:
                sandbox_init.append(init)
        pid_read_done.set()

    async def _stop_supervisor() -> None:
        """SIGTERM to the supervisor (it kills everything below it), then, if it has not
        exited in time, SIGKILL to its group as a backstop."""
        if bwrap:
            if proc.returncode is None:
                _kill_group(pgid)
            with trio.move_on_after(_REAP_TIMEOUT_S):  # bwrap closes its info fd as it starts the command
                await pid_read_done.wait()
            if sandbox_init:
                _kill_sandbox_init(sandbox_init)
            return
        if proc.returncode is None:
            _terminate(proc.pid)
            with trio.move_on_after(_REAP_TIMEOUT_S):
                await proc.wait()
        _kill_group(pgid)

    try:
        async with trio.open_nursery() as nursery:
            reader_scope = trio.CancelScope()

            async def _read_scoped() -> None:
                with reader_scope:
                    await _reader()

            nursery.start_soon(_read_scoped)
            nursery.start_soon(_read_pid)
            with trio.move_on_after(timeout_s) as deadline:
                stopped_by_caller = await _wait_exit_or_stop(proc, stop)
            timed_out = deadline.cancelled_caught
            await _stop_supervisor()
            # Everything below the supervisor is dead now; the pipe reaches EOF once it is gone.
            # Should something still hold it open (the supervisor could not run), stop reading.
            reader_scope.deadline = trio.current_time() + _DRAIN_GRACE_S
    finally:
        with trio.CancelScope(shield=True):
            await _stop_supervisor()
            with trio.move_on_after(_REAP_TIMEOUT_S):
                await proc.wait()
            await proc.stdout.aclose()
            await pid_stream.aclose()
    text = command_pid.decode("ascii", "replace").strip()
    if bwrap:
        text = str(proc.pid)
    return CommandResult(
        output=buf.text(),
        exit_code=proc.returncode,
        timed_out=timed_out,
        truncated=buf.truncated,
        total_bytes=buf.total,
        pid=int(text) if text.isdigit() else proc.pid,
        stopped=stopped_by_caller and not timed_out,
    )
