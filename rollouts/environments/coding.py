"""CodingEnvironment: read, write, edit files and run bash inside one root directory.

Every path a tool receives is resolved against the root (symlinks included) and refused when it
lands outside: `../x`, `/etc/passwd` and a symlink pointing out of the root all give a clear
error result. `bash` runs in the root inside a sandbox (`sandbox.py`; bubblewrap by default: a read-only
system, the root as the only writable host directory, a private /tmp, no network, a private PID
namespace, CPU/memory/process/file-size/disk limits) with a timeout, under a supervisor that is
a child subreaper (`_reaper.py`): every process the command started, even one that left the
session (`setsid`, a double fork, `nohup`), is killed on timeout, on cancellation and when the
command ends, and the output is capped. Without a usable sandbox the environment refuses to be
made with bash, unless `sandbox="unsandboxed"` is asked for by name.
`grep` also runs in a process of its own with a time limit, so a pattern that backtracks
catastrophically cannot freeze the event loop (Python's `re` holds the GIL while it matches).

One workspace per sample: `await CodingEnvironment.from_template(dir)` works on a private copy
of `dir` (removed by `aclose()`), so concurrent samples of `evaluate()` or a GRPO group given
`environment_factory=lambda: CodingEnvironment.from_template(dir)` never see each other's files.

Presets choose the tools: `read_only` (read, ls, glob, grep), `no_write` (those plus bash) and
`full` (everything). The files themselves are the environment's state on disk; `serialize()`
captures the root and the settings, so clones made by the agent loop share the directory.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import trio

from rollouts.dtypes import ToolCall, ToolResult
from rollouts.environments._grep_worker import TooManyFiles, walk_files
from rollouts.environments._process import run_command
from rollouts.environments.sandbox import BubblewrapSandbox, Sandbox, resolve_sandbox
from rollouts.environments.tools import ToolEnvironment, ToolError, tool

if TYPE_CHECKING:
    from typing import Self

__all__ = ["PRESETS", "CodingEnvironment", "Preset"]

Preset = Literal["read_only", "no_write", "full"]
PRESETS: Mapping[str, tuple[str, ...]] = {
    "read_only": ("read", "ls", "glob", "grep"),
    "no_write": ("read", "ls", "glob", "grep", "bash"),
    "full": ("read", "write", "edit", "bash", "ls", "glob", "grep"),
}
_WRITE_TOOLS = frozenset({"write", "edit"})
_SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules", ".venv", ".mypy_cache", ".ruff_cache"})
_MAX_LIST = 500
# Environment variables whose names look like credentials are not passed to bash by default, so
# a model cannot print the caller's API keys into the transcript.
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
_MAX_GREP_FILE_BYTES = 2_000_000
_MAX_READ_FILE_BYTES = 20_000_000
_MAX_WALK_FILES = 20_000
_GREP_TIMEOUT_S = 30.0
_GREP_WORKER = str(Path(__file__).with_name("_grep_worker.py"))


class CodingEnvironment(ToolEnvironment):
    """File and shell tools confined to `root`.

    Args:
        root: the working directory (must exist).
        preset: which tools to offer: "read_only", "no_write" or "full".
        bash_timeout: default seconds before a bash command and every process it started are killed.
        max_bash_timeout: the largest timeout the model may ask for.
        max_output_bytes: bash output kept (head and tail) per command.
        max_read_chars: characters `read` returns per call (use offset/limit for more).
        confirm_bash / confirm_writes: mark bash / write+edit calls `requires_confirmation`.
        bash_env: extra environment variables for bash commands. They are serialized (and so
            recorded in sessions): put no secrets here; name them in `pass_env` instead.
        pass_env: names of variables of this process to pass to bash even though they look
            like credentials (e.g. `("GITHUB_TOKEN",)`); only the names are serialized.
        pass_secrets: pass every variable whose name looks like a credential (`*_API_KEY`,
            `*TOKEN*`, `*SECRET*`, ...) from this process to bash. Off by default.
        sandbox: where bash commands run: "auto" (bubblewrap; `SandboxUnavailable` if it cannot
            run here), a `Sandbox` (`BubblewrapSandbox(limits, allow_network=True)`,
            `DockerSandbox(image)`), its `to_dict()`, or "unsandboxed" (no confinement: only for
            code you trust). Only checked when the preset has bash.
        owns_root: `aclose()` deletes the root (set by `from_template` for its private copy).

    The path confinement applies to the file tools; the sandbox confines `bash`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        preset: Preset = "full",
        bash_timeout: float = 30.0,
        max_bash_timeout: float = 600.0,
        max_output_bytes: int = 30_000,
        max_read_chars: int = 50_000,
        confirm_bash: bool = False,
        confirm_writes: bool = False,
        bash_env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        pass_secrets: bool = False,
        sandbox: str | Sandbox | Mapping[str, Any] = "auto",
        owns_root: bool = False,
    ) -> None:
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        root_path = Path(root)
        if not root_path.is_dir():
            raise ValueError(f"CodingEnvironment root {str(root)!r} is not an existing directory; create it first")
        if bash_timeout <= 0 or max_bash_timeout < bash_timeout:
            raise ValueError("bash_timeout must be > 0 and <= max_bash_timeout")
        self.root = os.path.realpath(root_path)
        self.preset: Preset = preset
        self.bash_timeout = float(bash_timeout)
        self.max_bash_timeout = float(max_bash_timeout)
        self.max_output_bytes = int(max_output_bytes)
        self.max_read_chars = int(max_read_chars)
        self.confirm_bash = confirm_bash
        self.confirm_writes = confirm_writes
        self.bash_env = dict(bash_env or {})
        self.pass_env = tuple(pass_env)
        self.pass_secrets = pass_secrets
        self.owns_root = owns_root
        if "bash" in PRESETS[preset]:
            self.sandbox: Sandbox | None = resolve_sandbox(sandbox)
        else:  # no model-written code runs: keep the setting without requiring a backend
            self.sandbox = None if isinstance(sandbox, str) and sandbox == "auto" else resolve_sandbox(sandbox)

    @classmethod
    async def from_template(
        cls, template: str | os.PathLike[str], *, workspaces_dir: str | os.PathLike[str] | None = None, **kwargs: Any
    ) -> Self:
        """An environment on a fresh copy of the directory `template` (in `workspaces_dir`,
        default the temp dir), deleted by `aclose()`: one workspace per sample for `evaluate()`
        and GRPO groups. Other keyword arguments go to the constructor."""
        src = str(template)
        root = await trio.to_thread.run_sync(
            _copy_workspace, src, None if workspaces_dir is None else str(workspaces_dir)
        )
        try:
            return cls(root, owns_root=True, **kwargs)
        except BaseException:
            await trio.to_thread.run_sync(functools.partial(shutil.rmtree, root, ignore_errors=True))
            raise

    async def aclose(self) -> None:
        """Delete the root if this environment owns it (a `from_template` copy); clones share it."""
        if self.owns_root:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(functools.partial(shutil.rmtree, self.root, ignore_errors=True))

    # ---- protocol -------------------------------------------------------------------------

    def enabled_tools(self) -> Sequence[str]:
        return PRESETS[self.preset]

    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        if tool_call.name == "bash":
            return self.confirm_bash
        if tool_call.name in _WRITE_TOOLS:
            return self.confirm_writes
        return False

    def get_status_info(self) -> dict[str, str]:
        return {"root": self.root, "preset": self.preset}

    async def serialize(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "preset": self.preset,
            "bash_timeout": self.bash_timeout,
            "max_bash_timeout": self.max_bash_timeout,
            "max_output_bytes": self.max_output_bytes,
            "max_read_chars": self.max_read_chars,
            "confirm_bash": self.confirm_bash,
            "confirm_writes": self.confirm_writes,
            "bash_env": dict(self.bash_env),
            "pass_env": list(self.pass_env),
            "pass_secrets": self.pass_secrets,
            "sandbox": self.sandbox.to_dict() if self.sandbox is not None else "auto",
            "owns_root": self.owns_root,
        }

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        return cls(**data)

    # ---- paths ----------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of `path` (relative to the root), or ToolError if it leaves the root."""
        if not isinstance(path, str) or not path.strip():
            raise ToolError("A path is required (relative to the working directory, e.g. 'src/main.py').")
        if "\x00" in path:
            raise ToolError(f"Invalid path {path!r}: contains a NUL byte.")
        joined = os.path.join(self.root, os.path.expanduser(path) if path.startswith("~") else path)
        real = os.path.realpath(joined)
        if real != self.root and not real.startswith(self.root + os.sep):
            norm = os.path.normpath(joined)
            via_link = norm == self.root or norm.startswith(self.root + os.sep)
            why = f"it goes through a symlink that leads to {real}" if via_link else f"it resolves to {real}"
            raise ToolError(
                f"Access denied: {path!r} is outside the working directory {self.root} ({why}). "
                "Use paths inside the working directory."
            )
        return Path(real)

    def _rel(self, p: Path) -> str:
        rel = os.path.relpath(p, self.root)
        return "." if rel == "." else rel

    # ---- tools ----------------------------------------------------------------------------

    @tool
    async def read(self, path: str, offset: int = 1, limit: int | None = None) -> str:
        """Read a text file, with line numbers. Long files come in pieces: pass `offset` (first
        line, 1-based) and `limit` (number of lines) to read further.

        Args:
            path: File path relative to the working directory.
            offset: First line to show (1-based).
            limit: Maximum number of lines to show.
        """
        p = self.resolve(path)
        if offset < 1:
            raise ToolError(f"offset must be >= 1 (lines are numbered from 1), got {offset}.")
        if limit is not None and limit < 1:
            raise ToolError(f"limit must be >= 1, got {limit}.")
        return await trio.to_thread.run_sync(self._read_sync, p, path, offset, limit, abandon_on_cancel=True)

    def _read_sync(self, p: Path, shown: str, offset: int, limit: int | None) -> str:
        if p.is_dir():
            raise ToolError(f"{shown!r} is a directory; use ls to list it.")
        if not p.is_file():
            raise ToolError(f"File not found: {shown!r}. Use ls or glob to find the right path.")
        size = p.stat().st_size
        if size > _MAX_READ_FILE_BYTES:
            raise ToolError(
                f"{shown!r} is {size} bytes, too large to read whole (limit {_MAX_READ_FILE_BYTES}); "
                "use grep, or bash with head/tail/sed -n."
            )
        data = p.read_bytes()
        if b"\x00" in data[:8192]:
            raise ToolError(f"{shown!r} looks like a binary file ({len(data)} bytes); read only reads text files.")
        lines = data.decode("utf-8", errors="replace").splitlines()
        n = len(lines)
        if n == 0:
            return f"({shown} is empty)"
        if offset > n:
            raise ToolError(f"offset {offset} is past the end of {shown!r}, which has {n} lines.")
        end = n if limit is None else min(n, offset - 1 + limit)
        out: list[str] = []
        size = 0
        last = offset - 1
        width = len(str(end))
        for i in range(offset - 1, end):
            line = f"{i + 1:>{width}}\t{lines[i]}"
            if size + len(line) + 1 > self.max_read_chars and out:
                break
            if len(line) > self.max_read_chars:
                line = line[: self.max_read_chars] + " [line truncated]"
            out.append(line)
            size += len(line) + 1
            last = i + 1
        text = "\n".join(out)
        if last < n:
            text += f"\n\n[Showing lines {offset}-{last} of {n}. Use offset={last + 1} to read more.]"
        return text

    @tool
    async def write(self, path: str, content: str) -> str:
        """Create or overwrite a file with `content` (parent directories are created).

        Args:
            path: File path relative to the working directory.
            content: The complete new file content.
        """
        p = self.resolve(path)
        if p.is_dir():
            raise ToolError(f"{path!r} is a directory; give a file path.")

        def _write() -> int:
            p.parent.mkdir(parents=True, exist_ok=True)
            return p.write_text(content, encoding="utf-8")

        await trio.to_thread.run_sync(_write)
        return f"Wrote {len(content.encode('utf-8'))} bytes to {self._rel(p)}."

    @tool
    async def edit(self, path: str, old_text: str, new_text: str, replace_all: bool = False) -> str:
        """Replace exact text in a file. `old_text` must match the file exactly (whitespace
        included) and be unique unless `replace_all` is true; read the file first.

        Args:
            path: File path relative to the working directory.
            old_text: The exact text to replace.
            new_text: The replacement text.
            replace_all: Replace every occurrence instead of requiring exactly one.
        """
        p = self.resolve(path)
        if old_text == "":
            raise ToolError("old_text must not be empty; to create a file use write.")
        if old_text == new_text:
            raise ToolError("old_text and new_text are identical; nothing would change.")

        def _edit() -> int:
            if not p.is_file():
                raise ToolError(f"File not found: {path!r}. Use ls or glob to find the right path.")
            size = p.stat().st_size
            if size > _MAX_READ_FILE_BYTES:
                raise ToolError(f"{path!r} is {size} bytes, too large to edit (limit {_MAX_READ_FILE_BYTES}).")
            try:
                text = p.read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                raise ToolError(f"{path!r} is not UTF-8 text; edit only changes text files.") from None
            count = text.count(old_text)
            if count == 0:
                raise ToolError(
                    f"old_text was not found in {path!r}. It must match exactly, including whitespace and "
                    "indentation; read the file and copy the text."
                )
            if count > 1 and not replace_all:
                raise ToolError(
                    f"old_text occurs {count} times in {path!r}; include more surrounding lines to make it "
                    "unique, or set replace_all to true."
                )
            p.write_text(text.replace(old_text, new_text), encoding="utf-8")
            return count

        count = await trio.to_thread.run_sync(_edit)
        return f"Replaced {count} occurrence{'s' if count != 1 else ''} in {self._rel(p)}."

    @tool
    async def bash(self, command: str, timeout_seconds: float | None = None) -> ToolResult:
        """Run a bash command in the working directory and return its output and exit code.
        Background processes (detached ones included) are stopped when the command finishes.

        Args:
            command: The command line, run with `bash -c`.
            timeout_seconds: Seconds before the command is killed (default set by the environment).
        """
        t = self.bash_timeout if timeout_seconds is None else float(timeout_seconds)
        if not 0 < t <= self.max_bash_timeout:
            raise ToolError(f"timeout must be between 0 and {self.max_bash_timeout:g} seconds, got {timeout_seconds}.")
        shell = shutil.which("bash") or "/bin/sh"
        inherited = {
            k: v for k, v in os.environ.items() if self.pass_secrets or k in self.pass_env or not _SECRET_ENV.search(k)
        }
        env = {**inherited, **self.bash_env}
        sandbox = self.sandbox or resolve_sandbox("auto")
        extra = self.sandbox_read_only_paths()
        if extra and isinstance(sandbox, BubblewrapSandbox):
            sandbox = dataclasses.replace(sandbox, read_only_paths=(*sandbox.read_only_paths, *extra))
        r = await sandbox.run(
            [shell, "-c", command], workspace=self.root, timeout_s=t, max_output_bytes=self.max_output_bytes, env=env
        )
        output = r.output.rstrip("\n")
        if r.timed_out:
            status = f"[Timed out after {t:g}s: the command and its child processes were killed.]"
        else:
            status = f"[exit code {r.exit_code}]"
        text = f"{output}\n{status}" if output else status
        details = {
            "exit_code": r.exit_code,
            "timed_out": r.timed_out,
            "truncated": r.truncated,
            "pid": r.pid,
            "stopped": r.stopped,
        }
        return ToolResult("", text, is_error=r.timed_out or r.stopped or r.exit_code != 0, details=details)

    def sandbox_read_only_paths(self) -> tuple[str, ...]:
        """Host paths outside the root that bash must see read-only (none here; a git worktree
        adds its repository's git directory)."""
        return ()

    @tool
    async def ls(self, path: str = ".") -> str:
        """List a directory (directories end with '/').

        Args:
            path: Directory relative to the working directory.
        """
        p = self.resolve(path)

        def _ls() -> str:
            if not p.is_dir():
                raise ToolError(f"{path!r} is not a directory.")
            entries = sorted(os.scandir(p), key=lambda e: e.name)
            names = [e.name + ("/" if e.is_dir() else "") for e in entries[:_MAX_LIST]]
            if not names:
                return f"({self._rel(p)} is empty)"
            more = f"\n[{len(entries) - _MAX_LIST} more entries not shown]" if len(entries) > _MAX_LIST else ""
            return "\n".join(names) + more

        return await trio.to_thread.run_sync(_ls, abandon_on_cancel=True)

    def _walk_files(self, base: Path) -> list[Path]:
        """Files under `base` (skipping VCS/cache dirs and links that leave the root), at most
        `_MAX_WALK_FILES` of them; ToolError beyond that, asking for a narrower path."""
        try:
            return walk_files(self.root, base, _SKIP_DIRS, _MAX_WALK_FILES)
        except TooManyFiles:
            raise ToolError(
                f"More than {_MAX_WALK_FILES} files under {self._rel(base)!r}; search a narrower path."
            ) from None

    @tool
    async def glob(self, pattern: str) -> str:
        """Find files whose path (relative to the working directory) matches a glob pattern,
        e.g. '**/*.py' or 'src/*.txt'.

        Args:
            pattern: The glob pattern.
        """
        if os.path.isabs(pattern) or ".." in Path(pattern).parts:
            raise ToolError(f"Pattern {pattern!r} must be relative to the working directory and not contain '..'.")

        def _glob() -> str:
            hits = [rel for f in self._walk_files(Path(self.root)) if _glob_match(pattern, rel := self._rel(f))]
            if not hits:
                return f"No files match {pattern!r}."
            more = f"\n[{len(hits) - _MAX_LIST} more matches not shown]" if len(hits) > _MAX_LIST else ""
            return "\n".join(hits[:_MAX_LIST]) + more

        return await trio.to_thread.run_sync(_glob, abandon_on_cancel=True)

    @tool
    async def grep(self, pattern: str, path: str = ".", include: str | None = None, ignore_case: bool = False) -> str:
        """Search file contents with a regular expression; prints `file:line: text`.

        Args:
            pattern: A Python regular expression.
            path: File or directory to search, relative to the working directory.
            include: Only search files whose name matches this glob, e.g. '*.py'.
            ignore_case: Match case-insensitively.
        """
        try:
            re.compile(pattern, re.IGNORECASE if ignore_case else 0)  # a clear error before any process starts
        except re.error as e:
            raise ToolError(f"Invalid regular expression {pattern!r}: {e}") from None
        p = self.resolve(path)

        # In a process of its own, killed at the time limit or on cancellation: `re` holds the
        # GIL for a whole match, so a backtracking pattern would otherwise freeze everything.
        args = {
            "root": self.root,
            "base": str(p),
            "pattern": pattern,
            "ignore_case": ignore_case,
            "include": include,
            "max_hits": _MAX_LIST,
            "max_file_bytes": _MAX_GREP_FILE_BYTES,
            "max_files": _MAX_WALK_FILES,
            "skip_dirs": sorted(_SKIP_DIRS),
        }
        r = await run_command(
            [sys.executable, "-I", "-S", _GREP_WORKER, json.dumps(args)],
            cwd=self.root,
            timeout_s=_GREP_TIMEOUT_S,
            max_output_bytes=_MAX_LIST * 2_000,
        )
        if r.timed_out:
            raise ToolError(
                f"grep stopped after {_GREP_TIMEOUT_S:g}s: narrow the path, or simplify the pattern "
                "(nested repeats such as (a+)+ can take forever)."
            )
        try:
            out = json.loads(r.output)
        except ValueError:
            raise ToolError(f"grep failed (exit code {r.exit_code}): {r.output[-500:]}") from None
        if out.get("error") == "too_many_files":
            raise ToolError(f"More than {_MAX_WALK_FILES} files under {self._rel(p)!r}; search a narrower path.")
        hits = out["hits"]
        if not hits:
            return f"No matches for {pattern!r}."
        more = f"\n[more than {_MAX_LIST} matches; narrow the search]" if out["more"] else ""
        return "\n".join(hits) + more


def _copy_workspace(template: str, workspaces_dir: str | None) -> str:
    """A new directory holding a copy of `template` (symlinks copied as links)."""
    if not os.path.isdir(template):
        raise ValueError(f"workspace template {template!r} is not an existing directory")
    root = tempfile.mkdtemp(prefix="rollouts-ws-", dir=workspaces_dir)
    try:
        shutil.copytree(template, root, symlinks=True, dirs_exist_ok=True)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return os.path.realpath(root)


def _glob_match(pattern: str, path: str) -> bool:
    """Whether a relative `path` matches a glob: a `**` segment spans any number of directories
    (none included), `*`, `?` and `[...]` stay within one segment.

    Matched segment by segment (fnmatch, which does not backtrack exponentially, within one),
    with a table over (pattern segment, path segment): time is linear in their product, where a
    translation of the whole glob into one regex (`*a*a*a...`) can take forever while holding
    the GIL."""
    pats: list[str] = []
    for part in pattern.split("/"):
        if part == "**" and pats and pats[-1] == "**":
            continue  # **/** is **
        pats.append(part.replace("**", "*") if part != "**" else part)
    segs = path.split("/")
    n_p, n_s = len(pats), len(segs)
    # ok[j]: pats[i:] matches segs[j:], computed from i = n_p down to 0.
    ok = [j == n_s for j in range(n_s + 1)]
    for i in range(n_p - 1, -1, -1):
        new = [False] * (n_s + 1)
        if pats[i] == "**":
            new[n_s] = ok[n_s]
            for j in range(n_s - 1, -1, -1):
                new[j] = ok[j] or new[j + 1]
        else:
            for j in range(n_s):
                new[j] = ok[j + 1] and fnmatch.fnmatchcase(segs[j], pats[i])
        ok = new
    return ok[0]
