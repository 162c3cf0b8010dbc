"""evaluate() closes the environments its factory made (worktrees, clients), whatever happens."""

from __future__ import annotations

from typing import Any, ClassVar

from rollouts import CalculatorEnvironment, ScriptedModel, tool_call
from rollouts.eval.run import EvalConfig, evaluate


class _Closable(CalculatorEnvironment):
    closed: ClassVar[list[float]] = []

    async def aclose(self) -> None:
        type(self).closed.append(self.current_value)


async def test_factory_made_environments_are_closed_after_each_sample() -> None:
    _Closable.closed = []

    def reply(req: Any) -> Any:
        if "boom" in req.last_user_text:
            raise RuntimeError("model exploded")
        n = sum(1 for m in req.messages if m.role == "tool")
        return tool_call("add", value=1) if n == 0 else "done"

    model = ScriptedModel(reply)
    rows = [{"question": "one"}, {"question": "boom"}, {"question": "three"}]
    report = await evaluate(rows, EvalConfig(endpoint=model.endpoint, environment_factory=_Closable, max_concurrent=2))
    assert [s.status for s in report.samples] == ["completed", "failed", "completed"]
    assert sorted(_Closable.closed) == [0.0, 1.0, 1.0]  # every sample's environment, including the failed one
