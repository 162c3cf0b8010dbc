"""Issue 14 item 3: layers point one way, checked on the source.

The library never imports the CLI; no module imports another package's private (`_x`) modules;
the CLI continues sessions with the store's own resume functions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cli_support import run_cli

from rollouts import Message, ToolCallContent
from rollouts.dtypes import Endpoint
from rollouts.store import FileSessionStore

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rollouts"


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> list[str]:
    """Every module `path` imports (`from package import module` included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
    return names


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_layers_point_one_way_the_library_never_imports_the_cli() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if (PACKAGE / "cli") in path.parents or path == PACKAGE / "__main__.py":  # (python -m rollouts: the CLI)
            continue
        offenders += [f"{_module_name(path)} imports {n}" for n in _imports(path) if n.startswith("rollouts.cli")]
    assert offenders == []


def test_layers_point_one_way_no_package_imports_another_packages_private_modules() -> None:
    offenders = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "examples").rglob("*.py")]:
        importer = _module_name(path)
        for name in _imports(path):
            parts = name.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
            if private is None or parts[0] != "rollouts":
                continue
            owner = ".".join(parts[:private])  # the package the private module belongs to
            if owner == "rollouts":
                continue  # rollouts._schema & co: private to the library as a whole
            if not (importer == owner or importer.startswith(owner + ".")):
                offenders.append(f"{importer} imports {name}")
    assert offenders == []


async def test_layers_point_one_way_the_cli_resumes_with_the_stores_pending_tool_calls(tmp_path: Path) -> None:
    """A reply cut short mid-stream (details.aborted) asks for nothing: the CLI used a copy of
    pending_tool_calls without that check and ran the half-streamed call on continuing."""
    store = FileSessionStore(tmp_path / "sessions")
    session = await store.create(
        endpoint=Endpoint("scripted", "echo"),
        environment_type="rollouts.environments.calculator:CalculatorEnvironment",
        environment_state={"current_value": 0.0},
    )
    cut_short = Message("assistant", (ToolCallContent("call_x", "add", {"value": 5}),), details={"aborted": True})
    for m in (Message("user", "add 5"), cut_short):
        await store.append_message(session.session_id, m)
    r = run_cli("run", "--session", session.session_id, "-p", "never mind", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "unfinished tool calls" not in r.stderr
    stored, messages = await store.get(session.session_id)
    assert stored.environment_state == {"current_value": 0.0}  # the cut-short call never ran
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]


def test_a_public_surface_grouped_by_concept() -> None:
    """Issue 14 item 5: the root holds the core; the store, GEPA internals, the local model,
    testing and provider plumbing live in their packages' `__all__`."""
    import importlib

    import rollouts

    assert len(rollouts.__all__) == len(set(rollouts.__all__)) <= 90
    for name in rollouts.__all__:
        assert getattr(rollouts, name) is not None
    moved = {
        "rollouts.store": [
            "FileSessionStore",
            "AgentSession",
            "SessionStatus",
            "SessionRecoveryWarning",
            "resume_session",
        ],
        "rollouts.gepa": ["GEPAAdapter", "RolloutsAdapter", "GEPAEngine", "ParetoFront"],
        "rollouts.local_model": ["LocalServerSettings", "ensure_local_server", "shutdown_local_server"],
        "rollouts.testing": ["FakeServer", "open_fake_server"],
        "rollouts.providers": ["get_provider_function", "known_providers", "client_scope", "retry_policy"],
        "rollouts.providers.scripted": ["ScriptedRequest", "ScriptExhaustedError"],
        "rollouts.events": ["TextDelta", "ToolCallEnd", "ToolResultReceived", "StreamDone", "ignore_chunk"],
        "rollouts.errors": ["ModelFileError"],
        "rollouts.partial_json": ["parse_partial_json"],
    }
    for module_name, names in moved.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert name not in rollouts.__all__, f"{name} belongs to {module_name}"
            assert getattr(module, name) is not None
    for module_name in (
        "rollouts.store",
        "rollouts.gepa",
        "rollouts.local_model",
        "rollouts.testing",
        "rollouts.events",
    ):
        module = importlib.import_module(module_name)
        assert all(hasattr(module, n) for n in module.__all__), module_name
    # the core is at the root
    for name in ("run_agent", "RunConfig", "Message", "evaluate", "exact_match", "CalculatorEnvironment", "optimize"):
        assert name in rollouts.__all__


def _readme_module_map() -> list[tuple[list[str], str]]:
    """The rows of the README's module map: (the paths in the first cell, the whole row)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("| module | what it is |")
    rows = []
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        paths = [p for p in re.findall(r"`([^`]+)`", first) if p.startswith("rollouts/")]
        if paths:
            rows.append((paths, line))
    return rows


def _row_of(module: Path, rows: list[tuple[list[str], str]]) -> int | None:
    """The map row that names `module`: its own path (a top-level module), or its package's
    row naming it by its path inside the package (`run.py`, `fake_server/`)."""
    rel = module.relative_to(ROOT).as_posix()
    for i, (paths, line) in enumerate(rows):
        if rel in paths:
            return i
        for p in paths:
            if p.endswith("/") and rel.startswith(p):
                inside = rel[len(p) :]
                names = set(re.findall(r"`([^`]+)`", line))
                if module.name == "__init__.py" and "/" not in inside:
                    return i  # the package's own row
                if inside in names or module.name in names or inside.split("/")[0] + "/" in names:
                    return i
    return None


def test_the_readme_module_map_names_every_module_in_layer_order() -> None:
    """Issue 14: the README's module map matches the tree; each row imports only rows above it
    (imports for type checking only, and lazy imports inside functions, aside)."""
    rows = _readme_module_map()
    modules = sorted(PACKAGE.rglob("*.py"))
    unnamed = [m.relative_to(ROOT).as_posix() for m in modules if _row_of(m, rows) is None]
    assert unnamed == [], "add these to the README's Layout table (in their package's row)"
    named = {p for paths, _ in rows for p in paths}
    assert [p for p in named if not (ROOT / p).exists()] == []
    upward = []
    for m in modules:
        here = _row_of(m, rows)
        tree = ast.parse(m.read_text(encoding="utf-8"))
        for node in tree.body:  # module-level imports only: lazy ones inside functions break no cycle
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rollouts")):
                continue
            submodules = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            for name in submodules or [node.module]:  # `from rollouts import events` imports events
                target = ROOT.joinpath(*name.split("."))
                target = target / "__init__.py" if target.is_dir() else target.with_suffix(".py")
                there = _row_of(target, rows)
                if here is not None and there is not None and there > here:
                    upward.append(f"{m.relative_to(ROOT)} imports {name}")
    assert upward == [], "a row imports a row below it: move the import or the row"


def test_layers_the_queue_is_the_only_writer_of_task_rows() -> None:
    """Issue 32 item 2: task rows were also written by the worker (putting its tasks back), the
    local worker pool (four statements) and their SQL drifted apart; every statement that
    inserts, updates or deletes `tasks` lives in service/queue.py."""
    writes = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+tasks\b", re.IGNORECASE)
    offenders = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "service" / "queue.py"
        for text in [path.read_text(encoding="utf-8")]
        for m in writes.finditer(text)
    ]
    assert offenders == []


def _dynamic_imports(path: Path) -> list[str]:
    """Modules named by a string to `importlib.import_module` / `__import__` in `path`."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
    return names


def test_layers_no_eval_module_imports_the_service_even_inside_a_function() -> None:
    """Issue 32 item 1: evaluate(workers=N) imported rollouts.service.eval_workers inside a
    function (the eval layer reaching up into the service); the worker pool is now an executor
    the caller hands to evaluate()."""
    offenders = [
        f"{_module_name(path)} imports {name}"
        for path in (PACKAGE / "eval").rglob("*.py")
        for name in _imports(path) + _dynamic_imports(path)
        if name == "rollouts.service" or name.startswith("rollouts.service.")
    ]
    assert offenders == []


def test_layers_providers_import_nothing_from_training() -> None:
    """Issue 32 item 5: providers/ imported training/weights.py (hash-pinned packaged files),
    which now lives under local_model/; the providers sit below training and never reach up."""
    offenders = [
        f"{_module_name(path)} imports {name}"
        for path in (PACKAGE / "providers").rglob("*.py")
        for name in _imports(path) + _dynamic_imports(path)
        if name == "rollouts.training" or name.startswith("rollouts.training.")
    ]
    assert offenders == []


def test_no_function_in_the_library_is_over_120_lines() -> None:
    """Issue 32: one job per function; the viewer's create_app and the UI's create_ui were
    closures of 300+ lines (split into module-level handlers), bash's run_command grew to 152."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 120
    ]
    assert long == []
