"""Token in, token out (`RunConfig.use_tito`): prompts built as token ids, turn after turn.

A trainer must see exactly the tokens the model sampled: rendering the conversation to text and
tokenising it again can give other ids (merges across the turn boundary, a template that
rewrites assistant messages), and the policy gradient would then be taken on tokens the model
never produced. So a token-exact provider builds each prompt like this:

* the first model call renders the conversation with the model's chat template and tokenises it;
* every later call takes the previous call's `prompt_ids + completion_ids` unchanged and appends
  only the tokens of what came after it: the rest of the assistant turn's closing text (e.g.
  `<|im_end|>\\n` when the model stopped on `<|im_end|>`), then the new messages (tool results,
  user or environment messages) rendered by the template, with the generation prompt. Those
  appended tokens are not the model's, so a trainer gives them a loss mask of 0.

The new messages are rendered as the template would render them after a short dummy exchange,
and only the text after that exchange is kept, so templates that add a default system prompt or
number turns still give the right delta.

`ChatTokenizer` is what a provider supplies for this (the in-process model's tokenizer, or a
server's `/apply-template` and `/tokenize` endpoints). `get_token_provider_function` maps an
Endpoint's provider to its token-exact function: `transformers` (in-process torch model), the
llama.cpp server (`local`, `llamacpp`) and vLLM (`vllm`); other providers raise a ConfigurationError.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from rollouts.dtypes import Completion, Message, TextContent, Tool, ToolCallContent, Trajectory
from rollouts.errors import ConfigurationError
from rollouts.providers import ProviderFn

# provider name -> "module:attribute" of its token-exact ProviderFn (imported on first use)
_TOKEN_PROVIDERS: dict[str, str] = {
    "transformers": "rollouts.providers.transformers_local:stream_transformers",
    "local": "rollouts.providers.openai_tokens:stream_local_tokens",
    "llamacpp": "rollouts.providers.openai_tokens:stream_llamacpp_tokens",
    "vllm": "rollouts.providers.openai_tokens:stream_vllm_tokens",
}
_REGISTERED: dict[str, ProviderFn] = {}


def register_token_provider(name: str, fn: ProviderFn) -> None:
    """Register the token-exact variant of provider `name` (used when `RunConfig.use_tito`)."""
    _REGISTERED[name] = fn


def get_token_provider_function(provider: str) -> ProviderFn:
    """The token-exact stream function for `provider`; ConfigurationError names those that have one."""
    fn = _REGISTERED.get(provider)
    if fn is not None:
        return fn
    target = _TOKEN_PROVIDERS.get(provider)
    if target is None:
        known = ", ".join(sorted(set(_TOKEN_PROVIDERS) | set(_REGISTERED)))
        raise ConfigurationError(
            f"RunConfig.use_tito needs a provider that returns token ids and log-probs; {provider!r} "
            f"does not (token-exact providers: {known})"
        )
    module_name, _, attr = target.partition(":")
    fn = cast(ProviderFn, getattr(importlib.import_module(module_name), attr))
    _REGISTERED[provider] = fn
    return fn


class ChatTokenizer(Protocol):
    """A chat template and tokenizer, possibly behind a server (hence async)."""

    async def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        generation_prompt: bool,
    ) -> str:
        """The template applied to `messages` (with `tools` if the template takes them)."""
        ...

    async def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token text parsed as special tokens, no BOS added."""
        ...

    async def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens included."""
        ...


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Tools in the OpenAI function format templates expect."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
    ]


def tools_instruction(tools: Sequence[Tool]) -> str:
    """A system-prompt paragraph describing `tools`, for templates that ignore the `tools` argument."""
    lines = [
        "You can call tools. To call one, reply with only a JSON object: "
        '{"name": <tool name>, "arguments": {<argument>: <value>}}. Tools:'
    ]
    for t in tools:
        lines.append(f"- {t.name}: {t.description} Arguments (JSON schema): {json.dumps(dict(t.parameters))}")
    return "\n".join(lines)


def template_message(message: Message) -> dict[str, Any]:
    """One message as a chat-template dict: text, with an assistant's tool calls written as the
    JSON objects text-tool-call models produce."""
    if message.role != "assistant":
        out: dict[str, Any] = {"role": message.role, "content": message.text}
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        return out
    parts: list[str] = []
    for b in message.blocks:
        if isinstance(b, TextContent):
            parts.append(b.text)
        elif isinstance(b, ToolCallContent):
            parts.append(json.dumps({"name": b.name, "arguments": dict(b.arguments)}))
    return {"role": "assistant", "content": "".join(parts)}


_DUMMY_USER = {"role": "user", "content": "ping"}
_DUMMY_REPLY = "pong"


async def _with_tools_in_system(
    tok: ChatTokenizer, messages: list[dict[str, Any]], tools: Sequence[Tool]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """`(messages, tools)` to render: the tools go to the template when it uses them, else into
    the system message as `tools_instruction` text."""
    if not tools:
        return messages, None
    schemas = tool_schemas(tools)
    plain = await tok.render([_DUMMY_USER], tools=None, generation_prompt=True)
    with_tools = await tok.render([_DUMMY_USER], tools=schemas, generation_prompt=True)
    if plain != with_tools:
        return messages, schemas
    text = tools_instruction(tools)
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
        return [first, *messages[1:]], None
    return [{"role": "system", "content": text}, *messages], None


async def turn_end_text(tok: ChatTokenizer) -> str:
    """What the template writes after an assistant message's content (e.g. `<|im_end|>\\n`)."""
    start = await tok.render([_DUMMY_USER], tools=None, generation_prompt=True)
    full = await tok.render(
        [_DUMMY_USER, {"role": "assistant", "content": _DUMMY_REPLY}], tools=None, generation_prompt=False
    )
    head = start + _DUMMY_REPLY
    if not full.startswith(head):
        raise ConfigurationError(
            "token-exact rollouts need a chat template that renders an assistant message as the "
            "generation prompt followed by its content; this template does not"
        )
    return full[len(head) :]


async def messages_delta_text(tok: ChatTokenizer, messages: Sequence[Message]) -> str:
    """The text the template adds for `messages` after an assistant turn, generation prompt included."""
    prefix = [_DUMMY_USER, {"role": "assistant", "content": _DUMMY_REPLY}]
    before = await tok.render(prefix, tools=None, generation_prompt=False)
    after = await tok.render([*prefix, *(template_message(m) for m in messages)], tools=None, generation_prompt=True)
    if not after.startswith(before):
        raise ConfigurationError(
            "token-exact rollouts need a chat template whose rendering of a conversation starts with "
            "its rendering of the conversation's beginning; this template does not"
        )
    return after[len(before) :]


def last_token_completion(trajectory: Trajectory) -> Completion | None:
    """The last model call of `trajectory` that recorded tokens, or None."""
    for c in reversed(trajectory.completions):
        if c.tokens is not None:
            return c
    return None


async def next_prompt_ids(tok: ChatTokenizer, trajectory: Trajectory, tools: Sequence[Tool]) -> list[int]:
    """The prompt token ids for the next model call on `trajectory` (see the module docstring)."""
    messages = trajectory.messages
    prev = last_token_completion(trajectory)
    if prev is None:
        # Any history given as text (few-shot turns, a resumed session) is rendered once here.
        dicts, schemas = await _with_tools_in_system(tok, [template_message(m) for m in messages], tools)
        return await tok.encode(await tok.render(dicts, tools=schemas, generation_prompt=True))
    assert prev.tokens is not None
    assert 0 <= prev.message_index < len(messages), "a completion's message_index must point into the trajectory"
    new = messages[prev.message_index + 1 :]
    if any(m.role == "assistant" for m in new):
        raise ConfigurationError(
            "token-exact rollout: an assistant message was added after the last model call without its "
            "tokens (a handler wrote it?); add user or tool messages instead"
        )
    end = await turn_end_text(tok)
    ids = prev.tokens.completion_ids
    if ids and prev.finish_reason != "max_tokens":
        # The model wrote the start of the closing text itself (it stopped on `<|im_end|>`): drop
        # it from `end` only when its last id IS that token — a reply cut after a literal "<"
        # must still be closed by the special token, not by the characters "|im_end|>".
        end_ids = await tok.encode(end)
        if end_ids and ids[-1] == end_ids[0]:
            first = await tok.decode(end_ids[:1])
            if first and end.startswith(first):
                end = end[len(first) :]
    delta = end + await messages_delta_text(tok, new)
    return [*prev.tokens.prompt_ids, *prev.tokens.completion_ids, *(await tok.encode(delta))]


# --------------------------------------------------------------------------------------------
# Sampling seeds
# --------------------------------------------------------------------------------------------

_SAMPLING_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("rollouts_sampling_seed", default=None)


def set_sampling_seed(seed: int | None) -> None:
    """Seed the model calls made from now on by the current task (and tasks it starts).

    Token-exact providers then sample call k of a conversation with the seed `(seed, k)`, so a
    rollout's tokens depend only on the seed and the weights, not on which other requests were
    batched with it or in which order tasks ran: a training run resumed after a crash samples
    the same tokens. Set it at the start of a sample's task (evaluate's `on_sample_start` runs
    there)."""
    _SAMPLING_SEED.set(seed)


def call_seed(trajectory: Trajectory, endpoint_seed: Any = None) -> int | None:
    """The seed for the next model call on `trajectory`: from `set_sampling_seed` (mixed with the
    call's index), else the Endpoint's `extra_params["seed"]`, else None (unseeded)."""
    base = _SAMPLING_SEED.get()
    if base is None:
        return int(endpoint_seed) if endpoint_seed is not None else None
    digest = hashlib.sha256(f"{base}:{len(trajectory.completions)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
