"""GitWorktreeEnvironment: a CodingEnvironment in its own git worktree, one commit per change.

    env = await GitWorktreeEnvironment.create("path/to/repo")   # new branch + worktree
    try:
        states = await run_agent(AgentState(actor, env), run_config)
    finally:
        await env.aclose()                                       # removes the worktree

Each environment works on its own branch (`rollouts/<id>`, renamed to `rollouts/session-<id>`
when a session starts) checked out in its own worktree, created from the checked-out branch
(when HEAD is detached: origin's HEAD, else main/master/trunk) or `base_ref`. Every
tool call that changes files (write, edit, bash) is committed, so a trajectory maps to a commit
history; a call cancelled half-way commits what it did so far, marked "(interrupted)", so it is
not folded into the next call's commit. The branch is kept after cleanup. `serialize()` records
the repository, branch, worktree and head; `deserialize()` re-attaches to the same worktree without creating anything
(it re-adds the worktree for the branch only when its directory has gone, e.g. on resume after
cleanup).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import uuid
from typing import TYPE_CHECKING, Any

import trio

from rollouts.dtypes import AgentState, ToolCall, ToolResult
from rollouts.environments.coding import CodingEnvironment

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

__all__ = ["GitError", "GitWorktreeEnvironment", "default_branch"]

_MUTATING_TOOLS = frozenset({"write", "edit", "bash"})
_DEFAULT_NAMES = ("main", "master", "trunk")
_GIT_IDENTITY = ("-c", "user.name=rollouts", "-c", "user.email=rollouts@localhost", "-c", "commit.gpgsign=false")
_GIT_TIMEOUT_S = 60.0


class GitError(RuntimeError):
    """A git command failed; the message has the command and git's own error text."""


async def _git(cwd: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(_GIT_TIMEOUT_S):
        r = await trio.run_process(
            ["git", *args],
            cwd=cwd,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"},
        )
    if check and r.returncode != 0:
        err = r.stderr.decode("utf-8", errors="replace").strip()
        raise GitError(f"`git {' '.join(args)}` failed in {cwd} (exit {r.returncode}): {err}")
    return r


_REPO_LOCKS: trio.lowlevel.RunVar[dict[str, trio.Lock]] = trio.lowlevel.RunVar("rollouts_git_repo_locks")


def _repo_lock(repo: str) -> trio.Lock:
    """One lock per repository (per trio run) around what changes its shared worktree and branch
    metadata: concurrent `git worktree add`s in one repository fail ("failed to read
    .git/worktrees/<other>/commondir"), and a prune could drop a worktree being added. Commits,
    each in its own worktree on its own branch, need no lock. Processes do not share it."""
    try:
        locks = _REPO_LOCKS.get()
    except LookupError:
        locks = {}
        _REPO_LOCKS.set(locks)
    lock = locks.get(repo)
    if lock is None:
        lock = locks[repo] = trio.Lock()
    return lock


def _is_dir(path: str) -> bool:
    """A quick stat (kept out of async bodies on purpose: it never blocks for long)."""
    return os.path.isdir(path)


def _out(r: subprocess.CompletedProcess[bytes]) -> str:
    return r.stdout.decode("utf-8", errors="replace").strip()


async def _ref_exists(repo: str, ref: str) -> bool:
    return (await _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)).returncode == 0


async def default_branch(repo: str) -> str:
    """The branch a new worktree starts from: the checked-out branch (what the user is working
    on, however stale `main` or `master` may be); when HEAD is detached or has no commits yet,
    origin's HEAD, else main/master/trunk."""
    r = await _git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    current = _out(r) if r.returncode == 0 else ""
    if current and await _ref_exists(repo, f"refs/heads/{current}"):
        return current
    r = await _git(repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", check=False)
    if r.returncode == 0 and _out(r):
        remote_ref = _out(r)
        local = remote_ref.split("/", 1)[1] if "/" in remote_ref else remote_ref
        return local if await _ref_exists(repo, f"refs/heads/{local}") else remote_ref
    for name in _DEFAULT_NAMES:
        if await _ref_exists(repo, f"refs/heads/{name}"):
            return name
    raise GitError(f"could not find a branch with commits in {repo}; pass base_ref='<branch or commit>'")


class GitWorktreeEnvironment(CodingEnvironment):
    """Coding tools in a per-session git worktree; every change is a commit. Use `create()`."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        repo: str,
        branch: str,
        base_commit: str,
        head: str | None = None,
        rename_on_session: bool = True,
        **coding_kwargs: Any,
    ) -> None:
        """Attach to an existing worktree; to make a new one call `await GitWorktreeEnvironment.create(repo)`."""
        super().__init__(root, **coding_kwargs)
        self.repo = repo
        self.branch = branch
        self.base_commit = base_commit
        self.head = head or base_commit
        self.rename_on_session = rename_on_session

    @classmethod
    async def create(
        cls,
        repo: str | os.PathLike[str],
        *,
        base_ref: str | None = None,
        branch: str | None = None,
        worktrees_dir: str | os.PathLike[str] | None = None,
        **coding_kwargs: Any,
    ) -> Self:
        """Make a new branch and worktree from `base_ref` (default: the checked-out branch, see `default_branch`).

        `branch` names the branch (default `rollouts/<random id>`, renamed after the session when
        one starts); `worktrees_dir` is where worktree directories go (default: the temp dir);
        other keyword arguments go to `CodingEnvironment` (preset, bash_timeout, ...)."""
        repo_path = str(await trio.Path(repo).resolve())
        if not _is_dir(repo_path):
            raise ValueError(f"repository {str(repo)!r} does not exist")
        r = await _git(repo_path, "rev-parse", "--show-toplevel", check=False)
        if r.returncode != 0:
            raise ValueError(f"{str(repo)!r} is not a git repository (run `git init` and commit first)")
        top = _out(r)
        base = base_ref or await default_branch(top)
        rb = await _git(top, "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}", check=False)
        if rb.returncode != 0:
            raise ValueError(f"base_ref {base!r} is not a branch or commit in {top}")
        base_commit = _out(rb)
        auto_named = branch is None
        branch_name = branch or f"rollouts/{uuid.uuid4().hex[:12]}"
        if worktrees_dir is not None:
            os.makedirs(worktrees_dir, exist_ok=True)
        path = tempfile.mkdtemp(prefix="rollouts-wt-", dir=worktrees_dir)
        try:
            async with _repo_lock(top):
                await _git(top, "worktree", "add", "--quiet", "-b", branch_name, path, base_commit)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(
            path,
            repo=top,
            branch=branch_name,
            base_commit=base_commit,
            rename_on_session=auto_named,
            **coding_kwargs,
        )

    # ---- lifecycle ------------------------------------------------------------------------

    async def on_session_start(self, session_id: str) -> None:
        """Name the branch after the session (only when `create()` chose the branch name)."""
        if not self.rename_on_session:
            return
        new = f"rollouts/session-{session_id}"
        if new != self.branch:
            async with _repo_lock(self.repo):
                await _git(self.repo, "branch", "-m", self.branch, new)
            self.branch = new

    async def cleanup(self, *, delete_branch: bool = False) -> None:
        """Remove the worktree (idempotent). The branch, and so the commit history, is kept
        unless `delete_branch`."""
        with trio.CancelScope(shield=True):
            async with _repo_lock(self.repo):
                await self._remove_worktree(delete_branch)

    async def _remove_worktree(self, delete_branch: bool) -> None:
        if _is_dir(self.root):
            r = await _git(self.repo, "worktree", "remove", "--force", self.root, check=False)
            if r.returncode != 0:
                shutil.rmtree(self.root, ignore_errors=True)
        await _git(self.repo, "worktree", "prune", check=False)
        if delete_branch:
            await _git(self.repo, "branch", "-D", self.branch, check=False)

    async def aclose(self) -> None:
        """Same as `cleanup()`."""
        await self.cleanup()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- tools ----------------------------------------------------------------------------

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        if not _is_dir(self.root):
            return ToolResult(
                tool_call.id,
                f"The worktree {self.root} no longer exists (the environment was cleaned up).",
                is_error=True,
            )
        if tool_call.name not in _MUTATING_TOOLS:
            return await super().exec_tool(tool_call, state, run_config, cancel_scope)
        try:
            result = await super().exec_tool(tool_call, state, run_config, cancel_scope)
        except BaseException:
            # Cancelled (or crashed) half-way: commit what the call did so far, under its own
            # name, so it is not folded into the next call's commit. Shielded and bounded.
            with trio.CancelScope(shield=True), trio.move_on_after(_GIT_TIMEOUT_S):
                try:
                    await self._commit(tool_call, interrupted=True)
                except GitError:
                    pass  # the original exception matters more
            raise
        sha = await self._commit(tool_call)
        if sha is None:
            return result
        details = {**dict(result.details or {}), "commit": sha}
        return dataclasses.replace(result, details=details)

    async def _commit(self, call: ToolCall, *, interrupted: bool = False) -> str | None:
        """Commit every change in the worktree; the new commit's sha, or None if nothing changed."""
        status = await _git(self.root, "status", "--porcelain", "--untracked-files=all")
        if not _out(status):
            return None
        await _git(self.root, "add", "-A")
        args = call.arguments
        if call.name == "bash":
            first = str(args.get("command", "")).strip().splitlines()[0] if args.get("command") else ""
            subject = f"bash: {first[:60]}{'...' if len(first) > 60 else ''}"
        else:
            subject = f"{call.name}: {args.get('path', '')}"
        if interrupted:
            subject += " (interrupted)"
        message = f"{subject}\n\nTool-Call-Id: {call.id}\n"
        await _git(self.root, *_GIT_IDENTITY, "commit", "--quiet", "--no-verify", "-m", message)
        self.head = _out(await _git(self.root, "rev-parse", "HEAD"))
        return self.head

    async def commits(self) -> list[str]:
        """Subjects of the commits made on this branch since the base, oldest first."""
        r = await _git(self.repo, "log", "--reverse", "--format=%s", f"{self.base_commit}..{self.branch}")
        return [line for line in _out(r).splitlines() if line]

    # ---- protocol -------------------------------------------------------------------------

    def get_status_info(self) -> dict[str, str]:
        return {**super().get_status_info(), "branch": self.branch, "head": self.head[:12]}

    def sandbox_read_only_paths(self) -> tuple[str, ...]:
        """The repository's git directory (objects, refs), read-only, so `git log`/`git diff`
        work in bash inside the sandbox; commits are made by this environment, outside it."""
        return (os.path.join(self.repo, ".git"),)

    async def serialize(self) -> dict[str, Any]:
        data = await super().serialize()
        data.update(
            repo=self.repo,
            branch=self.branch,
            base_commit=self.base_commit,
            head=self.head,
            rename_on_session=self.rename_on_session,
        )
        return data

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        data = dict(data)
        root = data.pop("root")
        if not _is_dir(root):
            # Resuming after the worktree was removed: check the branch out again in the same place.
            async with _repo_lock(data["repo"]):
                await _git(data["repo"], "worktree", "prune", check=False)
                await _git(data["repo"], "worktree", "add", "--quiet", root, data["branch"])
        return cls(root, **data)
