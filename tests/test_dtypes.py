"""Core types: JSON round trips, secrets, invariants."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rollouts import (
    Endpoint,
    ImageContent,
    Message,
    Metric,
    Sample,
    Score,
    StopReason,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolCallContent,
    ToolResult,
    Trajectory,
    Usage,
)
from rollouts.dtypes import Completion

SECRET = "sk-test-SECRET-0123456789"


def _rich_message() -> Message:
    return Message(
        role="assistant",
        content=(
            ThinkingContent("réflexion 🤔", signature="sig-abc", provider="anthropic"),
            ThinkingContent("", redacted=True, data="opaque==", provider="anthropic"),
            TextContent('Voilà: 日本語 and emoji 🎉\nnew line "quoted"'),
            ToolCallContent("call_1", "add", {"value": 5, "nested": {"a": [1, 2, {"b": None}]}}, '{"value": 5}'),
            ToolCallContent("call_2", "broken", {}, '{"value": ', "invalid JSON"),
            ImageContent(media_type="image/jpeg", data="aGVsbG8="),
            ImageContent(url="https://example.invalid/cat.png"),
        ),
        timestamp="2026-11-22T00:00:00.000000Z",
        provider="anthropic",
        model="claude-x",
        usage=Usage(10, 20, 3, 4, 5, 0.0123),
        details={"finish_reason": "tool_use", "ünï": ["x"]},
    )


def _json_cycle(d: dict) -> dict:
    return json.loads(json.dumps(d, ensure_ascii=False))


def test_message_round_trip_with_every_block_and_unicode() -> None:
    m = _rich_message()
    assert Message.from_dict(_json_cycle(m.to_dict())) == m


def test_plain_messages_round_trip() -> None:
    for m in (
        Message("system", "Be terse."),
        Message("user", ""),
        Message("tool", "result ✓", tool_call_id="call_1", details={"is_error": True}),
    ):
        assert Message.from_dict(_json_cycle(m.to_dict())) == m


def test_list_content_becomes_tuple_and_tool_message_needs_id() -> None:
    m = Message("assistant", [TextContent("a")])  # type: ignore[arg-type]
    assert m.content == (TextContent("a"),)
    with pytest.raises(ValueError, match="tool_call_id"):
        Message("tool", "x")
    with pytest.raises(ValueError, match="role"):
        Message("robot", "x")  # type: ignore[arg-type]


def test_message_accessors() -> None:
    m = _rich_message()
    assert m.text.startswith("Voilà")
    calls = m.get_tool_calls()
    assert [c.name for c in calls] == ["add", "broken"]
    assert calls[1].parse_error == "invalid JSON"
    assert Message("user", "hi").get_tool_calls() == ()


def test_trajectory_round_trip_jsonl_and_streaming(tmp_path) -> None:
    t1 = Trajectory(
        messages=(Message("user", "2+2?"), _rich_message()),
        completions=(Completion("anthropic", "claude-x", "tool_use", 1, 0.5, 0.1),),
        rewards=0.75,
        metadata={"id": "ü-1", "tags": ["a"]},
    )
    t2 = Trajectory(messages=(Message("user", "second"),))
    assert Trajectory.from_jsonl(t1.to_jsonl()) == t1
    assert "\n" not in t1.to_jsonl()
    path = tmp_path / "t.jsonl"
    Trajectory.save_jsonl([t1, t2], path)
    assert Trajectory.load_jsonl(path) == [t1, t2]
    stream = Trajectory.load_jsonl_streaming(path)
    assert next(stream) == t1
    assert next(stream) == t2


def test_load_jsonl_names_the_bad_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(Trajectory().to_jsonl() + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        Trajectory.load_jsonl(path)


def test_trajectory_hash_is_stable_and_ignores_timestamps() -> None:
    a = Trajectory(messages=(Message("user", "hi", timestamp="t1"),), metadata={"k": 1})
    b = Trajectory(messages=(Message("user", "hi", timestamp="t2"),), metadata={"k": 1})
    c = Trajectory(messages=(Message("user", "hi!"),), metadata={"k": 1})
    assert a.hash() == b.hash()
    assert a.hash() != c.hash()
    assert len(a.hash()) == 64
    # Known value: the hash must not change between runs, processes or releases without intent
    # (a change here invalidates every stored hash: bump it only on purpose).
    pinned = Trajectory(
        messages=(
            Message("system", "Be terse."),
            Message("user", "2+2? ✓", timestamp="t"),
            Message(
                "assistant",
                (
                    ThinkingContent("hmm", signature="s", provider="anthropic"),
                    TextContent("4"),
                    ToolCallContent("c1", "add", {"value": 4}),
                ),
            ),
            Message("tool", "ok", tool_call_id="c1"),
        ),
        metadata={"id": "ü-1"},
    )
    assert pinned.hash() == "18a6348f027c2fb2e5887e08dd8bacda408c5b9d67ff5d10557b1d9bc11905a1"
    assert Trajectory.from_jsonl(pinned.to_jsonl()).hash() == pinned.hash()


def test_endpoint_never_emits_or_prints_secrets() -> None:
    ep = Endpoint(provider="anthropic", model="claude-x", api_key=SECRET, thinking={"budget_tokens": 1024})
    d = ep.to_dict()
    assert "api_key" not in d
    assert SECRET not in json.dumps(d)
    assert SECRET not in repr(ep)
    assert SECRET not in str(ep)
    back = Endpoint.from_dict(_json_cycle(d), api_key=SECRET)
    assert back == ep
    assert Endpoint.from_dict(_json_cycle(d)).api_key == ""
    assert ep.to_dict(exclude_secrets=False)["api_key"] == SECRET


def test_endpoint_validates_user_input() -> None:
    with pytest.raises(ValueError, match="provider"):
        Endpoint(provider="", model="m")
    with pytest.raises(ValueError, match="max_retries"):
        Endpoint(provider="p", model="m", max_retries=-1)
    with pytest.raises(ValueError, match="transport"):
        Endpoint(provider="p", model="m", transport="carrier-pigeon")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown keys"):
        Endpoint.from_dict({"provider": "p", "model": "m", "colour": "red"})


def test_frozen_everywhere() -> None:
    m = Message("user", "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.role = "assistant"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Trajectory().rewards = 1.0  # type: ignore[misc]


def test_tool_and_results_round_trip() -> None:
    tool = Tool("add", "Add ✓", {"type": "object", "properties": {"value": {"type": "number"}}})
    assert Tool.from_dict(_json_cycle(tool.to_dict())) == tool
    call = ToolCall("c1", "add", {"value": 1.5}, '{"value": 1.5}')
    assert ToolCall.from_dict(_json_cycle(call.to_dict())) == call
    res = ToolResult("c1", "done ✓", is_error=True, stop_reason=StopReason.TASK_COMPLETED, details={"x": 1})
    assert ToolResult.from_dict(_json_cycle(res.to_dict())) == res


def test_score_reward_is_weighted_mean_of_positive_weights() -> None:
    s = Score(
        (
            Metric("correct", 1.0, weight=3.0),
            Metric("format", 0.0, weight=1.0),
            Metric("tokens", 512.0),  # tracked only
        )
    )
    assert s.reward == pytest.approx(0.75)
    assert Score((Metric("tokens", 5.0),)).reward == 0.0
    with pytest.raises(ValueError, match="duplicate"):
        Score((Metric("a", 1), Metric("a", 2)))
    with pytest.raises(ValueError, match="weight"):
        Metric("a", 1.0, weight=-1)


def test_sample_round_trip() -> None:
    traj = Trajectory(messages=(Message("user", "q"), _rich_message()))
    s = Sample(
        id="7",
        input={"question": "q", "answer": "4"},
        trajectory=traj,
        score=Score((Metric("correct", 1.0, 1.0, {"feedback": "good ✓"}),)),
        status="completed",
        stop_reason="task_completed",
        metadata={"turns": 2},
    )
    assert Sample.from_dict(_json_cycle(s.to_dict())) == s
    assert s.ground_truth == "4"
    assert s.response.startswith("Voilà")
    assert s.score is not None and s.score.feedback == "good ✓"


def test_usage_adds_up() -> None:
    total = Usage(1, 2, 3, 4, 5, 0.5) + Usage(10, 20, 30, 40, 50, 1.0)
    assert total == Usage(11, 22, 33, 44, 55, 1.5)
    assert total.total_tokens == 11 + 22 + 33 + 44


def _persisted_values() -> list[object]:
    """One rich value of every type that is written to disk or sent over JSON."""
    usage = Usage(10, 20, 3, 4, 5, 0.0123)
    traj = Trajectory(
        messages=(Message("system", "Ünïcödé ✓ \U0001d518 \u0000 \t tab"), Message("user", "q"), _rich_message()),
        completions=(Completion("anthropic", "claude-x", "tool_use", 2, 0.5, 0.1, 2), Completion("openai", "m")),
        rewards=0.5,
        metadata={"nested": {"list": [1, 2.5, None, True, "ß"]}, "emoji": "🎉"},
    )
    return [
        Endpoint(
            provider="anthropic",
            model="claude-x",
            api_base="http://127.0.0.1:1/v1",
            max_tokens=100,
            temperature=0.3,
            thinking={"budget_tokens": 2048},
            max_retries=5,
            timeout=12.5,
            extra_params={"top_k": 5, "metadata": {"user_id": "ü"}},
            transport="http",
        ),
        Endpoint("openai", "gpt-4o"),
        usage,
        Usage(),
        Tool("add", "Add ✓", {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}),
        ToolCall("c1", "add", {"value": 1.5, "nested": [{"a": None}]}, '{"value": 1.5}'),
        ToolCall("c2", "add", {}, '{"value": ', "invalid JSON"),
        ToolResult("c1", "done ✓", is_error=True, stop_reason=StopReason.TASK_COMPLETED, details={"x": [1]}),
        ToolResult("c2", ""),
        _rich_message(),
        Message("tool", "résultat", tool_call_id="c1", details={"is_error": True}),
        Message("user", (TextContent("look 👀"), ImageContent("image/png", data="aGk="))),
        Completion("google", "gemini", "stop", 3, 1.25, None, 3),
        traj,
        Trajectory(),
        Metric("correct", 1.0, 2.0, {"feedback": "très bien"}),
        Score((Metric("a", 0.5, 1.0), Metric("b", 3.0))),
        Sample(
            "s-ü",
            {"q": "2+2", "answer": 4},
            traj,
            Score((Metric("a", 1.0, 1.0),)),
            "completed",
            None,
            "task_completed",
            {"k": 1},
        ),
        Sample("s2", status="failed", error="ProviderError: boom"),
    ]


@pytest.mark.parametrize("ensure_ascii", [False, True])
@pytest.mark.parametrize("value", _persisted_values(), ids=lambda v: type(v).__name__)
def test_every_persisted_type_round_trips_through_json(value: object, ensure_ascii: bool) -> None:
    cls = type(value)
    data = value.to_dict()  # type: ignore[attr-defined]
    text = json.dumps(data, ensure_ascii=ensure_ascii)
    back = cls.from_dict(json.loads(text))  # type: ignore[attr-defined]
    assert back == value
    assert type(back) is cls
    assert back.to_dict() == data  # and the JSON is stable
    if isinstance(value, Endpoint):
        assert "api_key" not in data


def test_every_dataclass_is_frozen_and_sequence_fields_are_tuples() -> None:
    from rollouts import dtypes, events
    from rollouts.eval import sample as scoring

    for module in (dtypes, events, scoring):
        for obj in vars(module).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__:
                assert obj.__dataclass_params__.frozen, f"{obj.__name__} is not frozen"  # type: ignore[attr-defined]
    t = Trajectory(messages=[Message("user", "a")], completions=[Completion("p", "m")])  # type: ignore[arg-type]
    assert isinstance(t.messages, tuple) and isinstance(t.completions, tuple)
    assert isinstance(Score([Metric("a", 1.0)]).metrics, tuple)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Issue 13 item 4: frozen only at the top (nested dicts were the caller's, and mutable)
# ------------------------------------------------------------------------------------------


def test_frozen_only_at_the_top_nested_data_is_copied_and_read_only() -> None:
    import copy
    import pickle

    from rollouts.frozen import FrozenDict, FrozenList, thaw

    args = {"value": 5, "items": [1, {"a": [2]}]}
    details = {"tool_name": "add", "result": {"lines": [1, 2]}}
    meta = {"task": {"id": 1, "tags": ["x"]}}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    extra = {"headers": {"X-Trace": "1"}, "stop": ["\n"]}
    params = {"type": "object", "properties": {"value": {"type": "number"}}, "required": ["value"]}
    call = ToolCall("c1", "add", args)
    message = Message("tool", "ok", tool_call_id="c1", details=details)
    trajectory = Trajectory(metadata=meta)
    endpoint = Endpoint("openai", "gpt-4.1", thinking=thinking, extra_params=extra)
    tool = Tool("add", "adds", params)
    held = [
        (call.arguments, args),
        (message.details, details),
        (trajectory.metadata, meta),
        (endpoint.thinking, thinking),
        (endpoint.extra_params, extra),
        (tool.parameters, params),
    ]
    snapshot = copy.deepcopy([given for _, given in held])

    # the caller editing its own dicts afterwards changes nothing inside the values
    args["items"][1]["a"].append(3)
    details["result"]["lines"].clear()
    meta["task"]["tags"].append("y")
    thinking["budget_tokens"] = 1
    extra["headers"]["X-Trace"] = "2"
    params["required"].append("other")
    for (inside, _), before in zip(held, snapshot, strict=True):
        assert inside == before  # still equal to the plain dicts that were passed
        assert json.loads(json.dumps(inside)) == before  # and serialize like them

    # nothing inside can be changed in place, at any depth
    for attempt in (
        lambda: call.arguments.__setitem__("value", 6),
        lambda: call.arguments["items"].append(9),
        lambda: call.arguments["items"][1]["a"].append(9),
        lambda: message.details.update(x=1),
        lambda: message.details["result"]["lines"].pop(),
        lambda: trajectory.metadata["task"].setdefault("k", 1),
        lambda: endpoint.thinking.pop("type"),
        lambda: endpoint.extra_params["stop"].insert(0, "x"),
        lambda: tool.parameters["properties"].clear(),
    ):
        with pytest.raises(TypeError, match="read-only"):
            attempt()
    assert isinstance(call.arguments, FrozenDict) and isinstance(call.arguments["items"], FrozenList)

    # plain, mutable copies on the way out; pickling and copying keep the frozen values
    out = call.to_dict()["arguments"]
    out["items"].append(4)
    assert type(out) is dict and type(out["items"]) is list
    assert thaw(call.arguments) == {"value": 5, "items": [1, {"a": [2]}]}
    assert pickle.loads(pickle.dumps(call)) == call
    assert copy.deepcopy(message) == message
    assert hash(call) == hash(ToolCall("c1", "add", {"value": 5, "items": [1, {"a": [2]}]}))


def test_frozen_only_at_the_top_metadata_of_one_state_is_not_shared_with_the_next() -> None:
    first = Trajectory(metadata={"seen": []})
    second = first.append(Message("user", "hi"))
    with pytest.raises(TypeError):
        second.metadata["seen"].append(1)
    assert first.metadata == {"seen": []}
    assert dataclasses.replace(second, metadata={"seen": [1]}).metadata == {"seen": [1]}
    assert first.metadata == {"seen": []}


def test_frozen_only_at_the_top_a_wrong_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"ToolCall\.arguments must be a mapping"):
        ToolCall("c1", "add", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Trajectory\.metadata must be a mapping"):
        Trajectory(metadata=None)  # type: ignore[arg-type]


def test_smaller_messages_and_endpoints_refuse_nonsense_with_clear_errors() -> None:
    """Issue 13 item 14: `Message("user", None)` and `Endpoint(max_tokens=-5)` were accepted."""
    with pytest.raises(TypeError, match=r'Message.content must be a str \(""'):
        Message("user", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a tuple holding a dict"):
        Message("assistant", ({"type": "text", "text": "hi"},))  # type: ignore[arg-type]
    for bad in (-5, 0, 1.5, True, "100"):
        with pytest.raises(ValueError, match=r"Endpoint\.max_tokens must be a positive whole number"):
            Endpoint("openai", "gpt-4.1", max_tokens=bad)  # type: ignore[arg-type]
    assert Message("user", "").text == "" and Endpoint("openai", "gpt-4.1", max_tokens=1).max_tokens == 1


# ------------------------------------------------------------------------------------------
# Issue 14 item 4: typed tool-message semantics
# ------------------------------------------------------------------------------------------


def test_typed_tool_message_semantics_accessors_and_constructor() -> None:
    call = ToolCall("c1", "bash", {"command": "ls"})
    failed = Message.tool_result(call, "exit 2", is_error=True, result_details={"exit_code": 2})
    assert failed.is_error and failed.tool_name == "bash" and failed.tool_details == {"exit_code": 2}
    assert failed.tool_call_id == "c1" and failed.role == "tool"
    # the persisted form is the one every session and sample file already holds
    assert failed.to_dict() == {
        "role": "tool",
        "content": "exit 2",
        "tool_call_id": "c1",
        "details": {"tool_name": "bash", "is_error": True, "result": {"exit_code": 2}},
    }
    assert Message.from_dict(failed.to_dict()).is_error
    ok = Message.tool_result(call, "a.txt")
    assert not ok.is_error and ok.tool_details is None and ok.to_dict()["details"] == {"tool_name": "bash"}
    assert not Message("user", "hi", details={"is_error": True}).is_error  # only tool messages report errors
    assert Message("assistant", "x").tool_name is None


def test_typed_tool_message_semantics_tool_call_content_is_a_tool_call() -> None:
    block = ToolCallContent("c1", "add", {"value": 5}, '{"value": 5}')
    assert isinstance(block, ToolCall)  # one type wraps the other: the five fields are declared once
    assert [f.name for f in dataclasses.fields(ToolCallContent)] == [
        *(f.name for f in dataclasses.fields(ToolCall)),
        "type",
    ]
    assert block.to_tool_call() == ToolCall("c1", "add", {"value": 5}, '{"value": 5}')
    assert ToolCallContent.of(block.to_tool_call()) == block
    assert block != block.to_tool_call()  # a block is not a plain call (dataclass equality)
    message = Message("assistant", (block,))
    assert message.to_dict()["content"] == [
        {"id": "c1", "name": "add", "arguments": {"value": 5}, "raw_arguments": '{"value": 5}', "type": "tool_call"}
    ]
    assert block.to_dict() == {"id": "c1", "name": "add", "arguments": {"value": 5}, "raw_arguments": '{"value": 5}'}
    assert Message.from_dict(message.to_dict()) == message
