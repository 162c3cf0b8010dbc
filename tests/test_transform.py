"""Cross-provider history transformation (`rollouts.providers._transform`)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from rollouts.dtypes import Message, TextContent, ThinkingContent, ToolCallContent
from rollouts.providers import anthropic as anthropic_provider
from rollouts.providers import google as google_provider
from rollouts.providers import openai_responses
from rollouts.providers._transform import chat_target, map_tool_call_id, transform_history

ANTHROPIC = anthropic_provider.TARGET
RESPONSES = openai_responses.TARGET
GOOGLE = google_provider.TARGET
SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def _assistant(*blocks: object, provider: str = "anthropic") -> Message:
    return Message("assistant", tuple(blocks), provider=provider, model="m")  # type: ignore[arg-type]


def _tool(call_id: str, text: str = "ok") -> Message:
    return Message("tool", text, tool_call_id=call_id, details={"tool_name": "add"})


def test_native_thinking_is_kept_verbatim_and_nothing_is_copied() -> None:
    msgs = (
        Message("user", "hi"),
        _assistant(
            ThinkingContent("let me think", signature="sig-1", provider="anthropic"),
            ThinkingContent("", redacted=True, data="opaque", provider="anthropic"),
            TextContent("Hello"),
        ),
    )
    assert transform_history(msgs, ANTHROPIC) is msgs


def test_foreign_thinking_becomes_text_in_place_and_unreadable_thinking_is_dropped() -> None:
    msgs = (
        Message("user", "hi"),
        _assistant(
            ThinkingContent("plan: add 5", signature='{"id":"rs_1"}', provider="openai-responses"),
            ThinkingContent("", redacted=True, data="opaque", provider="openai-responses"),
            TextContent("Adding."),
            ToolCallContent("call_1", "add", {"value": 5}),
            provider="openai-responses",
        ),
        _tool("call_1"),
    )
    out = transform_history(msgs, ANTHROPIC)
    assert out[1].content == (
        TextContent("<thinking>\nplan: add 5\n</thinking>"),
        TextContent("Adding."),
        ToolCallContent("call_1", "add", {"value": 5}),
    )
    assert out[0] is msgs[0] and out[2] is msgs[2]


def test_anthropic_thinking_without_signature_cannot_go_back_as_thinking() -> None:
    msgs = (Message("user", "hi"), _assistant(ThinkingContent("unsigned", provider="anthropic"), TextContent("x")))
    out = transform_history(msgs, ANTHROPIC)
    assert out[1].content == (TextContent("<thinking>\nunsigned\n</thinking>"), TextContent("x"))


def test_block_without_provider_falls_back_to_the_message_provider() -> None:
    block = ThinkingContent("old session", signature="s")
    msgs = (Message("user", "hi"), _assistant(block, provider="anthropic"))
    assert transform_history(msgs, ANTHROPIC) is msgs
    assert transform_history(msgs, GOOGLE)[1].content == (TextContent("<thinking>\nold session\n</thinking>"),)


def test_missing_tool_results_get_synthetic_error_results_in_the_right_place() -> None:
    msgs = (
        Message("user", "go"),
        _assistant(ToolCallContent("a", "add", {}), ToolCallContent("b", "add", {}), ToolCallContent("c", "add", {})),
        _tool("b", "2"),
        Message("user", "and then?"),
        _assistant(ToolCallContent("d", "add", {})),
    )
    out = transform_history(msgs, ANTHROPIC)
    roles = [(m.role, m.tool_call_id) for m in out]
    assert roles == [
        ("user", None),
        ("assistant", None),
        ("tool", "b"),
        ("tool", "a"),
        ("tool", "c"),
        ("user", None),
        ("assistant", None),
        ("tool", "d"),
    ]
    synthetic = [m for m in out if m.details and m.details.get("synthetic")]
    assert [m.tool_call_id for m in synthetic] == ["a", "c", "d"]
    assert all(m.details and m.details["is_error"] and "not executed" in m.text for m in synthetic)
    assert out[2] is msgs[2]


def test_orphan_and_duplicate_results_become_user_text() -> None:
    msgs = (
        Message("user", "go"),
        _assistant(ToolCallContent("a", "add", {})),
        _tool("a", "1"),
        _tool("a", "again"),
        _tool("zzz", "stray"),
    )
    out = transform_history(msgs, ANTHROPIC)
    assert [m.role for m in out] == ["user", "assistant", "tool", "user", "user"]
    assert out[3].text == "[Result of tool call a]\nagain"
    assert out[4].text == "[Result of tool call zzz]\nstray"


def test_ids_are_mapped_consistently_in_calls_and_results() -> None:
    long_id = "call_" + "x" * 80
    msgs = (
        Message("user", "go"),
        _assistant(ToolCallContent("call_1|fc_1", "add", {}), ToolCallContent(long_id, "add", {})),
        _tool("call_1|fc_1"),
        _tool(long_id),
    )
    out = transform_history(msgs, ANTHROPIC)
    calls = [b.id for b in out[1].content if isinstance(b, ToolCallContent)]
    assert [m.tool_call_id for m in out[2:]] == calls
    assert all(SAFE.match(c) and len(c) <= 64 for c in calls)
    assert calls[0].startswith("call_1_fc_1_")
    # deterministic: a later request of the same conversation maps the same way
    again = transform_history(msgs + (Message("user", "more"),), ANTHROPIC)
    assert [b.id for b in again[1].content if isinstance(b, ToolCallContent)] == calls
    # OpenAI chat allows 40 characters
    chat = transform_history(msgs, chat_target("openai"))
    assert all(len(b.id) <= 40 for b in chat[1].content if isinstance(b, ToolCallContent))


def test_responses_keeps_its_own_composite_ids() -> None:
    msgs = (Message("user", "go"), _assistant(ToolCallContent("call_1|fc_1", "add", {})), _tool("call_1|fc_1"))
    assert transform_history(msgs, RESPONSES) is msgs
    bad = (Message("user", "go"), _assistant(ToolCallContent("a.b", "add", {})), _tool("a.b"))
    out = transform_history(bad, RESPONSES)
    assert out[1].content[0].id == out[2].tool_call_id == map_tool_call_id("a.b")  # type: ignore[union-attr]


@given(st.lists(st.text(min_size=1, max_size=120), min_size=1, max_size=20, unique=True))
def test_mapped_ids_are_valid_and_distinct(ids: list[str]) -> None:
    for max_len in (40, 64):
        mapped = {map_tool_call_id(i, max_len) for i in ids}
        assert len(mapped) == len(ids)
        assert all(SAFE.match(m) and len(m) <= max_len for m in mapped)


def test_a_reply_cut_short_is_never_sent_as_a_prefill() -> None:
    """Issue 13 item 9, for every provider: an aborted reply is dropped when last or when a
    later reply replaced it, and kept as context before a new user message."""

    q = Message("user", "q")
    cut = Message("assistant", "The ans", details={"aborted": True})
    answer = Message("assistant", "The answer is 42.")
    then = Message("user", "Go on.")
    for target in (chat_target("openai"), anthropic_provider.TARGET, google_provider.TARGET, openai_responses.TARGET):
        assert transform_history((q, cut), target) == (q,)
        assert transform_history((q, cut, answer), target) == (q, answer)
        assert transform_history((q, cut, then), target) == (q, cut, then)
