"""CalculatorEnvironment and BasicEnvironment: tools, errors, exact serialize round trips."""

from __future__ import annotations

import json

from rollouts import BasicEnvironment, CalculatorEnvironment, Environment, RunConfig, StopReason, ToolCall
from rollouts.environments.base import clone_environment, environment_type_name, load_environment_class


async def _call(env: CalculatorEnvironment, name: str, **args: object):  # type: ignore[no-untyped-def]
    return await env.exec_tool(ToolCall("c", name, args), None, RunConfig())  # type: ignore[arg-type]


async def test_accumulator_operations_and_division_by_zero() -> None:
    env = CalculatorEnvironment()
    assert (await _call(env, "add", value=10)).content == "Added 10 to 0. Current value: 10"
    assert (await _call(env, "subtract", value=4)).content == "Subtracted 4 from 10. Current value: 6"
    assert (await _call(env, "multiply", value=2.5)).content == "Multiplied 6 by 2.5. Current value: 15"
    bad = await _call(env, "divide", value=0)
    assert bad.is_error and env.current_value == 15
    assert (await _call(env, "divide", value=4)).content == "Divided 15 by 4. Current value: 3.75"
    done = await _call(env, "complete_task", final_result="3.75")
    assert done.stop_reason == StopReason.TASK_COMPLETED
    assert env.get_status_info() == {"value": "3.75"}


async def test_serialize_round_trips_exactly_and_clones_are_independent() -> None:
    env = CalculatorEnvironment(1 / 3)
    data = await env.serialize()
    assert json.loads(json.dumps(data)) == data
    back = await CalculatorEnvironment.deserialize(json.loads(json.dumps(data)))
    assert back.current_value == env.current_value  # bit-exact float
    clone = await clone_environment(env)
    await _call(clone, "add", value=1)  # type: ignore[arg-type]
    assert env.current_value == 1 / 3
    basic = await BasicEnvironment.deserialize(await BasicEnvironment().serialize())
    assert basic.get_tools() == ()


def test_protocol_and_type_names() -> None:
    assert isinstance(CalculatorEnvironment(), Environment)
    assert isinstance(BasicEnvironment(), Environment)
    name = environment_type_name(CalculatorEnvironment())
    assert name == "rollouts.environments.calculator:CalculatorEnvironment"
    assert load_environment_class(name) is CalculatorEnvironment
