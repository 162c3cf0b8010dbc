"""Helpers for the CLI tests: run the real `rollouts` command in a subprocess, offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.local_model import model_cache_dir

# The installed console script (`[project.scripts] rollouts = "rollouts.cli:main"`), next to this
# interpreter; `python -m rollouts.cli` only where the package is not installed (test_cli_help
# checks that it is). Subprocesses inherit PYTHONPATH, so a worktree tests its own code.
CONSOLE_SCRIPT = Path(sysconfig.get_path("scripts")) / "rollouts"
CLI = [str(CONSOLE_SCRIPT)] if CONSOLE_SCRIPT.is_file() else [sys.executable, "-m", "rollouts.cli"]

# Fake keys: tests check that none of them ever reaches output or a written file.
FAKE_KEYS = {
    "ANTHROPIC_API_KEY": "sk-ant-FAKEKEY-anthropic-0123456789",
    "OPENAI_API_KEY": "sk-FAKEKEY-openai-0123456789",
    "GEMINI_API_KEY": "FAKEKEY-gemini-0123456789",
    "GOOGLE_API_KEY": "FAKEKEY-google-0123456789",
}


def cli_env(tmp: Path, **extra: str) -> dict[str, str]:
    """An environment with no real keys, storage under `tmp`, no colour and no config files."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("ROLLOUTS_")}
    env.update(
        # the embedded model's cache is shared, not per test: it is assembled once (491 MB)
        ROLLOUTS_MODEL_CACHE=str(model_cache_dir()),
        HOME=str(tmp / "home"),
        XDG_CONFIG_HOME=str(tmp / "config"),
        ROLLOUTS_SESSIONS_DIR=str(tmp / "sessions"),
        ROLLOUTS_RESULTS_DIR=str(tmp / "results"),
        NO_COLOR="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def run_cli(
    *args: str, tmp: Path, env: dict[str, str] | None = None, input: str | None = None, timeout: float = 60
) -> Result:
    """Run `rollouts ARGS` with cwd `tmp` and the test environment."""
    proc = subprocess.run(
        [*CLI, *args],
        cwd=tmp,
        env=env if env is not None else cli_env(tmp),
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def files_containing(root: Path, needles: list[str]) -> list[str]:
    """Every file under `root` whose bytes contain one of `needles`."""
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for n in needles:
                if n.encode() in data:
                    hits.append(f"{path}: {n}")
    return hits
