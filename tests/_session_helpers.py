"""A calculator whose `multiply` blocks, importable by name from any process (sessions record
environments as `module:Class`), for the resume tests."""

from __future__ import annotations

import os
from typing import Any, ClassVar

import trio

from rollouts import AgentState, CalculatorEnvironment, RunConfig, ToolCall, ToolResult

BLOCK_ENV = "ROLLOUTS_TEST_BLOCK_MULTIPLY"


class BlockingCalculator(CalculatorEnvironment):
    """`multiply` waits for `release` (set per test); with $ROLLOUTS_TEST_BLOCK_MULTIPLY=1 it
    prints `blocked SESSION_ID` and waits forever (for a parent process to kill it)."""

    release: ClassVar[trio.Event | None] = None
    entered: ClassVar[trio.Event | None] = None

    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        if tool_call.name == "multiply":
            if os.environ.get(BLOCK_ENV) == "1":
                print(f"blocked {state.session_id}", flush=True)
                await trio.sleep_forever()
            if type(self).entered is not None:
                type(self).entered.set()  # type: ignore[union-attr]
            if type(self).release is not None:
                await type(self).release.wait()  # type: ignore[union-attr]
        return await super().exec_tool(tool_call, state, run_config, cancel_scope)
