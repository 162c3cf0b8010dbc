"""BFCL (the Berkeley Function-Calling Leaderboard), read offline from the `bfcl-eval` wheel.

Each row offers the model a few functions and asks one question; the model answers with tool
calls through the provider's real tool-call path. The calls are scored by *AST match* against
BFCL's possible answers, following the leaderboard's checker:

* the number of calls equals the number expected (one for `simple` and `multiple`, several for
  `parallel` and `parallel_multiple`, where the order of the calls does not matter);
* each call names the expected function, gives every required parameter, no parameter the
  function does not have, and for each parameter a value in the possible-answer list (an
  optional parameter may be left out when `""` is among its possible answers);
* values compare by type-aware equality: an integer is accepted where a float is expected;
  strings compare after lower-casing and dropping spaces and the punctuation `,./-_*^`; lists
  element by element; dicts key by key.

Function names with dots (`math.factorial`) are offered to the model with `_` instead of `.`,
as the leaderboard does for APIs that restrict tool names, and mapped back for scoring.

Install the data with `pip install --no-deps bfcl-eval` (its runtime dependencies are not needed
to read the JSON).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rollouts.dtypes import AgentState, Message, StopReason, Tool, ToolCall, ToolResult
from rollouts.environments.base import EnvironmentBase
from rollouts.errors import ConfigurationError
from rollouts.eval.sample import Metric, Sample, Score

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

CATEGORIES = ("simple", "multiple", "parallel", "parallel_multiple")
_FILES = {
    "simple": "BFCL_v4_simple_python.json",
    "multiple": "BFCL_v4_multiple.json",
    "parallel": "BFCL_v4_parallel.json",
    "parallel_multiple": "BFCL_v4_parallel_multiple.json",
}
INSTALL_HINT = "pip install --no-deps bfcl-eval"

SYSTEM_PROMPT = (
    "You are an expert in composing function calls. You are given a question and a set of possible "
    "functions. Answer by calling the function(s) that fulfil the request, with the argument values "
    "taken from the question. If several calls are needed, make all of them."
)


def _data_dir() -> Path:
    try:
        dist = importlib.metadata.distribution("bfcl-eval")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigurationError(f"the BFCL data is not installed: {INSTALL_HINT}") from None
    for f in dist.files or ():
        if f.name == _FILES["simple"] and f.parent.name == "data":
            return Path(str(dist.locate_file(f.parent)))
    raise ConfigurationError(f"the installed bfcl-eval has no data files; reinstall it: {INSTALL_HINT}")


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def load_bfcl(category: str = "simple") -> list[dict[str, Any]]:
    """The rows of one BFCL category (`simple`, `multiple`, `parallel`, `parallel_multiple`):
    `{id, question, functions, ground_truth, category}`, in the leaderboard's order."""
    if category not in _FILES:
        raise ConfigurationError(f"unknown BFCL category {category!r}; choose one of {', '.join(CATEGORIES)}")
    data = _data_dir()
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(data / "possible_answer" / _FILES[category])}
    rows = []
    for entry in _read_jsonl(data / _FILES[category]):
        turns = entry["question"]
        assert len(turns) == 1, f"single-turn BFCL categories only (row {entry['id']})"
        rows.append(
            {
                "id": entry["id"],
                "category": category,
                "question": turns[0],
                "functions": entry["function"],
                "ground_truth": answers[entry["id"]],
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------
# Offering the functions as tools
# ----------------------------------------------------------------------------------------------

_TYPES = {"dict": "object", "float": "number", "tuple": "array", "int": "integer", "bool": "boolean"}


def tool_name(function_name: str) -> str:
    """The name a BFCL function is offered under (`.` is not allowed in most APIs' tool names)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", function_name)


def json_schema(bfcl_schema: Mapping[str, Any]) -> dict[str, Any]:
    """BFCL's parameter schema (Python type names: dict, float, tuple, any) as JSON Schema."""
    out: dict[str, Any] = {}
    for key, value in bfcl_schema.items():
        if key == "type":
            if value == "any":
                continue
            out["type"] = _TYPES.get(value, value)
        elif key == "properties" and isinstance(value, Mapping):
            out["properties"] = {name: json_schema(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, Mapping):
            out["items"] = json_schema(value)
        elif key == "optional":
            continue
        else:
            out[key] = value
    return out


def function_tools(functions: Sequence[Mapping[str, Any]]) -> tuple[Tool, ...]:
    """The BFCL functions of a row as Tools."""
    return tuple(
        Tool(tool_name(f["name"]), f.get("description", ""), json_schema(f.get("parameters", {"type": "dict"})))
        for f in functions
    )


class BFCLEnvironment(EnvironmentBase):
    """Offers one BFCL row's functions. A call is recorded, not executed: the run ends once the
    model's calls are in (the leaderboard scores the calls, not what they return)."""

    def __init__(self, functions: Sequence[Mapping[str, Any]]) -> None:
        self.functions = [dict(f) for f in functions]
        self._tools = function_tools(self.functions)

    @classmethod
    def for_row(cls, row: Mapping[str, Any]) -> BFCLEnvironment:
        return cls(row["functions"])

    def get_tools(self) -> Sequence[Tool]:
        return self._tools

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        return ToolResult(tool_call.id, "Call recorded.", stop_reason=StopReason.TASK_COMPLETED)

    async def serialize(self) -> dict[str, Any]:
        return {"functions": self.functions}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        return cls(data["functions"])


def prepare_messages(row: Mapping[str, Any]) -> list[Message]:
    """The system prompt, then the row's question messages."""
    out = [Message("system", SYSTEM_PROMPT)]
    out.extend(Message(m["role"], m["content"]) for m in row["question"])
    return out


# ----------------------------------------------------------------------------------------------
# AST match
# ----------------------------------------------------------------------------------------------

_STRIP = re.compile(r"[ ,./\-_*^]")


def _norm_str(s: str) -> str:
    return _STRIP.sub("", s).lower()


def _value_matches(value: Any, expected: Any) -> bool:
    if isinstance(expected, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(expected, bool) and value == expected
    if isinstance(expected, float) and isinstance(value, int | float):
        return float(value) == expected
    if isinstance(expected, int):
        return isinstance(value, int) and value == expected
    if isinstance(expected, str) and isinstance(value, str):
        return _norm_str(value) == _norm_str(expected)
    if isinstance(expected, list) and isinstance(value, list | tuple):
        return len(value) == len(expected) and all(_value_matches(v, e) for v, e in zip(value, expected, strict=True))
    if isinstance(expected, dict) and isinstance(value, Mapping):
        return set(value) == set(expected) and all(_value_matches(value[k], expected[k]) for k in expected)
    return bool(value == expected)


def _param_ok(value: Any, possible: Sequence[Any]) -> bool:
    return any(p != "" and _value_matches(value, p) for p in possible)


def check_call(
    name: str,
    arguments: Mapping[str, Any],
    expected: Mapping[str, Mapping[str, Sequence[Any]]],
    function: Mapping[str, Any],
) -> str | None:
    """None when the call `name(**arguments)` matches the expected call, else why not."""
    ((expected_name, params),) = expected.items()
    if name != tool_name(expected_name):
        return f"called {name}, expected {tool_name(expected_name)}"
    properties = function.get("parameters", {}).get("properties", {})
    required = function.get("parameters", {}).get("required", [])
    for param in arguments:
        if param not in properties:
            return f"{name}: unexpected parameter {param!r}"
    for param in required:
        if param not in arguments:
            return f"{name}: missing required parameter {param!r}"
    for param, possible in params.items():
        if param not in arguments:
            if "" not in possible:
                return f"{name}: missing parameter {param!r}"
            continue
        if not _param_ok(arguments[param], possible):
            allowed = [p for p in possible if p != ""]
            return f"{name}: {param}={arguments[param]!r}, expected one of {allowed!r}"
    return None


def check_calls(calls: Sequence[tuple[str, Mapping[str, Any]]], row: Mapping[str, Any]) -> str | None:
    """None when the calls match the row's possible answer (in any order), else why not."""
    expected: list[Mapping[str, Any]] = list(row["ground_truth"])
    if len(calls) != len(expected):
        return f"made {len(calls)} call(s), expected {len(expected)}"
    functions = {tool_name(f["name"]): f for f in row["functions"]}
    # Which expected call each call could be (the order of calls does not matter), then a
    # perfect matching between the two sides (Kuhn's augmenting paths; a few calls at most).
    fits: list[list[int]] = []
    for name, args in calls:
        function = functions.get(name)
        if function is None:
            return f"called unknown function {name}"
        reasons = [check_call(name, args, e, function) for e in expected]
        fits.append([i for i, r in enumerate(reasons) if r is None])
        if not fits[-1]:
            relevant = [r for r in reasons if r is not None and not r.startswith("called ")]
            return relevant[0] if len(relevant) == 1 else f"{name}({json.dumps(dict(args))}) matches no expected call"
    owner: dict[int, int] = {}

    def assign(call: int, seen: set[int]) -> bool:
        for i in fits[call]:
            if i not in seen:
                seen.add(i)
                if i not in owner or assign(owner[i], seen):
                    owner[i] = call
                    return True
        return False

    for call in range(len(calls)):
        if not assign(call, set()):
            name, args = calls[call]
            return f"{name}({json.dumps(dict(args))}) repeats a call another one already answers"
    return None


def sample_calls(sample: Sample) -> list[tuple[str, Mapping[str, Any]]]:
    """The tool calls of the sample's first assistant message (BFCL's single-turn answer)."""
    if sample.trajectory is None:
        return []
    for m in sample.trajectory.messages:
        if m.role == "assistant":
            return [(c.name, c.arguments) for c in m.get_tool_calls()]
    return []


def ast_match(sample: Sample) -> Score:
    """Score one BFCL sample: metric `ast_match` (1.0 or 0.0, weight 1) with the reason as feedback."""
    calls = sample_calls(sample)
    reason = check_calls(calls, sample.input) if sample.input else "no input"
    feedback = "the calls match the expected answer" if reason is None else reason
    return Score((Metric("ast_match", 1.0 if reason is None else 0.0, weight=1.0, metadata={"feedback": feedback}),))
