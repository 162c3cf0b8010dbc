"""The agent loop on scripted models: exact events, trajectories, stops, errors, cancellation."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import trio
import trio.lowlevel

from rollouts import (
    Actor,
    AgentState,
    CalculatorEnvironment,
    EnvironmentBase,
    Message,
    RunConfig,
    ScriptedModel,
    ScriptedReply,
    ScriptedToolCall,
    StopReason,
    TextContent,
    Tool,
    ToolCall,
    ToolCallContent,
    ToolResult,
    Trajectory,
    Usage,
    compose_handlers,
    confirm_tool_interactive,
    handle_stop_cost_budget,
    handle_stop_max_turns,
    handle_stop_on_empty_message,
    handle_stop_token_budget,
    handle_tool_error_stop,
    inject_tool_reminder,
    inject_turn_warning,
    run_agent,
    tool_call,
)
from rollouts.errors import AuthenticationError, ContextTooLongError, ProviderError, UnknownProviderError
from rollouts.events import (
    LLMCallStart,
    StreamDone,
    StreamEvent,
    StreamStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    ToolCallStart,
    ToolExecutionStart,
    ToolResultReceived,
)
from rollouts.providers import get_provider_function
from rollouts.providers.scripted import ScriptExhaustedError

U = Usage(input_tokens=10, output_tokens=5)


def _state(model: ScriptedModel, env: Any = None, question: str = "What is 2 + 3?") -> AgentState:
    msgs = (Message("system", "You are a calculator."), Message("user", question))
    return AgentState(actor=Actor(Trajectory(msgs), model.endpoint), environment=env)


class _Recorder:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []

    async def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)


async def test_calculator_agent_exact_events_trajectory_and_stop() -> None:
    model = ScriptedModel(
        [
            ScriptedReply("Adding.", (ScriptedToolCall("add", {"value": 2}),), usage=U),
            ScriptedReply("", (ScriptedToolCall("add", {"value": 3}),), usage=U),
            ScriptedReply("Done.", (ScriptedToolCall("complete_task", {"final_result": "5"}),), usage=U),
        ],
        chunk_size=4,
    )
    rec = _Recorder()
    states = await run_agent(_state(model, CalculatorEnvironment()), RunConfig(on_chunk=rec))
    name = model.name
    r1 = ToolResult("call_1_0", "Added 2 to 0. Current value: 2")
    r2 = ToolResult("call_2_0", "Added 3 to 2. Current value: 5")
    r3 = ToolResult("call_3_0", "Task completed. Final result: 5", stop_reason=StopReason.TASK_COMPLETED)
    expected: list[StreamEvent] = [
        LLMCallStart("scripted", name),
        StreamStart(),
        TextStart(0),
        TextDelta(0, "Addi"),
        TextDelta(0, "ng."),
        TextEnd(0, "Adding."),
        ToolCallStart(1, "call_1_0", "add"),
        ToolCallDelta(1, "call_1_0", '{"va', {}),
        ToolCallDelta(1, "call_1_0", 'lue"', {}),
        ToolCallDelta(1, "call_1_0", ": 2}", {"value": 2}),
        ToolCallEnd(1, ToolCall("call_1_0", "add", {"value": 2}, '{"value": 2}')),
        StreamDone("tool_use", U),
        ToolExecutionStart("call_1_0", "add"),
        ToolResultReceived("call_1_0", "add", r1),
        LLMCallStart("scripted", name),
        StreamStart(),
        ToolCallStart(0, "call_2_0", "add"),
        ToolCallDelta(0, "call_2_0", '{"va', {}),
        ToolCallDelta(0, "call_2_0", 'lue"', {}),
        ToolCallDelta(0, "call_2_0", ": 3}", {"value": 3}),
        ToolCallEnd(0, ToolCall("call_2_0", "add", {"value": 3}, '{"value": 3}')),
        StreamDone("tool_use", U),
        ToolExecutionStart("call_2_0", "add"),
        ToolResultReceived("call_2_0", "add", r2),
        LLMCallStart("scripted", name),
        StreamStart(),
        TextStart(0),
        TextDelta(0, "Done"),
        TextDelta(0, "."),
        TextEnd(0, "Done."),
        ToolCallStart(1, "call_3_0", "complete_task"),
        *[
            ToolCallDelta(1, "call_3_0", piece, partial)
            for piece, partial in [
                ('{"fi', {}),
                ("nal_", {}),
                ("resu", {}),
                ('lt":', {}),
                (' "5"', {"final_result": "5"}),
                ("}", {"final_result": "5"}),
            ]
        ],
        ToolCallEnd(1, ToolCall("call_3_0", "complete_task", {"final_result": "5"}, '{"final_result": "5"}')),
        StreamDone("tool_use", U),
        ToolExecutionStart("call_3_0", "complete_task"),
        ToolResultReceived("call_3_0", "complete_task", r3),
    ]
    assert rec.events == expected

    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert final.turn_idx == 3
    assert len(states) == 4  # initial + one per turn
    msgs = final.actor.trajectory.messages
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool"]
    assert msgs[2].content == (
        TextContent("Adding."),
        ToolCallContent("call_1_0", "add", {"value": 2}, '{"value": 2}'),
    )
    assert [m.content for m in msgs if m.role == "tool"] == [r1.content, r2.content, r3.content]
    assert [m.tool_call_id for m in msgs if m.role == "tool"] == ["call_1_0", "call_2_0", "call_3_0"]
    assert all(m.usage == U for m in msgs if m.role == "assistant")
    assert final.actor.trajectory.total_usage() == Usage(30, 15)
    assert len(final.actor.trajectory.completions) == 3
    assert [c.message_index for c in final.actor.trajectory.completions] == [2, 4, 6]
    # Earlier states are snapshots: nothing was mutated.
    assert states[0].environment.current_value == 0
    assert states[1].environment.current_value == 2
    assert final.environment.current_value == 5
    assert len(states[1].actor.trajectory.messages) == 4


async def test_tool_sees_the_declared_tools() -> None:
    model = ScriptedModel(["hi"])
    await run_agent(_state(model, CalculatorEnvironment()), RunConfig())
    assert model.last_request is not None
    assert [t.name for t in model.last_request.tools] == ["add", "subtract", "multiply", "divide", "complete_task"]


async def _run_calls(calls: list[ScriptedReply], env: Any, **rc: Any) -> list[AgentState]:
    model = ScriptedModel([*calls, "final answer"])
    return await run_agent(_state(model, env), RunConfig(**rc))


def _tool_messages(state: AgentState) -> list[Message]:
    return [m for m in state.actor.trajectory.messages if m.role == "tool"]


async def test_bad_arguments_unknown_tools_and_malformed_json_become_error_results() -> None:
    rec = _Recorder()
    states = await _run_calls(
        [
            tool_call("add", value="five"),  # wrong type
            tool_call("add"),  # missing required
            tool_call("sqrt", value=4),  # unknown tool
            ScriptedReply(tool_calls=(ScriptedToolCall("add", '{"value": 5'),)),  # malformed JSON
            ScriptedReply(tool_calls=(ScriptedToolCall("add", "[1, 2]"),)),  # JSON but not an object
            ScriptedReply(tool_calls=(ScriptedToolCall("divide", {"value": 0}),)),  # tool-level error
        ],
        CalculatorEnvironment(7),
        on_chunk=rec,
    )
    final = states[-1]
    assert final.stop == StopReason.NO_TOOL_CALLED  # the run went on to the final text answer
    results = _tool_messages(final)
    assert len(results) == 6
    assert all(m.details and m.details.get("is_error") for m in results)
    assert "Invalid arguments for 'add'" in results[0].text and "'five' is not of type 'number'" in results[0].text
    assert "'value' is a required property" in results[1].text
    assert (
        "Unknown tool 'sqrt'" in results[2].text and "add, complete_task, divide, multiply, subtract" in results[2].text
    )
    assert "not valid JSON" in results[3].text
    assert "not valid JSON" in results[4].text
    assert "divide by zero" in results[5].text
    assert final.environment.current_value == 7  # nothing applied
    errors = [e for e in rec.events if isinstance(e, ToolCallError)]
    assert [e.raw_arguments for e in errors] == ['{"value": 5', "[1, 2]"]
    # the malformed call is kept in the assistant message, flagged
    bad = [c for m in final.actor.trajectory.messages for c in m.get_tool_calls() if c.parse_error]
    assert len(bad) == 2


class _Exploding(EnvironmentBase):
    def get_tools(self) -> tuple[Tool, ...]:
        return (Tool("boom", "explodes", {"type": "object", "properties": {}}),)

    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        raise RuntimeError("kaboom")


async def test_tool_exception_becomes_error_result_and_handle_tool_error_is_consulted() -> None:
    states = await _run_calls([tool_call("boom")], _Exploding())
    res = _tool_messages(states[-1])
    assert res[0].text == "Tool 'boom' failed: RuntimeError: kaboom"
    assert states[-1].stop == StopReason.NO_TOOL_CALLED

    states = await _run_calls([tool_call("boom")], _Exploding(), handle_tool_error=handle_tool_error_stop)
    assert states[-1].stop == StopReason.TOOL_ERROR
    assert "kaboom" in (states[-1].error or "")


async def test_calls_after_a_stop_are_answered_not_executed() -> None:
    reply = ScriptedReply(
        tool_calls=(
            ScriptedToolCall("complete_task", {"final_result": "0"}),
            ScriptedToolCall("add", {"value": 1}),
        )
    )
    states = await _run_calls([reply], CalculatorEnvironment())
    final = states[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    res = _tool_messages(final)
    assert len(res) == 2  # every tool call has a result, so the history stays valid for any provider
    assert res[1].text.startswith("Not executed")
    assert final.environment.current_value == 0


async def test_max_turns_handler_and_hard_bound() -> None:
    model = ScriptedModel(lambda req: tool_call("add", value=1))
    states = await run_agent(_state(model, CalculatorEnvironment()), RunConfig(handle_stop=handle_stop_max_turns(3)))
    assert states[-1].stop == StopReason.MAX_TURNS
    assert states[-1].environment.current_value == 3
    assert model.calls == 3

    model2 = ScriptedModel(lambda req: tool_call("add", value=1))
    states = await run_agent(_state(model2, CalculatorEnvironment()), RunConfig(max_turns=4))
    assert states[-1].stop == StopReason.MAX_TURNS
    assert model2.calls == 4


async def test_token_and_cost_budgets_use_reported_usage() -> None:
    per_call = Usage(input_tokens=80, output_tokens=20, cost_usd=0.01)
    model = ScriptedModel(
        lambda req: ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 1}),), usage=per_call)
    )
    states = await run_agent(
        _state(model, CalculatorEnvironment()), RunConfig(handle_stop=handle_stop_token_budget(250))
    )
    assert states[-1].stop == StopReason.BUDGET_EXCEEDED
    assert model.calls == 3  # 100, 200, 300 >= 250
    assert "300 tokens" in (states[-1].error or "")

    model = ScriptedModel(
        lambda req: ScriptedReply(tool_calls=(ScriptedToolCall("add", {"value": 1}),), usage=per_call)
    )
    handler = compose_handlers([handle_stop_max_turns(10), handle_stop_cost_budget(0.035)])
    states = await run_agent(_state(model, CalculatorEnvironment()), RunConfig(handle_stop=handler))
    assert states[-1].stop == StopReason.BUDGET_EXCEEDED
    assert model.calls == 4


async def test_tool_reminder_and_turn_warning_are_injected() -> None:
    model = ScriptedModel(["I think it is 5.", "Still 5."])
    rc = RunConfig(
        handle_no_tool=inject_tool_reminder(max_reminders=1), on_step_start=inject_turn_warning(5, warning_at=5)
    )
    states = await run_agent(_state(model, CalculatorEnvironment()), rc)
    final = states[-1]
    assert final.stop == StopReason.NO_TOOL_CALLED
    injected = [m.details["injected"] for m in final.actor.trajectory.messages if m.details and "injected" in m.details]
    assert injected == ["turn_warning", "tool_reminder", "turn_warning"]
    assert model.calls == 2


async def test_provider_error_stops_the_run_but_auth_errors_raise() -> None:
    model = ScriptedModel([ProviderError("overloaded for too long", provider="scripted", retryable=True)])
    states = await run_agent(_state(model), RunConfig())
    assert states[-1].stop == StopReason.PROVIDER_ERROR
    assert "overloaded" in (states[-1].error or "")

    model = ScriptedModel([AuthenticationError("bad key", provider="scripted")])
    with pytest.raises(AuthenticationError):
        await run_agent(_state(model), RunConfig())


async def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(UnknownProviderError, match=r"known providers: .*scripted"):
        get_provider_function("nope", "m")


class _NeedsConfirmation(CalculatorEnvironment):
    def requires_confirmation(self, tool_call: ToolCall) -> bool:
        return tool_call.name == "multiply"


async def test_confirmation_denied_becomes_an_error_result() -> None:
    answers = iter(["y", "no thanks"])

    async def on_input(prompt: str) -> str:
        assert prompt.startswith("Run multiply(value=")
        return next(answers)

    states = await _run_calls(
        [tool_call("add", value=2), tool_call("multiply", value=3), tool_call("multiply", value=4)],
        _NeedsConfirmation(),
        confirm_tool=confirm_tool_interactive,
        on_input=on_input,
    )
    res = _tool_messages(states[-1])
    assert res[1].text == "Multiplied 2 by 3. Current value: 6"
    assert res[2].text == "The user denied this tool call: no thanks"
    assert states[-1].environment.current_value == 6


# ------------------------------------------------------------------------------------------
# Cancellation
# ------------------------------------------------------------------------------------------


async def test_cancel_mid_stream_propagates_and_nothing_hangs() -> None:
    model = ScriptedModel([ScriptedReply("a long streamed answer " * 4)], chunk_size=3)
    seen: list[str] = []

    async def slow_consumer(event: StreamEvent) -> None:
        if isinstance(event, TextDelta):
            seen.append(event.delta)
            if len(seen) == 3:
                await trio.sleep_forever()

    with trio.move_on_after(0.5) as scope:
        await run_agent(_state(model), RunConfig(on_chunk=slow_consumer))
    assert scope.cancelled_caught
    assert len(seen) == 3


async def test_graceful_cancel_scope_returns_aborted_state_with_partial_message() -> None:
    model = ScriptedModel([ScriptedReply("one two three four five six")], chunk_size=4)
    cs = trio.CancelScope()
    deltas = 0

    async def on_chunk(event: StreamEvent) -> None:
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 2:
                cs.cancel()
                await trio.lowlevel.checkpoint()  # a checkpoint: the cancel lands here

    states = await run_agent(_state(model), RunConfig(on_chunk=on_chunk, cancel_scope=cs))
    last = states[-1]
    assert last.stop == StopReason.ABORTED
    partial = last.actor.trajectory.messages[-1]
    assert partial.role == "assistant"
    assert partial.text == "one two "
    assert partial.details == {"aborted": True}


class _Blocking(CalculatorEnvironment):
    """`multiply` blocks until `release` is set (class-level so clones share it)."""

    release: trio.Event | None = None
    started = 0

    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        if tool_call.name == "multiply":
            type(self).started += 1
            assert type(self).release is not None
            await type(self).release.wait()
        return await super().exec_tool(tool_call, state, run_config, cancel_scope)


async def test_cancel_mid_tool_propagates_and_resume_continues_from_next_tool_idx() -> None:
    _Blocking.release = trio.Event()
    _Blocking.started = 0
    reply = ScriptedReply(
        tool_calls=(
            ScriptedToolCall("add", {"value": 2}),
            ScriptedToolCall("multiply", {"value": 10}),
            ScriptedToolCall("add", {"value": 1}),
        )
    )
    model = ScriptedModel([reply, tool_call("complete_task", final_result="21")])

    # Cancellation from outside propagates out of run_agent.
    with trio.move_on_after(0.3) as outer:
        await run_agent(_state(model, _Blocking()), RunConfig())
    assert outer.cancelled_caught
    assert _Blocking.started == 1

    # With a run-level cancel scope the run returns its exact position.
    model = ScriptedModel([reply, tool_call("complete_task", final_result="21")])
    cs = trio.CancelScope()

    async def on_chunk(event: StreamEvent) -> None:
        if isinstance(event, ToolExecutionStart) and event.tool_name == "multiply":
            cs.deadline = trio.current_time() + 0.05

    states = await run_agent(_state(model, _Blocking()), RunConfig(on_chunk=on_chunk, cancel_scope=cs))
    aborted = states[-1]
    assert aborted.stop == StopReason.ABORTED
    assert [c.name for c in aborted.pending_tool_calls] == ["add", "multiply", "add"]
    assert aborted.next_tool_idx == 1
    assert aborted.environment.current_value == 2
    assert len(_tool_messages(aborted)) == 1

    _Blocking.release.set()
    resumed = await run_agent(replace(aborted, stop=None, error=None), RunConfig())
    final = resumed[-1]
    assert final.stop == StopReason.TASK_COMPLETED
    assert final.environment.current_value == 21
    assert [m.tool_call_id for m in _tool_messages(final)] == ["call_1_0", "call_1_1", "call_1_2", "call_2_0"]
    assert model.calls == 2  # the interrupted turn was not asked again


async def test_reply_function_can_be_async_and_sees_the_conversation() -> None:
    async def reply(req: Any) -> str:
        await trio.lowlevel.checkpoint()
        return f"system={req.system!r} user={req.last_user_text!r} n={len(req.messages)}"

    model = ScriptedModel(reply)
    states = await run_agent(_state(model), RunConfig())
    text = states[-1].actor.trajectory.messages[-1].text
    assert text == "system='You are a calculator.' user='What is 2 + 3?' n=2"


async def test_thinking_blocks_stream_and_aggregate() -> None:
    model = ScriptedModel([ScriptedReply("answer", thinking="let me think")])
    rec = _Recorder()
    states = await run_agent(_state(model), RunConfig(on_chunk=rec))
    msg = states[-1].actor.trajectory.messages[-1]
    assert msg.blocks[0].type == "thinking"
    assert msg.blocks[0].thinking == "let me think"  # type: ignore[union-attr]
    assert msg.blocks[0].signature == f"sig-{model.name}"  # type: ignore[union-attr]
    assert msg.text == "answer"
    kinds = [type(e).__name__ for e in rec.events]
    assert kinds[:3] == ["LLMCallStart", "StreamStart", "ThinkingStart"]
    assert "ThinkingEnd" in kinds and kinds.index("ThinkingEnd") < kinds.index("TextStart")


async def test_message_json_in_scripted_events_is_exactly_the_scripted_arguments() -> None:
    args = {"value": 1.5, "note": "ünïcode ✓", "nested": {"list": [1, {"x": None}]}}
    model = ScriptedModel([ScriptedReply(tool_calls=(ScriptedToolCall("anything", args),)), "done"], chunk_size=5)
    rec = _Recorder()
    await run_agent(_state(model, None), RunConfig(on_chunk=rec))
    end = next(e for e in rec.events if isinstance(e, ToolCallEnd))
    assert end.tool_call.arguments == args
    deltas = [e for e in rec.events if isinstance(e, ToolCallDelta)]
    assert "".join(d.delta for d in deltas) == json.dumps(args)
    assert deltas[-1].partial_args == args
    states = rec  # the call had no environment to run in: it was answered with an error result
    assert any(isinstance(e, ToolResultReceived) and "no environment" in e.result.content for e in states.events)


# ------------------------------------------------------------------------------------------
# Handlers: who is consulted when, and what they refuse
# ------------------------------------------------------------------------------------------


async def test_handle_tool_error_is_consulted_for_every_kind_of_error_result_and_only_those() -> None:
    seen: list[str] = []

    def on_error(result: ToolResult, state: AgentState) -> AgentState:
        seen.append(result.content)
        return state

    states = await _run_calls(
        [
            tool_call("add", value=1),  # fine: not consulted
            tool_call("sqrt", value=4),  # unknown tool
            tool_call("add", value="x"),  # fails the schema
            ScriptedReply(tool_calls=(ScriptedToolCall("add", '{"value": '),)),  # not JSON
            ScriptedReply(tool_calls=(ScriptedToolCall("divide", {"value": 0}),)),  # the tool's own error
        ],
        CalculatorEnvironment(),
        handle_tool_error=on_error,
    )
    assert states[-1].stop == StopReason.NO_TOOL_CALLED  # the run went on after every error
    assert len(seen) == 4
    assert seen[0].startswith("Unknown tool 'sqrt'")
    assert seen[1].startswith("Invalid arguments for 'add'")
    assert "not valid JSON" in seen[2]
    assert "divide by zero" in seen[3]
    assert [m.text for m in _tool_messages(states[-1]) if m.details and m.details.get("is_error")] == seen
    # ... and a tool that raises (see test_tool_exception_becomes_error_result_...) is consulted too
    raised: list[str] = []
    await _run_calls([tool_call("boom")], _Exploding(), handle_tool_error=lambda r, s: raised.append(r.content) or s)
    assert raised == ["Tool 'boom' failed: RuntimeError: kaboom"]


async def test_stop_on_empty_message() -> None:
    model = ScriptedModel([ScriptedReply(""), "never asked"])
    rc = RunConfig(handle_stop=handle_stop_on_empty_message(), handle_no_tool=inject_tool_reminder(max_reminders=5))
    states = await run_agent(_state(model, CalculatorEnvironment()), rc)
    assert states[-1].stop == StopReason.EMPTY_MESSAGE
    assert model.calls == 1
    assert [m.role for m in states[-1].messages][-2:] == ["assistant", "user"]  # the reminder was looked past
    # a new user message after an empty reply (a resumed conversation) gets an answer
    resumed = states[-1].with_messages(Message("user", "Please answer."))
    model2 = ScriptedModel(["Here it is."])
    resumed = replace(resumed, stop=None, actor=replace(resumed.actor, endpoint=model2.endpoint))
    states = await run_agent(resumed, RunConfig(handle_stop=handle_stop_on_empty_message()))
    assert states[-1].stop == StopReason.NO_TOOL_CALLED and model2.calls == 1
    # a message with a tool call but no text is not empty
    model = ScriptedModel([tool_call("add", value=1), "done"])
    states = await run_agent(
        _state(model, CalculatorEnvironment()), RunConfig(handle_stop=handle_stop_on_empty_message())
    )
    assert states[-1].stop == StopReason.NO_TOOL_CALLED and model.calls == 2


async def test_context_too_long_stops_the_run_with_its_own_reason() -> None:
    model = ScriptedModel([ContextTooLongError("prompt is too long", provider="scripted")])
    states = await run_agent(_state(model), RunConfig())
    assert states[-1].stop == StopReason.CONTEXT_TOO_LONG
    assert "ContextTooLongError: prompt is too long" in (states[-1].error or "")


def test_handlers_refuse_nonsense_limits_with_a_clear_message() -> None:
    for make, match in [
        (lambda: handle_stop_max_turns(0), "max_turns must be >= 1"),
        (lambda: handle_stop_token_budget(0), "max_tokens must be >= 1"),
        (lambda: handle_stop_cost_budget(0.0), "max_cost_usd must be > 0"),
        (lambda: inject_turn_warning(0), "must be >= 1"),
        (lambda: inject_tool_reminder(-1), "max_reminders must be >= 0"),
        (lambda: RunConfig(max_turns=0), "max_turns must be >= 1"),
    ]:
        with pytest.raises(ValueError, match=match):
            make()
    model = ScriptedModel(["x"])
    with pytest.raises(ValueError, match="next_tool_idx 2 is out of range for 1 pending"):
        AgentState(Actor(Trajectory(), model.endpoint), pending_tool_calls=(ToolCall("c", "add", {}),), next_tool_idx=2)


# ------------------------------------------------------------------------------------------
# Cancellation that arrives wrapped in an exception group (a nursery inside a tool)
# ------------------------------------------------------------------------------------------


class _NurseryTool(CalculatorEnvironment):
    """`multiply` runs helpers in a nursery and blocks: a cancellation leaves it as a
    BaseExceptionGroup of Cancelled, not a bare Cancelled."""

    entered: trio.Event | None = None

    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        if tool_call.name != "multiply":
            return await super().exec_tool(tool_call, state, run_config, cancel_scope)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(trio.sleep_forever)
            assert type(self).entered is not None
            type(self).entered.set()
            await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_cancellation_inside_a_tool_nursery_is_recorded_as_an_abort(tmp_path: Any) -> None:
    from rollouts.store import FileSessionStore, SessionStatus

    reply = ScriptedReply(
        tool_calls=(ScriptedToolCall("add", {"value": 2}), ScriptedToolCall("multiply", {"value": 3}))
    )
    store = FileSessionStore(tmp_path)
    _NurseryTool.entered = trio.Event()
    with trio.fail_after(5):  # nothing hangs
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                await run_agent(_state(ScriptedModel([reply]), _NurseryTool()), RunConfig(session_store=store))

            nursery.start_soon(run)
            await _NurseryTool.entered.wait()
            nursery.cancel_scope.cancel()
    session = (await store.list())[0]
    assert session.status == SessionStatus.ABORTED  # not FAILED: it was a cancellation
    assert session.environment_state == {"current_value": 2.0}

    # With a run-level cancel scope the run returns its position instead.
    _NurseryTool.entered = trio.Event()
    cs = trio.CancelScope()

    async def on_chunk(event: StreamEvent) -> None:
        if isinstance(event, ToolExecutionStart) and event.tool_name == "multiply":
            cs.deadline = trio.current_time() + 0.05

    with trio.fail_after(5):
        states = await run_agent(
            _state(ScriptedModel([reply]), _NurseryTool()), RunConfig(on_chunk=on_chunk, cancel_scope=cs)
        )
    assert states[-1].stop == StopReason.ABORTED and states[-1].next_tool_idx == 1


async def test_messages_any_handler_adds_are_recorded_and_a_step_handler_can_stop_the_run(tmp_path: Any) -> None:
    from rollouts.store import FileSessionStore

    def note(tag: str) -> Message:
        return Message("user", f"[{tag}]", details={"injected": tag})

    def on_error(result: ToolResult, state: AgentState) -> AgentState:
        return state.with_messages(note("after_error"))

    def on_stop(state: AgentState) -> AgentState:
        return state.with_messages(note("stop_check")) if state.turn_idx == 1 else state

    store = FileSessionStore(tmp_path)
    model = ScriptedModel([tool_call("divide", value=0), "done"])
    rc = RunConfig(session_store=store, handle_tool_error=on_error, handle_stop=on_stop)
    states = await run_agent(_state(model, CalculatorEnvironment()), rc)
    final = states[-1]
    tags = [m.details["injected"] for m in final.messages if m.details and "injected" in m.details]
    assert tags == ["after_error", "stop_check"]
    _, stored = await store.get(final.session_id or "")
    assert tuple(stored) == final.messages  # the session and the state never disagree

    def stop_at_turn_1(state: AgentState) -> AgentState:
        return replace(state, stop=StopReason.USER_EXIT) if state.turn_idx == 1 else state

    model = ScriptedModel([tool_call("add", value=1), "never asked"])
    states = await run_agent(_state(model, CalculatorEnvironment()), RunConfig(on_step_start=stop_at_turn_1))
    assert states[-1].stop == StopReason.USER_EXIT and model.calls == 1


async def test_the_default_confirm_tool_approves_without_asking() -> None:
    async def on_input(prompt: str) -> str:
        raise AssertionError("the default confirm_tool must not ask")

    states = await _run_calls([tool_call("multiply", value=3)], _NeedsConfirmation(1), on_input=on_input)
    assert _tool_messages(states[-1])[0].text == "Multiplied 1 by 3. Current value: 3"


async def test_scripted_model_misuse_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        ScriptedModel(["x"], chunk_size=0)
    model = ScriptedModel([42])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="a reply must be a str, a ScriptedReply or an exception, got 42"):
        await run_agent(_state(model), RunConfig())
    model = ScriptedModel(["only one"])
    await run_agent(_state(model), RunConfig())
    with pytest.raises(ScriptExhaustedError, match="has 1 replies but was called 2 times"):
        await run_agent(_state(model), RunConfig())


# ------------------------------------------------------------------------------------------
# Issue 13 item 3: cancellation can be ignored (nothing in the loop yields to the scheduler)
# ------------------------------------------------------------------------------------------


def _adding_model(turns: int) -> ScriptedModel:
    """A model that calls `add` forever (up to `turns` replies); nothing in it or in the
    calculator ever awaits anything that yields to the scheduler."""
    return ScriptedModel([tool_call("add", value=1) for _ in range(turns)])


async def test_cancellation_can_be_ignored_scope_cancelled_before_the_run(tmp_path: Any) -> None:
    from rollouts.store import FileSessionStore, SessionStatus

    model = _adding_model(50)
    cs = trio.CancelScope()
    cs.cancel()
    store = FileSessionStore(tmp_path)
    states = await run_agent(
        _state(model, CalculatorEnvironment()), RunConfig(cancel_scope=cs, max_turns=50, session_store=store)
    )
    assert states[-1].stop == StopReason.ABORTED
    assert model.calls == 0  # not one model call ran
    session = (await store.list())[0]
    assert session.status == SessionStatus.ABORTED


async def test_cancellation_can_be_ignored_scope_cancelled_by_an_event_handler() -> None:
    model = _adding_model(50)
    cs = trio.CancelScope()

    async def on_chunk(event: StreamEvent) -> None:  # cancels, but never awaits a checkpoint
        if isinstance(event, ToolResultReceived):
            cs.cancel()

    states = await run_agent(
        _state(model, CalculatorEnvironment()), RunConfig(on_chunk=on_chunk, cancel_scope=cs, max_turns=50)
    )
    final = states[-1]
    assert final.stop == StopReason.ABORTED
    assert model.calls == 1  # the cancel landed before a second model call
    assert final.environment.current_value == 1
    assert [m.role for m in final.messages[2:]] == ["assistant", "tool"]  # the result was kept


async def test_cancellation_can_be_ignored_scope_cancelled_by_another_task() -> None:
    model = _adding_model(50)
    cs = trio.CancelScope()
    first_result = trio.Event()

    async def on_chunk(event: StreamEvent) -> None:
        if isinstance(event, ToolResultReceived):
            first_result.set()

    async def canceller() -> None:
        await first_result.wait()
        cs.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(canceller)
        states = await run_agent(
            _state(model, CalculatorEnvironment()), RunConfig(on_chunk=on_chunk, cancel_scope=cs, max_turns=50)
        )
    assert states[-1].stop == StopReason.ABORTED
    assert model.calls < 50  # the other task got to run and its cancel was honoured


async def test_cancellation_can_be_ignored_mid_stream_every_event_is_a_cancel_point() -> None:
    model = ScriptedModel([ScriptedReply("one two three four five six")], chunk_size=4)
    cs = trio.CancelScope()
    deltas = 0

    async def on_chunk(event: StreamEvent) -> None:  # no checkpoint of its own
        nonlocal deltas
        if isinstance(event, TextDelta):
            deltas += 1
            if deltas == 2:
                cs.cancel()

    states = await run_agent(_state(model), RunConfig(on_chunk=on_chunk, cancel_scope=cs))
    assert deltas == 2
    last = states[-1]
    assert last.stop == StopReason.ABORTED
    assert last.messages[-1].text == "one two "


# ------------------------------------------------------------------------------------------
# Issue 13 item 4: frozen only at the top (a tool editing its arguments edited the record)
# ------------------------------------------------------------------------------------------


class _EditsItsArguments(CalculatorEnvironment):
    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        tool_call.arguments["value"] = 1000  # type: ignore[index]
        return await super().exec_tool(tool_call, state, run_config, cancel_scope)


async def test_frozen_only_at_the_top_a_tool_cannot_rewrite_the_recorded_assistant_message(tmp_path: Any) -> None:
    from rollouts.store import FileSessionStore

    store = FileSessionStore(tmp_path)
    model = ScriptedModel([tool_call("add", value=2), "done"])
    states = await run_agent(_state(model, _EditsItsArguments()), RunConfig(session_store=store))
    final = states[-1]
    assistant = final.messages[2]
    assert assistant.get_tool_calls()[0].arguments == {"value": 2}
    tool_message = final.messages[3]
    assert tool_message.is_error and "read-only" in tool_message.text  # the edit failed, visibly
    assert final.environment.current_value == 0
    # what the model saw next and what the session holds are the call as the model made it
    assert model.last_request is not None
    assert model.last_request.messages[2].get_tool_calls()[0].arguments == {"value": 2}
    _, stored = await store.get(final.session_id or "")
    assert stored[2].get_tool_calls()[0].arguments == {"value": 2}


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        (
            {
                "type": "object",
                "properties": {"v": {"type": "number"}},
                "required": ["v"],
                "additionalProperties": False,
            },
            [{"v": 1}, {"v": 1.5}],
            [{}, {"v": "1"}, {"v": True}, {"v": 1, "w": 2}],
        ),
        (
            {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "integer"}}}},
            [{"xs": []}, {"xs": [1, 2]}, {"other": None}, {"xs": [1.0]}],
            [{"xs": [1, "a"]}, {"xs": "12"}],
        ),
        (
            {"type": "object", "properties": {"mode": {"enum": ["a", "b"]}, "n": {"type": ["integer", "null"]}}},
            [{"mode": "a"}, {"n": None}, {"n": 3}],
            [{"mode": "c"}, {"n": "3"}],
        ),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}},  # beyond the fast subset
            [{"n": 3}],
            [{"n": 2}],
        ),
    ],
)
def test_tool_argument_checks_agree_with_jsonschema(
    schema: dict[str, Any], valid: list[Any], invalid: list[Any]
) -> None:
    import jsonschema

    from rollouts._schema import argument_errors
    from rollouts.frozen import freeze

    frozen_schema = freeze(schema)
    for args in valid:
        assert argument_errors(frozen_schema, freeze(args)) is None
        jsonschema.validate(args, schema)
    for args in invalid:
        problem = argument_errors(frozen_schema, freeze(args))
        assert problem is not None
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(args, schema)


# ------------------------------------------------------------------------------------------
# Issue 14 item 4: contracts on user code raise TypeError (asserts vanish under python -O)
# ------------------------------------------------------------------------------------------


class _ReturnsNonsense(CalculatorEnvironment):
    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        return "Added."  # type: ignore[return-value]


class _AnswersAnotherCall(CalculatorEnvironment):
    async def exec_tool(
        self, tool_call: ToolCall, state: AgentState, run_config: RunConfig, cancel_scope: Any = None
    ) -> ToolResult:
        return ToolResult("someone-else", "Added.")


async def test_typed_tool_message_semantics_user_code_contracts_raise_type_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(TypeError, match=r"_ReturnsNonsense\.exec_tool must return a ToolResult, got str"):
        await run_agent(_state(ScriptedModel([tool_call("add", value=1)]), _ReturnsNonsense()), RunConfig())
    with pytest.raises(TypeError, match="its ToolResult has tool_call_id 'someone-else'"):
        await run_agent(_state(ScriptedModel([tool_call("add", value=1)]), _AnswersAnotherCall()), RunConfig())

    from rollouts import providers
    from rollouts.dtypes import Endpoint

    async def returns_none(actor: Actor, on_chunk: Any) -> Any:
        return None

    async def appends_two(actor: Actor, on_chunk: Any) -> Actor:
        return replace(actor, trajectory=actor.trajectory.append(Message("assistant", "a"), Message("assistant", "b")))

    monkeypatch.setitem(providers._REGISTERED, "returns-none", returns_none)  # removed after the test
    monkeypatch.setitem(providers._REGISTERED, "appends-two", appends_two)
    for provider, expected in (
        ("returns-none", "must return the Actor with the new assistant message appended, got NoneType"),
        ("appends-two", "must append exactly one assistant message to the trajectory; it appended 2"),
    ):
        state = AgentState(actor=Actor(Trajectory((Message("user", "hi"),)), Endpoint(provider, "m")))
        with pytest.raises(TypeError, match=expected):
            await run_agent(state, RunConfig())


async def test_smaller_a_run_stopped_by_a_limit_is_not_recorded_as_completed(tmp_path: Any) -> None:
    """Issue 13 item 14: a run stopped by max_turns (or a budget) was recorded as `completed`."""
    from rollouts.store import FileSessionStore, SessionStatus

    store = FileSessionStore(tmp_path)
    model = ScriptedModel([tool_call("add", value=1), tool_call("add", value=1), "done"])
    states = await run_agent(_state(model, CalculatorEnvironment()), RunConfig(session_store=store, max_turns=1))
    assert states[-1].stop == StopReason.MAX_TURNS
    session, _ = await store.get(states[-1].session_id or "")
    assert session.status == SessionStatus.MAX_TURNS

    budget = RunConfig(session_store=store, handle_stop=handle_stop_token_budget(1))
    states = await run_agent(_state(ScriptedModel([tool_call("add", value=1)] * 3), CalculatorEnvironment()), budget)
    assert states[-1].stop == StopReason.BUDGET_EXCEEDED
    session, _ = await store.get(states[-1].session_id or "")
    assert session.status == SessionStatus.BUDGET_EXCEEDED


async def test_cancellation_can_be_ignored_another_task_cancels_during_one_long_stream() -> None:
    """One turn streaming thousands of events without I/O still lets another task run."""
    text = "x" * 3000
    model = ScriptedModel([ScriptedReply(text)], chunk_size=1)
    cs = trio.CancelScope()
    streaming = trio.Event()

    async def on_chunk(event: StreamEvent) -> None:
        if isinstance(event, TextDelta):
            streaming.set()

    async def canceller() -> None:
        await streaming.wait()
        cs.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(canceller)
        states = await run_agent(_state(model), RunConfig(on_chunk=on_chunk, cancel_scope=cs))
    last = states[-1]
    assert last.stop == StopReason.ABORTED
    assert 0 < len(last.messages[-1].text) < len(text)  # cut short mid-stream, not after it
