"""Checks for environment authors: `await check_environment(env)` in your tests.

    async def test_my_env():
        await check_environment(MyEnvironment(), calls=[ToolCall("1", "add_note", {"text": "hi"})])

It asserts what the agent loop relies on and fails with a message saying what to fix:
* the object satisfies the `Environment` protocol and `deserialize` is a classmethod;
* tools have unique names (letters, digits, `_`, `-`; at most 64), a description, and
  parameters that are a valid JSON Schema of type "object";
* `serialize()` is JSON-safe and survives a JSON round trip unchanged (use lists, not tuples);
* `deserialize(serialize(env))` serializes to the same data and offers the same tools;
* given `calls`, each one runs on a clone (made the way the loop makes it), returns a
  `ToolResult` answering that call, and the environment still round-trips afterwards.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Sequence
from typing import Any

from rollouts._schema import argument_errors
from rollouts.dtypes import Actor, AgentState, Endpoint, ToolCall, ToolResult, Trajectory
from rollouts.environments.base import Environment
from rollouts.run_config import RunConfig

__all__ = ["check_environment", "check_tools"]

_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class EnvironmentCheckError(AssertionError):
    """An environment broke the protocol's contract; the message says how to fix it."""


def _fail(env: object, what: str) -> EnvironmentCheckError:
    return EnvironmentCheckError(f"{type(env).__name__}: {what}")


def check_tools(env: Environment) -> None:
    """Tool names unique and well formed, descriptions present, parameters valid JSON Schema."""
    import jsonschema  # imported here: `import rollouts` stays fast

    seen: set[str] = set()
    for t in env.get_tools():
        if not _NAME_RE.match(t.name):
            raise _fail(env, f"tool name {t.name!r} must match {_NAME_RE.pattern} (providers reject other names)")
        if t.name in seen:
            raise _fail(env, f"two tools are named {t.name!r}; tool names must be unique")
        seen.add(t.name)
        if not t.description or not t.description.strip():
            raise _fail(env, f"tool {t.name!r} has no description; the model needs one to know when to call it")
        schema = dict(t.parameters)
        if schema.get("type") != "object":
            raise _fail(env, f"tool {t.name!r}: parameters must be a JSON Schema with type 'object', got {schema!r}")
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as e:
            raise _fail(env, f"tool {t.name!r}: parameters are not a valid JSON Schema: {e.message}") from None
        try:
            json.dumps(schema)
        except (TypeError, ValueError) as e:
            raise _fail(env, f"tool {t.name!r}: parameters are not JSON-serializable: {e}") from None
        for req in schema.get("required", ()):
            if req not in schema.get("properties", {}):
                raise _fail(env, f"tool {t.name!r}: required parameter {req!r} is not in properties")


async def _round_trip(env: Environment) -> tuple[dict[str, Any], Environment]:
    data = await env.serialize()
    if not isinstance(data, dict):
        raise _fail(env, f"serialize() must return a dict, got {type(data).__name__}")
    try:
        text = json.dumps(data, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise _fail(env, f"serialize() output is not JSON-safe ({e}); use str/int/float/bool/None/list/dict") from None
    if json.loads(text) != data:
        raise _fail(env, "serialize() output changes through JSON (tuples or non-string keys?); use lists and str keys")
    clone = await type(env).deserialize(json.loads(text))
    if type(clone) is not type(env):
        raise _fail(env, f"deserialize() returned a {type(clone).__name__}, expected {type(env).__name__}")
    again = await clone.serialize()
    if again != data:
        diff = sorted(k for k in set(data) | set(again) if data.get(k) != again.get(k))
        raise _fail(env, f"serialize(deserialize(serialize(env))) differs from serialize(env) in keys {diff}")
    if [t.to_dict() for t in clone.get_tools()] != [t.to_dict() for t in env.get_tools()]:
        raise _fail(env, "the deserialized environment offers different tools; serialize what get_tools() depends on")
    return data, clone


async def check_environment(
    env: Environment,
    *,
    calls: Sequence[ToolCall] = (),
    run_config: RunConfig | None = None,
) -> Environment:
    """Check `env` against the Environment contract (see the module docstring). Returns the
    environment after running `calls` (a clone of `env`; `env` itself is not changed)."""
    if not isinstance(env, Environment):
        missing = [
            name
            for name in ("get_tools", "exec_tool", "requires_confirmation", "serialize", "deserialize")
            if not hasattr(env, name)
        ]
        raise _fail(env, f"does not satisfy the Environment protocol (missing {missing}); subclass EnvironmentBase")
    raw = inspect.getattr_static(type(env), "deserialize", None)
    if not isinstance(raw, classmethod):
        raise _fail(env, "deserialize must be a @classmethod (async) that builds a new environment from data")
    check_tools(env)
    _, current = await _round_trip(env)
    rc = run_config or RunConfig()
    state = AgentState(Actor(Trajectory(), Endpoint("scripted", "check-environment")), current)
    tools = {t.name: t for t in current.get_tools()}
    for call in calls:
        tool = tools.get(call.name)
        if tool is None:
            raise _fail(env, f"check_environment was given a call to {call.name!r}, which is not one of its tools")
        problem = argument_errors(tool.parameters, call.arguments)
        if problem is not None:
            raise _fail(env, f"the arguments given for {call.name!r} do not fit its schema: {problem}")
        _, current = await _round_trip(current)
        result = await current.exec_tool(call, state, rc)
        if not isinstance(result, ToolResult):
            raise _fail(env, f"exec_tool({call.name!r}) returned {type(result).__name__}, expected a ToolResult")
        if result.tool_call_id != call.id:
            raise _fail(env, f"exec_tool({call.name!r}) answered call id {result.tool_call_id!r}, expected {call.id!r}")
        if not isinstance(result.content, str):
            raise _fail(env, f"exec_tool({call.name!r}) returned non-text content {type(result.content).__name__}")
        check_tools(current)
    await _round_trip(current)
    return current
