"""The supervisor `run_command` runs a command under, so that none of its processes outlive it.

    python -I -S _reaper.py PID_FD [--cgroup=DIR ...] -- COMMAND [ARGS...]

A process group or a session is not enough: a command can leave them (`setsid sleep 1000 &`).
This process makes itself a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`, Linux 3.4+), so
every process the command starts, however it detaches, stays its descendant: an orphan is
re-parented here, not to init. It then

* joins each `--cgroup` directory (writes its pid to `cgroup.procs`), so that the command and
  everything it starts count against that cgroup's limits (a sandbox's `pids.max`);
* forks the command in a session of its own (as before: its process group is its pid) and
  writes the command's pid to PID_FD (then closes it);
* when the command exits, SIGKILLs every remaining descendant (found by a full listing of
  /proc, repeated until none is left) and exits with the command's status (a command killed by
  a signal makes this process die of the same signal);
* on SIGTERM (the caller's timeout or cancellation), SIGKILLs the command and every
  descendant, then itself.

Not covered: the caller itself being SIGKILLed (`PR_SET_PDEATHSIG` cannot stand in: it fires
when the *thread* that started this process exits, and trio starts processes from a worker
thread that is later retired).

It is a script run with `-I -S` (no site, no rollouts import) and uses only the standard
library's C modules where the Python ones import more (`_signal`, `_ctypes`), so it starts in
about the time of a bare interpreter. Where prctl is unavailable it still runs the command and kills what
it finds among its descendants, as before (the group kill by the caller remains as a backstop).
"""

from __future__ import annotations

import _signal as signal  # the C module: `signal` imports enum, which costs more than the rest
import os
import sys
import time

_PR_SET_CHILD_SUBREAPER = 36
_MAX_PASSES = 2000  # kill passes before giving up (each kills every process then alive)


class _Stop(Exception):
    pass


def _on_term(signum: int, frame: object) -> None:
    raise _Stop


def _become_subreaper() -> bool:
    """`prctl(PR_SET_CHILD_SUBREAPER, 1)` through `_ctypes` directly (importing `ctypes` costs
    more than the rest of this process's start). False where it is not available."""
    try:
        import _ctypes

        # _SimpleCData is generic in typeshed but not subscriptable at run time
        class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
            _type_ = "i"

        class _Func(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = _Int

        class _Libc:  # what CFuncPtr looks a symbol up in: an object with a dlopen handle
            _handle = _ctypes.dlopen(None, 0)  # type: ignore[arg-type]

        prctl = _Func(("prctl", _Libc()))  # type: ignore[arg-type]
        return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (ImportError, OSError, AttributeError, TypeError):
        return False


def _has_children() -> bool:
    try:
        os.waitpid(-1, os.WNOHANG)  # reaps one that has exited, if any; _kill_all reaps the rest
    except ChildProcessError:
        return False
    return True


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc (not Linux): only the caller's group kill remains
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def _descendants(root: int) -> list[int]:
    children = _children_map()
    found: list[int] = []
    stack = [root]
    while stack:
        for pid in children.get(stack.pop(), ()):
            found.append(pid)
            stack.append(pid)
    return found


def _reap() -> None:
    """Collect every child that has exited (without blocking)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all() -> None:
    """SIGKILL every descendant, again until none is left (a process forking while it is
    listed has its children re-parented here, to be found by the next pass). Bounded: a
    process the kernel cannot kill (stuck in the kernel) is given up on after a few seconds."""
    me = os.getpid()
    for n in range(_MAX_PASSES):
        # no child left means no descendant left: an orphan is re-parented to this process
        pids = _descendants(me) if _has_children() else []
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap()
        if n:  # SIGKILL is delivered asynchronously: give the kernel a moment on later passes
            time.sleep(min(0.0002 * n, 0.005))


def _exec_child(argv: list[str]) -> None:
    """In the forked child: a session of its own, default signal handling, then the command."""
    try:
        os.setsid()
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE/SIGXFSZ; the shell must not
        os.execvp(argv[0], argv)
    except BaseException as e:  # report anything, then leave without cleanup
        try:
            os.write(2, f"cannot run {argv[0]!r}: {e}\n".encode())
        finally:
            os._exit(127)


def _join_cgroups(args: list[str]) -> list[str]:
    """Join the `--cgroup=DIR` options' cgroups; the command's argv (after `--`) is returned."""
    while args and args[0].startswith("--cgroup="):
        with open(os.path.join(args.pop(0)[len("--cgroup=") :], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    if args and args[0] == "--":
        args.pop(0)
    return args


def main() -> None:
    pid_fd = int(sys.argv[1])
    try:
        argv = _join_cgroups(sys.argv[2:])
    except OSError as e:  # a limit that cannot be applied: refuse to run the command
        os.write(2, f"cannot join the sandbox's cgroup: {e}\n".encode())
        os._exit(126)
    os.set_inheritable(pid_fd, False)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the caller's to handle
    _become_subreaper()
    status = None
    try:
        child = os.fork()
        if child == 0:
            _exec_child(argv)
        os.write(pid_fd, b"%d\n" % child)
        os.close(pid_fd)
        while status is None:
            pid, st = os.waitpid(-1, 0)  # any child: orphans re-parented here are reaped too
            if pid == child:
                status = st
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # cleaning up now; a second SIGTERM changes nothing
    _kill_all()
    if status is None:  # stopped from outside: die as a killed process would
        os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(137)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal that does not end a process by default
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
