"""The limits of a sandbox that no rlimit covers: a cgroup's process count and the workspace's size.

* `pids_cgroup()`: a fresh cgroup whose `pids.max` bounds every process of one command.
  `RLIMIT_NPROC` does that for ordinary users (counted inside the sandbox's user namespace), but
  the kernel never applies it to a process whose real uid is root, even in a user namespace
  (mapping root to another uid inside does not change the real uid the kernel checks): there the
  cgroup is the bound. Where one is writable: the cgroup v1 `pids` hierarchy
  (`/sys/fs/cgroup/pids`), else a cgroup v2 hierarchy whose `pids` controller is available, at
  its root or at this process's own cgroup (`/proc/self/cgroup`: a container's namespace root, a
  delegated subtree), with `pids` enabled in the parent's `cgroup.subtree_control` (it is a
  threaded controller, so the kernel allows that beside the parent's own processes). Groups are
  made under a `rollouts-sandbox` directory there and removed after their command.
* `watch_disk()`: sums the workspace's disk usage every few tens of milliseconds while a command
  runs (less often for a workspace slow to walk) and sets `stop` when it grew by more than the
  limit, or by more than `MAX_NEW_ENTRIES` files (the command is then killed). The first walk,
  made as the command starts, is the baseline, so the command does not wait for it. A workspace
  of more than `MAX_WALK_ENTRIES` entries is not watched.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

_PIDS_ROOT = "/sys/fs/cgroup/pids"
_MOUNTS = "/proc/self/mounts"
_OWN_CGROUP = "/proc/self/cgroup"
_GROUP_DIR = "rollouts-sandbox"
MAX_WALK_ENTRIES = 1_000_000
MAX_NEW_ENTRIES = 100_000
_POLL_S = 0.05
_MAX_MOUNT_LINES = 10_000
_counter = itertools.count()


def _words(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split()
    except OSError:
        return []


def _cgroup2_candidates() -> list[str]:
    """The cgroup v2 directories a sandbox group could be made under: each cgroup2 mount's root,
    then this process's own cgroup in it."""
    mounts = []
    try:
        with open(_MOUNTS, encoding="utf-8") as f:
            for line in itertools.islice(f, _MAX_MOUNT_LINES):
                parts = line.split()
                if len(parts) >= 3 and parts[2] == "cgroup2":
                    mounts.append(parts[1].replace("\\040", " "))
    except OSError:
        return []
    own = next((line[3:].strip() for line in _read_lines(_OWN_CGROUP) if line.startswith("0::")), "/")
    out = []
    for mount in mounts:
        out.append(mount)
        if own != "/":
            out.append(os.path.join(mount, own.lstrip("/")))
    return out


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _enable_pids(directory: str) -> bool:
    """Whether `pids` is (or could be made) enabled for `directory`'s children."""
    if "pids" in _words(os.path.join(directory, "cgroup.subtree_control")):
        return True
    try:
        with open(os.path.join(directory, "cgroup.subtree_control"), "w") as f:
            f.write("+pids")
    except OSError:
        return False
    return True


def _cgroup2_parent() -> str | None:
    """A cgroup v2 directory with `pids` enabled for its children, made for sandbox groups
    (`<candidate>/rollouts-sandbox`), or None."""
    for candidate in _cgroup2_candidates():
        if "pids" not in _words(os.path.join(candidate, "cgroup.controllers")) or not os.access(candidate, os.W_OK):
            continue
        if not _enable_pids(candidate):
            continue
        parent = os.path.join(candidate, _GROUP_DIR)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError:
            continue
        if _enable_pids(parent):  # (no process of its own: only its groups have any)
            return parent
    return None


@functools.cache
def pids_cgroup_parent() -> str | None:
    """Where sandbox groups are made: `/sys/fs/cgroup/pids/rollouts-sandbox` (cgroup v1), a
    cgroup v2 directory (see the module docstring), or None when no writable hierarchy with a
    `pids` controller exists (then, as root, nothing bounds a command's process count)."""
    if os.access(_PIDS_ROOT, os.W_OK) and os.path.exists(os.path.join(_PIDS_ROOT, "cgroup.procs")):
        return os.path.join(_PIDS_ROOT, _GROUP_DIR)
    return _cgroup2_parent()


def pids_cgroup_supported() -> bool:
    """Whether a writable cgroup hierarchy with a `pids` controller exists (v1 or v2)."""
    return pids_cgroup_parent() is not None


@asynccontextmanager
async def pids_cgroup(max_processes: int) -> AsyncIterator[str | None]:
    """A new cgroup allowing `max_processes` processes (its directory), removed afterwards;
    None where no writable hierarchy exists. The first use in a process also removes the
    empty groups of processes that are gone (left when their last processes were reaped only
    after the removal's retries, or by a killed process)."""
    parent = await trio.to_thread.run_sync(pids_cgroup_parent)
    if parent is None:
        yield None
        return
    if not _swept:
        _swept.append(parent)
        await trio.to_thread.run_sync(sweep_dead_groups, parent)
    path = os.path.join(parent, f"{os.getpid()}-{next(_counter)}")
    await trio.to_thread.run_sync(_make_group, path, max_processes)
    try:
        yield path
    finally:
        with trio.CancelScope(shield=True):
            delay = 0.01
            for _ in range(_RMDIR_TRIES):  # the last processes leave the group as the kernel reaps them
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.5)


_RMDIR_TRIES = 20  # ~5 s in all: reaping can lag on a loaded machine
_swept: list[str] = []
_MAX_SWEEP = 10_000


def sweep_dead_groups(parent: str, min_age_s: float = 60.0) -> int:
    """Remove the groups `<pid>-<n>` under `parent` whose process is gone, which are empty (a
    group still holding processes cannot be removed and is left) and were made over
    `min_age_s` ago (a process of another PID namespace sharing the hierarchy looks gone: its
    group is never taken while it is being set up); how many were removed."""
    removed = 0
    now = time.time()
    try:
        names = os.listdir(parent)[:_MAX_SWEEP]
    except OSError:
        return 0
    for name in names:
        pid, _, n = name.partition("-")
        if not (pid.isdigit() and n.isdigit()) or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        path = os.path.join(parent, name)
        try:
            if now - os.stat(path).st_mtime < min_age_s:
                continue
            os.rmdir(path)
            removed += 1
        except OSError:
            continue
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _make_group(path: str, max_processes: int) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "pids.max"), "w") as f:
        f.write(str(max_processes))


def disk_usage(root: str) -> tuple[int, int]:
    """(bytes of disk used, entries) under `root` (blocks; hard links counted once per name,
    symlinks not followed); the walk stops past `MAX_WALK_ENTRIES` entries."""
    total = 0
    entries = 0
    stack = [root]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                entries += 1
                if entries > MAX_WALK_ENTRIES:
                    return total, entries
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
    return total, entries


async def watch_disk(root: str, limit: int, stop: trio.Event, why: list[str]) -> None:
    """Until cancelled: measure `root` (the first time as the baseline), then every `_POLL_S`
    (longer for a workspace slow to walk); once it grew by more than `limit` bytes or
    `MAX_NEW_ENTRIES` entries, record why in `why` and set `stop`."""
    t0 = time.monotonic()
    base_bytes, base_entries = await trio.to_thread.run_sync(disk_usage, root, abandon_on_cancel=True)
    if base_entries > MAX_WALK_ENTRIES:
        return  # too big to watch: only the file-size limit applies
    interval = max(_POLL_S, 4 * (time.monotonic() - t0))
    while True:
        await trio.sleep(interval)
        t0 = time.monotonic()
        used, entries = await trio.to_thread.run_sync(disk_usage, root, abandon_on_cancel=True)
        if used - base_bytes > limit or entries - base_entries > MAX_NEW_ENTRIES:
            grew = f"more than {limit} bytes" if used - base_bytes > limit else f"more than {MAX_NEW_ENTRIES} files"
            why.append(f"the command wrote {grew} to the workspace (the sandbox's disk limit); it was stopped")
            stop.set()
            return
        interval = max(_POLL_S, 4 * (time.monotonic() - t0))
