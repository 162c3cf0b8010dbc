"""A complete custom Environment in under 40 lines: a to-do list the model manages.

Run it: `python examples/custom_environment.py` (a scripted model plays the agent; swap in a real
Endpoint to use a real model). Explained in docs/environments.md.
"""

# --- environment: begin ---
from typing import Annotated, Any

from rollouts import StopReason, ToolEnvironment, ToolError, ToolResult, tool


class TodoEnvironment(ToolEnvironment):
    """A to-do list. Its whole state is `items`, so that is what serialize() returns."""

    def __init__(self, items: list[dict[str, Any]] | None = None) -> None:
        self.items = [dict(i) for i in items or []]

    @tool
    async def add_item(self, title: Annotated[str, "What needs doing."]) -> str:
        """Add an item to the to-do list."""
        self.items.append({"title": title, "done": False})
        return f"Added item {len(self.items)}: {title}"

    @tool
    async def finish_item(self, number: Annotated[int, "The item's number, from 1."]) -> str | ToolResult:
        """Mark an item as done. The task is complete when every item is done."""
        if not 1 <= number <= len(self.items):
            raise ToolError(f"There is no item {number}; the list has {len(self.items)} items.")
        self.items[number - 1]["done"] = True
        if all(i["done"] for i in self.items):
            return ToolResult("", "All items done.", stop_reason=StopReason.TASK_COMPLETED)
        return f"Item {number} done."

    async def serialize(self) -> dict[str, Any]:
        return {"items": [dict(i) for i in self.items]}

    @classmethod
    async def deserialize(cls, data: dict[str, Any]) -> "TodoEnvironment":
        return cls(data["items"])


# --- environment: end ---


async def main() -> list[dict[str, Any]]:
    """Let a scripted model plan two items and finish them; returns the final list."""
    from rollouts import Actor, AgentState, Message, RunConfig, ScriptedModel, Trajectory, run_agent, tool_call

    model = ScriptedModel(
        [
            tool_call("add_item", title="write the docs"),
            tool_call("add_item", title="test the example"),
            tool_call("finish_item", number=3),  # a mistake: the model sees the error and goes on
            tool_call("finish_item", number=1),
            tool_call("finish_item", number=2),
        ]
    )
    state = AgentState(
        Actor(Trajectory((Message("user", "Plan and do two things."),)), model.endpoint), TodoEnvironment()
    )
    states = await run_agent(state, RunConfig(max_turns=10))
    for m in states[-1].messages:
        if m.role == "tool":
            print(f"tool: {m.text}")
    print(f"stopped: {states[-1].stop}")
    env = states[-1].environment
    assert isinstance(env, TodoEnvironment)
    return env.items


if __name__ == "__main__":
    import trio

    print(trio.run(main))
