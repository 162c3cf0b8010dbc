"""Issue 33 item 16: every Python and shell snippet of README.md and docs/ is checked as written.

Each snippet is named in `SNIPPETS` (by file and how it starts) with how it is checked, so a new
snippet cannot go unchecked:

* `run`: executed in a fresh process, offline (top-level `await` runs under trio), with the
  `context` the surrounding prose gives it (e.g. the `state` a sessions snippet continues);
* `names`: snippets that need a model API key, a server or a GPU-sized download: every name they
  use is defined, imported or given by the prose (ruff's F821 on the snippet), and every import
  in them is executed, so a snippet missing an import (as the Sessions one was) fails;
* shell `run`: executed; shell `flags`: each `rollouts ...` command's subcommand exists and every
  `--flag` it uses is in that subcommand's `--help`;
* `skip` with a reason: not code to run (a model's output shown in a transcript, the setup
  commands that tests/test_docs_and_examples.py checks).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from cli_support import CLI, cli_env

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(python|bash|sh)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Check:
    how: str  # run | names | flags | skip
    context: tuple[str, ...] = ()  # names the prose defines (names), or code run first (run)
    after: str = ""  # code run after the snippet (run)
    reason: str = ""


_SCRIPTED_STATE = (
    "from rollouts import Actor, AgentState, Message, ScriptedModel, Trajectory",
    "state = AgentState(Actor(Trajectory((Message('user', 'hi'),)), ScriptedModel(['a', 'b', 'c']).endpoint))",
    "key = ''",
)

SNIPPETS: dict[tuple[str, str], Check] = {
    ("README.md", "pip install -e '.[local]' && rollouts demo"): Check(
        "skip", reason="tests/test_docs_and_examples.py"
    ),
    ("README.md", "import trio\nfrom rollouts import ("): Check("run"),
    ("README.md", "from rollouts import Endpoint"): Check("names", reason="the embedded model"),
    ("README.md", "s = s[::-1]"): Check("skip", reason="a model's reply in a transcript"),
    ("README.md", 'rollouts run --env coding -p "run the tests and fix what fails"'): Check("flags"),
    ("README.md", "from rollouts import EvalConfig, Endpoint, Message, combine, evaluate"): Check(
        "names", reason="a server on localhost:8000"
    ),
    ("README.md", "rollouts eval humaneval -m local/qwen2.5-coder-1.5b"): Check("flags"),
    ("README.md", "rollouts eval-set gsm8k.jsonl arith.jsonl"): Check("flags"),
    ("README.md", "from rollouts import Message, RunConfig, run_agent"): Check("run", context=_SCRIPTED_STATE),
    ("README.md", "rollouts sessions list"): Check("flags"),
    ("README.md", "from rollouts import EvalConfig, Endpoint, optimize"): Check(
        "names", context=("rows", "score"), reason="OpenAI and Anthropic keys"
    ),
    ("README.md", "import trio\nfrom rollouts.view"): Check("names", reason="it serves until stopped"),
    ("README.md", "from rollouts.service.client import ServiceClient"): Check(
        "names", context=("token",), reason="a running service"
    ),
    ("README.md", "from rollouts.training import GRPOConfig, grpo_train"): Check(
        "names", context=("rows", "score_fn"), reason="training steps"
    ),
    ("docs/environments.md", "from typing import Annotated, Any"): Check(
        "run",
        after=textwrap.dedent(
            """
            import trio
            from rollouts import ToolCall, check_environment

            async def todo():
                env = await check_environment(TodoEnvironment(), calls=[ToolCall("1", "add_item", {"title": "x"})])
                assert env.items == [{"title": "x", "done": False}]

            trio.run(todo)
            """
        ),
    ),
    ("docs/environments.md", "import trio\nfrom rollouts import Actor"): Check(
        "names", context=("TodoEnvironment",), reason="an Anthropic key"
    ),
    ("docs/environments.md", "from rollouts import ToolCall, check_environment"): Check(
        "names", context=("TodoEnvironment",), reason="run with the snippet above"
    ),
    ("docs/environments.md", "from rollouts.environments import BubblewrapSandbox"): Check(
        "names", reason="a repository and a sandbox"
    ),
    ("docs/environments.md", "config = EvalConfig(endpoint=endpoint"): Check(
        "names", context=("EvalConfig", "endpoint", "CodingEnvironment"), reason="a line of the prose's setting"
    ),
    ("docs/environments.md", "from rollouts.environments import CodingEnvironment, MCPEnvironment"): Check(
        "names", reason="MCP servers"
    ),
    ("docs/environments.md", "rollouts run --mcp 'python my_server.py'"): Check("flags"),
    ("docs/training.md", "from rollouts.training import GRPOConfig, grpo_train"): Check(
        "names", context=("rows", "score_fn"), reason="training steps"
    ),
}


@dataclass(frozen=True)
class Snippet:
    file: str
    line: int
    lang: str
    code: str


def _snippets() -> list[Snippet]:
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append(Snippet(path.relative_to(ROOT).as_posix(), line, m.group(1), m.group(2)))
    return out


def _check_of(snippet: Snippet) -> Check:
    code = snippet.code.lstrip()
    for (file, start), check in SNIPPETS.items():
        if file == snippet.file and code.startswith(start):
            return check
    raise AssertionError(f"{snippet.file}:{snippet.line}: a snippet no test checks; name it in SNIPPETS")


ALL = _snippets()


def test_docs_snippets_every_one_is_checked() -> None:
    unchecked = []
    for s in ALL:
        try:
            _check_of(s)
        except AssertionError as e:
            unchecked.append(str(e))
    assert unchecked == []


_HARNESS = textwrap.dedent(
    """
    import ast, sys, trio
    source = open(sys.argv[1], encoding="utf-8").read()
    code = compile(source, sys.argv[2], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace = {"__name__": "__snippet__"}
    result = eval(code, namespace)
    if result is not None:  # top-level await: a coroutine to run
        async def main():
            await result
        trio.run(main)
    """
)


def _undefined_names(code: str, tmp: Path) -> set[str]:
    path = tmp / "snippet.py"
    path.write_text(code, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821", "--output-format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = json.loads(proc.stdout or "[]")
    return {re.search(r"`([^`]+)`", d["message"]).group(1) for d in found}  # type: ignore[union-attr]


def _imports(code: str) -> str:
    tree = ast.parse(code)
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang == "python"], ids=lambda s: f"{s.file}:{s.line}")
def test_docs_snippets_python(snippet: Snippet, tmp_path: Path) -> None:
    check = _check_of(snippet)
    if check.how == "skip":
        assert check.reason
        return
    if check.how == "names":
        assert check.reason, "say why the snippet is not run"
        assert _undefined_names(snippet.code, tmp_path) <= set(check.context), snippet.code
        imports = _imports(snippet.code)
        proc = subprocess.run([sys.executable, "-c", imports], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, f"{snippet.file}:{snippet.line}: its imports fail: {proc.stderr}"
        return
    assert check.how == "run"
    source = "\n".join(check.context) + "\n" + snippet.code + "\n" + check.after
    (tmp_path / "snippet.py").write_text(source, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-c", _HARNESS, str(tmp_path / "snippet.py"), f"{snippet.file}:{snippet.line}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**cli_env(tmp_path), "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert proc.returncode == 0, f"{snippet.file}:{snippet.line} fails as written:\n{proc.stderr[-3000:]}"


def _rollouts_commands(code: str) -> list[list[str]]:
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("rollouts "):
            commands.append(shlex.split(line)[1:])
    return commands


def _help(words: list[str], tmp: Path) -> str:
    sub = []
    for w in words:
        if w.startswith("-"):
            break
        sub.append(w)
        proc = subprocess.run([*CLI, *sub, "--help"], capture_output=True, text=True, timeout=60, env=cli_env(tmp))
        if proc.returncode != 0:
            sub.pop()
            break
    proc = subprocess.run([*CLI, *sub, "--help"], capture_output=True, text=True, timeout=60, env=cli_env(tmp))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("snippet", [s for s in ALL if s.lang != "python"], ids=lambda s: f"{s.file}:{s.line}")
def test_docs_snippets_shell(snippet: Snippet, tmp_path: Path) -> None:
    check = _check_of(snippet)
    if check.how == "skip":
        assert check.reason
        return
    assert check.how == "flags"
    for words in _rollouts_commands(snippet.code):
        text = _help(words, tmp_path)
        flags = [w.split("=")[0] for w in words if w.startswith("--")]
        missing = [f for f in flags if f not in text]
        assert missing == [], f"{snippet.file}:{snippet.line}: `rollouts {' '.join(words)}`: no {missing} in --help"
    if snippet.code.startswith("rollouts sessions list"):  # offline, so it runs too
        proc = subprocess.run(
            [*CLI, "sessions", "list"], capture_output=True, text=True, timeout=60, env=cli_env(tmp_path)
        )
        assert proc.returncode == 0, proc.stderr
