"""Reflection: show a model the current text and what happened with it, read back a new text.

The default prompt puts the current text in a fenced block first, then the examples (inputs,
what the agent did, score, feedback), then asks for the new text inside a fenced block. The
answer's fenced block is the new text; an answer without one is an error that says so
(`ReflectionParseError`), never silently taken as the new prompt.

    prompt = build_reflection_prompt(current_text, records)
    answer = await call_reflection_model(endpoint, prompt)
    new_text = extract_new_text(answer)
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rollouts.agents import rollout
from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.errors import ConfigurationError, RolloutsError
from rollouts.events import ignore_chunk

__all__ = [
    "DEFAULT_REFLECTION_PROMPT",
    "ReflectionParseError",
    "build_reflection_prompt",
    "call_reflection_model",
    "check_prompt_template",
    "extract_new_text",
    "render_records",
]

CURRENT = "<current_text>"
EXAMPLES = "<examples>"
COMPONENT = "<component>"
_MARKERS = re.compile("|".join(re.escape(m) for m in (CURRENT, EXAMPLES, COMPONENT)))

DEFAULT_REFLECTION_PROMPT = f"""I gave an assistant the following instructions ({COMPONENT}) for a task:

{CURRENT}

Below are examples of task inputs, what the assistant did with them, the score it got (higher is
better) and feedback on how its response could be better.

{EXAMPLES}

Your task is to write a new version of the instructions for the assistant.

Read the inputs carefully: infer the input format and a detailed description of the task.
Read every response and its feedback. Include in the new instructions all the specific facts and
rules the feedback reveals, since the assistant will not see this feedback again, and any
general strategy that worked. Keep what already works in the current instructions.

Write the complete new instructions inside a ``` fenced block, and nothing else inside it."""


class ReflectionParseError(RolloutsError):
    """The reflection model's answer holds no usable new text."""


def check_prompt_template(template: str) -> None:
    """Raise ConfigurationError unless `template` has the <current_text> and <examples> markers."""
    missing = [m for m in (CURRENT, EXAMPLES) if m not in template]
    if missing:
        raise ConfigurationError(
            f"the reflection prompt template lacks {' and '.join(missing)}: put {CURRENT} where the current "
            f"text goes (it is fenced for you) and {EXAMPLES} where the examples go ({COMPONENT} is optional)"
        )


def _fence_for(text: str) -> str:
    """A backtick fence longer than any backtick run inside `text` (``` normally)."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _render_value(value: Any, level: int) -> str:
    if isinstance(value, Mapping):
        return "\n".join(f"{'#' * level} {k}\n{_render_value(v, level + 1)}" for k, v in value.items())
    if isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
        return "\n".join(f"{'#' * level} Item {i}\n{_render_value(v, level + 1)}" for i, v in enumerate(value, 1))
    return str(value).strip()


def render_records(records: Sequence[Mapping[str, Any]]) -> str:
    """Examples as markdown: `# Example N`, then `## <key>` sections (nested dicts go deeper)."""
    return "\n\n".join(f"# Example {n}\n{_render_value(r, 2)}" for n, r in enumerate(records, 1))


def build_reflection_prompt(
    current_text: str,
    records: Sequence[Mapping[str, Any]],
    *,
    component: str = "instructions",
    template: str = DEFAULT_REFLECTION_PROMPT,
) -> str:
    """The prompt: `template` with the current text (fenced) and the rendered examples."""
    fence = _fence_for(current_text)
    values = {
        CURRENT: f"{fence}\n{current_text}\n{fence}",
        EXAMPLES: render_records(records),
        COMPONENT: component,
    }
    # One pass over the template: a marker inside the text or the examples stays as it is.
    return _MARKERS.sub(lambda m: values[m.group(0)], template)


_FENCE = re.compile(r"`{3,}")
_LANG_TAG = re.compile(r"[A-Za-z0-9_+.-]{1,20}\n")


def extract_new_text(answer: str, component: str | None = None) -> str:
    """The new text: what is between the first fence of the answer and the last fence of the
    same length (so fenced code inside the text survives), without a language tag such as
    "```markdown" and without surrounding blank lines. A ```json block holding one object with
    one string value under the component's name (`{"system_prompt": "..."}`, as small models
    sometimes answer) gives that string.

    Raises ReflectionParseError, with the start of the answer, when the answer has no fence,
    opens one it never closes (often: cut off by max_tokens), or fences nothing."""
    preview = " ".join(answer.split())[:160]
    opening = _FENCE.search(answer)
    if opening is None:
        raise ReflectionParseError(
            f"the reflection answer has no ``` fenced block, so it holds no new text (answer: {preview!r}); "
            "the reflection model must write the new text inside ``` ... ```"
        )
    fence = opening.group(0)
    closing = None
    for m in _FENCE.finditer(answer, opening.end()):
        if len(m.group(0)) == len(fence):
            closing = m
    if closing is None:
        raise ReflectionParseError(
            f"the reflection answer opens a {fence} block but never closes it (was it cut off? raise the "
            f"reflection endpoint's max_tokens) (answer: {preview!r})"
        )
    body = answer[opening.end() : closing.start()]
    tag = _LANG_TAG.match(body)
    if tag is not None:
        body = body[tag.end() :]
    text = body.strip("\n")
    if not text.strip():
        raise ReflectionParseError(f"the reflection answer's fenced block is empty (answer: {preview!r})")
    if tag is not None and tag.group(0).strip().lower() == "json" and component is not None:
        try:
            wrapped = json.loads(text)
        except ValueError:
            return text
        if isinstance(wrapped, dict) and list(wrapped) == [component] and isinstance(wrapped[component], str):
            inner: str = wrapped[component].strip("\n")
            if inner.strip():
                return inner
    return text


async def call_reflection_model(endpoint: Endpoint, prompt: str) -> str:
    """One call to `endpoint` with `prompt` as the user message; the answer's text. Provider
    errors (after the endpoint's own retries) propagate as `ProviderError`."""
    actor = Actor(Trajectory((Message("user", prompt),)), endpoint)
    done = await rollout(actor, ignore_chunk)
    return done.trajectory.messages[-1].text
