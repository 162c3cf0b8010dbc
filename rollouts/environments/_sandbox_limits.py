"""The limits of a sandbox that no rlimit covers: a cgroup's process count and the workspace's size.

* `pids_cgroup()`: a fresh cgroup (v1 `pids` hierarchy) whose `pids.max` bounds every process
  of one command. `RLIMIT_NPROC` does that for ordinary users (counted inside the sandbox's user
  namespace), but the kernel never applies it to a process whose real uid is root, even in a
  user namespace: there the cgroup is the bound. Used only where the hierarchy is writable.
* `watch_disk()`: sums the workspace's disk usage every few tens of milliseconds while a command
  runs (less often for a workspace slow to walk) and sets `stop` when it grew by more than the
  limit, or by more than `MAX_NEW_ENTRIES` files (the command is then killed). The first walk,
  made as the command starts, is the baseline, so the command does not wait for it. A workspace
  of more than `MAX_WALK_ENTRIES` entries is not watched.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

_PIDS_ROOT = "/sys/fs/cgroup/pids"
_GROUP_DIR = "rollouts-sandbox"
MAX_WALK_ENTRIES = 1_000_000
MAX_NEW_ENTRIES = 100_000
_POLL_S = 0.05
_counter = itertools.count()


def pids_cgroup_supported() -> bool:
    """Whether a writable cgroup v1 `pids` hierarchy exists (root, or delegated to this user)."""
    return os.access(_PIDS_ROOT, os.W_OK) and os.path.exists(os.path.join(_PIDS_ROOT, "cgroup.procs"))


@asynccontextmanager
async def pids_cgroup(max_processes: int) -> AsyncIterator[str | None]:
    """A new cgroup allowing `max_processes` processes (its directory), removed afterwards;
    None where no writable hierarchy exists."""
    if not pids_cgroup_supported():
        yield None
        return
    path = os.path.join(_PIDS_ROOT, _GROUP_DIR, f"{os.getpid()}-{next(_counter)}")
    await trio.to_thread.run_sync(_make_group, path, max_processes)
    try:
        yield path
    finally:
        with trio.CancelScope(shield=True):
            for _ in range(100):  # the last processes leave the group as the kernel reaps them
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    await trio.sleep(0.01)


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
