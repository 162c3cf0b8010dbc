"""Run a shell command under trio: own process group, timeout, capped output, no orphans."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

import trio

# After the command's main process ends (or is killed), how long to wait for the rest of its
# process group to close the output pipe before giving up on reading.
_DRAIN_GRACE_S = 2.0
_REAP_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What a command did. `output` is stdout and stderr interleaved, capped with a marker."""

    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    total_bytes: int
    pid: int


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


async def run_command(
    argv: Sequence[str],
    *,
    cwd: str,
    timeout_s: float,
    max_output_bytes: int,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run `argv` in `cwd` in a new session (its own process group).

    Output is read as it comes and capped (head and tail kept). On timeout, on cancellation and
    after the main process exits, the whole process group is killed with SIGKILL, so background
    jobs the command started do not outlive it. Cancellation propagates after that cleanup."""
    assert timeout_s > 0 and max_output_bytes > 0
    proc = await trio.lowlevel.open_process(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    pgid = proc.pid  # start_new_session: the child leads its own group
    buf = _CappedBuffer(max_output_bytes)
    timed_out = False
    assert proc.stdout is not None

    async def _reader() -> None:
        assert proc.stdout is not None
        while True:
            chunk = await proc.stdout.receive_some(65536)
            if not chunk:
                return
            buf.feed(chunk)

    try:
        async with trio.open_nursery() as nursery:
            reader_scope = trio.CancelScope()

            async def _read_scoped() -> None:
                with reader_scope:
                    await _reader()

            nursery.start_soon(_read_scoped)
            with trio.move_on_after(timeout_s) as deadline:
                await proc.wait()
            timed_out = deadline.cancelled_caught
            _kill_group(pgid)
            # Everyone in the group is dead now; the pipe reaches EOF once they are gone.
            # A process that escaped the group (setsid) could hold it open: stop reading then.
            reader_scope.deadline = trio.current_time() + _DRAIN_GRACE_S
    finally:
        with trio.CancelScope(shield=True):
            _kill_group(pgid)
            with trio.move_on_after(_REAP_TIMEOUT_S):
                await proc.wait()
            await proc.stdout.aclose()
    return CommandResult(
        output=buf.text(),
        exit_code=proc.returncode,
        timed_out=timed_out,
        truncated=buf.truncated,
        total_bytes=buf.total,
        pid=proc.pid,
    )
