"""The reflection prompt (current text fenced first, then the examples) and the extraction of the
new text from the answer, including answers without a fence."""

from __future__ import annotations

import pytest

from rollouts import Endpoint, ScriptedModel
from rollouts.errors import ConfigurationError
from rollouts.gepa import GEPAConfig
from rollouts.gepa.reflection import (
    DEFAULT_REFLECTION_PROMPT,
    ReflectionParseError,
    build_reflection_prompt,
    call_reflection_model,
    check_prompt_template,
    extract_new_text,
    render_records,
)

RECORDS = [
    {"Inputs": "What is 2 + 2?", "Agent trajectory": "[assistant]\n5", "Score": "0", "Feedback": "Expected 4."},
    {"Inputs": {"question": "3 * 3", "context": "none"}, "Score": "1", "Feedback": "Correct."},
]


def test_prompt_shows_current_text_in_the_first_fenced_block_then_the_examples() -> None:
    prompt = build_reflection_prompt("Be a calculator.\nUse digits.", RECORDS, component="system_prompt")
    parts = prompt.split("```")
    assert parts[1] == "\nBe a calculator.\nUse digits.\n"  # the first fenced block is the text, verbatim
    after = "```".join(parts[2:])
    assert after.index("# Example 1") < after.index("# Example 2")
    assert "## Feedback\nExpected 4." in after
    assert "## Inputs\n### question\n3 * 3" in after  # nested records go one level deeper
    assert "(system_prompt)" in prompt
    assert prompt.rstrip().endswith("inside a ``` fenced block, and nothing else inside it.")


def test_prompt_fences_text_that_contains_fences_with_a_longer_fence() -> None:
    text = "Answer like this:\n```\nAnswer: 4\n```"
    prompt = build_reflection_prompt(text, RECORDS)
    assert "````\n" + text + "\n````" in prompt
    assert extract_new_text("Sure:\n````\n" + text + "\n````") == text


def test_a_json_answer_naming_the_component_gives_its_text() -> None:
    answer = 'Here:\n```json\n{\n  "system_prompt": "Be a calculator.\\nUse digits."\n}\n```'
    assert extract_new_text(answer, "system_prompt") == "Be a calculator.\nUse digits."
    # without the component, under another key, or not a ```json block: the fenced text as it is
    assert extract_new_text(answer).startswith('{\n  "system_prompt"')
    assert extract_new_text(answer, "other").startswith('{\n  "system_prompt"')
    plain = '```\n{"system_prompt": "x"}\n```'
    assert extract_new_text(plain, "system_prompt") == '{"system_prompt": "x"}'


def test_markers_inside_the_text_or_examples_are_not_replaced() -> None:
    text = "Mention <examples> literally."
    prompt = build_reflection_prompt(text, [{"Feedback": "said <current_text>"}])
    assert "Mention <examples> literally." in prompt
    assert "said <current_text>" in prompt


def test_custom_templates_need_both_markers() -> None:
    check_prompt_template("Text:\n<current_text>\nExamples:\n<examples>")
    with pytest.raises(ConfigurationError, match="<examples>"):
        check_prompt_template("Improve:\n<current_text>")
    with pytest.raises(ConfigurationError, match="<current_text>"):
        GEPAConfig(max_metric_calls=10, reflection_prompt="only <examples>")
    prompt = build_reflection_prompt("T", RECORDS, template="<current_text>|<examples>")
    assert prompt.startswith("```\nT\n```|# Example 1")
    assert DEFAULT_REFLECTION_PROMPT.index("<current_text>") < DEFAULT_REFLECTION_PROMPT.index("<examples>")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Here it is:\n```\nNew text.\nLine two.\n```\nHope that helps.", "New text.\nLine two."),
        ("```markdown\n# Role\nBe brief.\n```", "# Role\nBe brief."),
        ("```text\nPlain.\n```", "Plain."),
        ("```Be brief and exact.```", "Be brief and exact."),
        # fenced code inside the new text survives: first fence to the last one
        ("```\nFormat:\n```json\n{}\n```\nDone.\n```", "Format:\n```json\n{}\n```\nDone."),
        ("```\n\n  indented first line\n\n```", "  indented first line"),
    ],
)
def test_extract_new_text(answer: str, expected: str) -> None:
    assert extract_new_text(answer) == expected


def test_answer_without_a_fence_is_a_clear_error_not_a_new_prompt() -> None:
    with pytest.raises(ReflectionParseError, match="no ``` fenced block") as info:
        extract_new_text("Sure! You should tell the assistant to be careful with signs.")
    assert "be careful with signs" in str(info.value)  # the answer is quoted


def test_unclosed_fence_says_the_answer_may_be_cut_off() -> None:
    with pytest.raises(ReflectionParseError, match=r"never closes it.*max_tokens"):
        extract_new_text("```\nYou are a calculator. Always")


def test_empty_fence_is_an_error() -> None:
    with pytest.raises(ReflectionParseError, match="empty"):
        extract_new_text("```\n\n```")


def test_render_records_numbers_examples() -> None:
    text = render_records(RECORDS)
    assert text.startswith("# Example 1\n## Inputs\nWhat is 2 + 2?")
    assert "\n\n# Example 2\n" in text


async def test_reflection_goes_through_an_endpoint() -> None:
    seen = []

    def reply(req):  # type: ignore[no-untyped-def]
        seen.append(req.last_user_text)
        return "New:\n```\nBe exact.\n```"

    model = ScriptedModel(reply)
    answer = await call_reflection_model(model.endpoint, "improve this")
    assert extract_new_text(answer) == "Be exact."
    assert seen == ["improve this"]
    assert isinstance(model.endpoint, Endpoint)
