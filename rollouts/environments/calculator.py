"""CalculatorEnvironment: an accumulator the model drives with add/subtract/multiply/divide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from rollouts.dtypes import AgentState, StopReason, Tool, ToolCall, ToolResult
from rollouts.environments.base import EnvironmentBase

if TYPE_CHECKING:
    from typing import Self

    from rollouts.run_config import RunConfig

_VALUE_SCHEMA = {
    "type": "object",
    "properties": {"value": {"type": "number", "description": "The operand."}},
    "required": ["value"],
    "additionalProperties": False,
}

_TOOLS = (
    Tool("add", "Add a number to the current value.", _VALUE_SCHEMA),
    Tool("subtract", "Subtract a number from the current value.", _VALUE_SCHEMA),
    Tool("multiply", "Multiply the current value by a number.", _VALUE_SCHEMA),
    Tool("divide", "Divide the current value by a number.", _VALUE_SCHEMA),
    Tool(
        "complete_task",
        "Finish: report the final answer. Call this once the current value is the answer.",
        {
            "type": "object",
            "properties": {"final_result": {"type": "string", "description": "The final answer."}},
            "required": ["final_result"],
        },
    ),
)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


class CalculatorEnvironment(EnvironmentBase):
    """Holds `current_value` (starts at 0). Division by zero is a tool error, not a crash."""

    def __init__(self, current_value: float = 0.0) -> None:
        self.current_value = float(current_value)

    def get_tools(self) -> Sequence[Tool]:
        return _TOOLS

    async def exec_tool(
        self,
        tool_call: ToolCall,
        state: AgentState,
        run_config: RunConfig,
        cancel_scope: trio.CancelScope | None = None,
    ) -> ToolResult:
        name, args = tool_call.name, tool_call.arguments
        if name == "complete_task":
            return ToolResult(
                tool_call.id,
                f"Task completed. Final result: {args['final_result']}",
                stop_reason=StopReason.TASK_COMPLETED,
            )
        value = float(args["value"])
        before = self.current_value
        if name == "add":
            self.current_value = before + value
            verb = f"Added {_fmt(value)} to {_fmt(before)}"
        elif name == "subtract":
            self.current_value = before - value
            verb = f"Subtracted {_fmt(value)} from {_fmt(before)}"
        elif name == "multiply":
            self.current_value = before * value
            verb = f"Multiplied {_fmt(before)} by {_fmt(value)}"
        elif name == "divide":
            if value == 0:
                return ToolResult(tool_call.id, "Cannot divide by zero; the value is unchanged.", is_error=True)
            self.current_value = before / value
            verb = f"Divided {_fmt(before)} by {_fmt(value)}"
        else:
            return ToolResult(tool_call.id, f"unknown tool {name!r}", is_error=True)
        return ToolResult(tool_call.id, f"{verb}. Current value: {_fmt(self.current_value)}")

    def get_status_info(self) -> dict[str, str]:
        return {"value": _fmt(self.current_value)}

    async def serialize(self) -> dict[str, Any]:
        return {"current_value": self.current_value}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> Self:
        return cls(current_value=data["current_value"])
