"""Authoring: @tool schemas, check_environment catching broken environments, the documented example."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from _env_helpers import run, tool_messages

from rollouts import EnvironmentBase, RunConfig, StopReason, Tool, ToolCall, ToolResult
from rollouts.environments import ToolEnvironment, ToolError, check_environment, tool
from rollouts.environments.testing import EnvironmentCheckError
from rollouts.providers.scripted import tool_call

ROOT = Path(__file__).resolve().parent.parent


def _load_example() -> Any:
    path = ROOT / "examples" / "custom_environment.py"
    spec = importlib.util.spec_from_file_location("custom_environment", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["custom_environment"] = module  # deserialize finds the class by module:name
    spec.loader.exec_module(module)
    return module


class _Kitchen(ToolEnvironment):
    def __init__(self, log: list[str] | None = None) -> None:
        self.log = list(log or [])

    @tool
    async def cook(
        self,
        dish: str,
        servings: int,
        spicy: bool = False,
        temperature: float | None = None,
        style: Literal["fried", "boiled"] = "boiled",
        extras: list[str] | None = None,
        note: Annotated[str, "Anything else."] = "",
    ) -> str:
        """Cook a dish.

        Longer explanation the model also sees.

        Args:
            dish: The dish's name.
            servings: How many people
                will eat.
            spicy: Add chili.

        Returns:
            nothing the schema cares about.
        """
        self.log.append(f"{dish}x{servings}")
        return f"cooked {dish} for {servings} ({style}, extras={extras or []})"

    @tool(name="serve_now", description="Serve everything cooked so far.")
    async def serve(self) -> ToolResult:
        if not self.log:
            raise ToolError("Nothing has been cooked yet; call cook first.")
        return ToolResult("ignored", "served " + ", ".join(self.log), stop_reason=StopReason.TASK_COMPLETED)

    async def serialize(self) -> dict[str, Any]:
        return {"log": list(self.log)}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> _Kitchen:
        return cls(data["log"])


def test_tool_schema_comes_from_signature_and_docstring() -> None:
    tools = {t.name: t for t in _Kitchen().get_tools()}
    assert list(tools) == ["cook", "serve_now"]
    cook = tools["cook"]
    assert cook.description == "Cook a dish.\n\nLonger explanation the model also sees."
    assert dict(cook.parameters) == {
        "type": "object",
        "properties": {
            "dish": {"type": "string", "description": "The dish's name."},
            "servings": {"type": "integer", "description": "How many people will eat."},
            "spicy": {"type": "boolean", "description": "Add chili.", "default": False},
            "temperature": {"type": "number"},
            "style": {"enum": ["fried", "boiled"], "default": "boiled"},
            "extras": {"type": "array", "items": {"type": "string"}},
            "note": {"type": "string", "description": "Anything else.", "default": ""},
        },
        "required": ["dish", "servings"],
        "additionalProperties": False,
    }
    assert tools["serve_now"].description == "Serve everything cooked so far."
    assert dict(tools["serve_now"].parameters)["properties"] == {}


def test_tool_definition_mistakes_fail_loudly() -> None:
    with pytest.raises(AssertionError, match="async def"):

        class _A(ToolEnvironment):
            @tool
            def sync_tool(self, x: int) -> str:  # type: ignore[type-var]
                """Not async."""
                return ""

    with pytest.raises(AssertionError, match="type annotation"):

        class _B(ToolEnvironment):
            @tool
            async def untyped(self, x) -> str:  # type: ignore[no-untyped-def]
                """No annotation."""
                return ""

    with pytest.raises(AssertionError, match="needs a docstring"):

        class _C(ToolEnvironment):
            @tool
            async def undocumented(self, x: int) -> str:
                return ""

    with pytest.raises(TypeError, match="cannot turn the annotation"):

        class _D(ToolEnvironment):
            @tool
            async def odd(self, x: complex) -> str:
                """Complex numbers are not JSON."""
                return ""


async def test_tool_errors_and_results_reach_the_model_through_the_loop() -> None:
    states = await run(
        _Kitchen(),
        [
            tool_call("serve_now"),
            tool_call("cook", dish="soup", servings="two"),
            tool_call("cook", dish="soup", servings=2, style="fried"),
            tool_call("serve_now"),
        ],
    )
    final = states[-1]
    msgs = tool_messages(final)
    assert msgs[0].text == "Nothing has been cooked yet; call cook first." and msgs[0].details["is_error"]  # type: ignore[index]
    assert "Invalid arguments for 'cook'" in msgs[1].text and "servings" in msgs[1].text
    assert msgs[2].text == "cooked soup for 2 (fried, extras=[])"
    assert msgs[3].text == "served soupx2"
    assert final.stop == StopReason.TASK_COMPLETED
    await check_environment(_Kitchen(), calls=[ToolCall("1", "cook", {"dish": "tea", "servings": 1})])


# ---- check_environment finds what is wrong ------------------------------------------------------------


class _Tuples(EnvironmentBase):
    async def serialize(self) -> dict[str, Any]:
        return {"items": (1, 2)}


class _Forgetful(EnvironmentBase):
    def __init__(self, n: int = 0) -> None:
        self.n = n

    async def serialize(self) -> dict[str, Any]:
        return {"n": self.n}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> _Forgetful:
        return cls()  # forgets n


class _BadTools(EnvironmentBase):
    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def get_tools(self) -> tuple[Tool, ...]:
        return tuple(Tool.from_dict(t) for t in self.tools)

    async def serialize(self) -> dict[str, Any]:
        return {"tools": self.tools}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> _BadTools:
        return cls(data["tools"])


class _WrongId(_Kitchen):
    async def exec_tool(
        self, tool_call: ToolCall, state: Any, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        return ToolResult("someone-else", "hi")


_OBJ = {"type": "object", "properties": {}}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (_Tuples(), "changes through JSON"),
        (_Forgetful(3), "differs from serialize"),
        (_BadTools([{"name": "a b", "description": "x", "parameters": _OBJ}]), "must match"),
        (_BadTools([{"name": "a", "description": "x", "parameters": _OBJ}] * 2), "two tools are named 'a'"),
        (_BadTools([{"name": "a", "description": " ", "parameters": _OBJ}]), "no description"),
        (_BadTools([{"name": "a", "description": "x", "parameters": {"type": "array"}}]), "type 'object'"),
        (
            _BadTools(
                [{"name": "a", "description": "x", "parameters": {"type": "object", "properties": {"p": {"type": 5}}}}]
            ),
            "not a valid JSON Schema",
        ),
        (
            _BadTools([{"name": "a", "description": "x", "parameters": {"type": "object", "required": ["q"]}}]),
            "required parameter 'q'",
        ),
        (object(), "does not satisfy the Environment protocol"),
    ],
)
async def test_check_environment_reports_broken_environments(env: Any, message: str) -> None:
    with pytest.raises(EnvironmentCheckError, match=message):
        await check_environment(env)


async def test_check_environment_runs_calls_on_a_clone() -> None:
    with pytest.raises(EnvironmentCheckError, match="answered call id 'someone-else'"):
        await check_environment(_WrongId(), calls=[ToolCall("1", "serve_now", {})])
    with pytest.raises(EnvironmentCheckError, match="do not fit its schema"):
        await check_environment(_Kitchen(), calls=[ToolCall("1", "cook", {"dish": 1})])
    original = _Kitchen()
    after = await check_environment(original, calls=[ToolCall("1", "cook", {"dish": "rice", "servings": 4})])
    assert isinstance(after, _Kitchen) and after.log == ["ricex4"] and original.log == []


# ---- the documented example ---------------------------------------------------------------------------


def test_docs_show_the_example_verbatim_in_under_40_lines() -> None:
    src = (ROOT / "examples" / "custom_environment.py").read_text()
    block = src.split("# --- environment: begin ---\n")[1].split("# --- environment: end ---")[0].rstrip() + "\n"
    assert len(block.splitlines()) < 40
    doc = (ROOT / "docs" / "environments.md").read_text()
    assert f"```python\n{block}```" in doc
    assert "docs/environments.md" in (ROOT / "README.md").read_text()


async def test_example_environment_runs_round_trips_and_passes_the_check() -> None:
    example = _load_example()
    items = await example.main()
    assert items == [{"title": "write the docs", "done": True}, {"title": "test the example", "done": True}]
    env = example.TodoEnvironment()
    after = await check_environment(env, calls=[ToolCall("1", "add_item", {"title": "x"})])
    assert after.items == [{"title": "x", "done": False}]
    # Mid-run round trip through JSON, then the run continues on the restored environment.
    first = await run(env, [tool_call("add_item", title="a"), tool_call("add_item", title="b"), "later"])
    mid = first[-1]
    data = json.loads(json.dumps(await mid.environment.serialize()))  # type: ignore[union-attr]
    restored = await example.TodoEnvironment.deserialize(data)
    second = await run(restored, [tool_call("finish_item", number=2), tool_call("finish_item", number=1)], state=mid)
    assert second[-1].stop == StopReason.TASK_COMPLETED
    assert [m.text for m in tool_messages(second[-1])][-2:] == ["Item 2 done.", "All items done."]


def _doc_blocks() -> list[str]:
    import re

    return re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "environments.md").read_text(), re.S)


def test_docs_run_with_a_model_snippet_runs_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The guide's "run it with a model" block, with its Endpoint answered by a scripted model."""
    import rollouts
    from rollouts import ScriptedModel

    example = _load_example()
    block = next(b for b in _doc_blocks() if "trio.run(main)" in b)
    model = ScriptedModel([tool_call("add_item", title="one"), tool_call("finish_item", number=1)])
    asked: list[dict[str, Any]] = []

    def endpoint(**kw: Any) -> Any:
        asked.append(kw)
        return model.endpoint

    monkeypatch.setattr(rollouts, "Endpoint", endpoint)
    exec(compile(block, "docs/environments.md", "exec"), {"TodoEnvironment": example.TodoEnvironment})
    assert asked == [{"provider": "anthropic", "model": "claude-sonnet-4-5"}]
    assert capsys.readouterr().out.strip() == "[{'title': 'one', 'done': True}]"


async def test_docs_check_environment_snippet_runs_as_written() -> None:
    example = _load_example()
    block = next(b for b in _doc_blocks() if "check_environment" in b)
    namespace: dict[str, Any] = {"TodoEnvironment": example.TodoEnvironment}
    exec(compile(block, "docs/environments.md", "exec"), namespace)
    await namespace["test_todo"]()
