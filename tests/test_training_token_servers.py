"""Token-exact rollouts through servers: llama.cpp at the wire against the fake server (a llama.cpp
format with a character tokenizer) and against the real embedded model (tier local_model), and
vLLM at the wire."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from rollouts.agents import run_agent
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.eval.sample import Sample
from rollouts.providers.openai_tokens import LlamaCppChatTokenizer
from rollouts.providers.scripted import ScriptedReply
from rollouts.run_config import RunConfig
from rollouts.testing import open_fake_server
from rollouts.testing.fake_server import RecordedRequest, RenderContext, sse
from rollouts.training import TrainingSample, token_view
from rollouts.training.tiny import CHAT_TEMPLATE

SPECIAL = {"<|im_start|>": 1000, "<|im_end|>": 1001}
BY_ID = {v: k for k, v in SPECIAL.items()}


def fake_tokenize(text: str) -> list[int]:
    ids: list[int] = []
    i = 0
    while i < len(text):
        for tok, tid in SPECIAL.items():
            if text.startswith(tok, i):
                ids.append(tid)
                i += len(tok)
                break
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def fake_detokenize(ids: list[int]) -> str:
    return "".join(BY_ID.get(t) or chr(t) for t in ids)


class LlamaCppFormat:
    """llama.cpp's native endpoints: /props, /tokenize, /detokenize, and /completion with a
    token-id prompt, streaming `tokens` and `completion_probabilities` (one character = one
    token; the reply ends with <|im_end|>, or stops at n_predict)."""

    name = "llamacpp"

    def matches(self, method: str, path: str) -> bool:
        return path in ("/props", "/tokenize", "/detokenize", "/completion")

    def static_response(self, request: RecordedRequest) -> Any | None:
        body = request.body if isinstance(request.body, dict) else {}
        if request.path == "/props":
            return {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "<|im_end|>"}
        if request.path == "/tokenize":
            assert body["parse_special"] is True and body["add_special"] is False
            return {"tokens": fake_tokenize(body["content"])}
        if request.path == "/detokenize":
            return {"content": fake_detokenize(body["tokens"])}
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return bool(request.json.get("stream"))

    def _tokens(self, reply: ScriptedReply, request: RecordedRequest) -> tuple[list[int], str]:
        text = reply.text
        ids = [*fake_tokenize(text), SPECIAL["<|im_end|>"]]
        limit = request.json["n_predict"]
        return (ids[:limit], "limit") if len(ids) > limit else (ids, "eos")

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        assert all(isinstance(t, int) for t in request.json["prompt"]), "the prompt must be token ids"
        ids, stop_type = self._tokens(reply, request)
        events = []
        for i, t in enumerate(ids):
            content = "" if t in BY_ID else chr(t)
            prob = {"id": t, "token": content, "bytes": [], "logprob": -0.01 * (i + 1), "top_logprobs": []}
            events.append(sse({"content": content, "tokens": [t], "stop": False, "completion_probabilities": [prob]}))
        events.append(sse({"content": "", "tokens": [], "stop": True, "stop_type": stop_type}))
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        raise AssertionError("the token path streams")

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        return {"error": {"code": status, "message": message}}


ADD = json.dumps({"name": "add", "arguments": {"value": 5}})
DONE = json.dumps({"name": "complete_task", "arguments": {"final_result": "5"}})


async def test_llamacpp_token_path_at_the_wire() -> None:
    async with open_fake_server([ADD, DONE], formats=[LlamaCppFormat()]) as srv:
        endpoint = Endpoint("llamacpp", "fake", api_base=srv.base_url, max_tokens=200, temperature=1.0)
        env = CalculatorEnvironment()
        state = AgentState(Actor(Trajectory((Message("user", "add 5"),)), endpoint, tuple(env.get_tools())), env)
        states = await run_agent(state, RunConfig(use_tito=True, max_turns=4))
        completions = [r for r in srv.requests if r.path == "/completion"]
    traj = states[-1].actor.trajectory
    assert states[-1].stop is not None and states[-1].stop.value == "task_completed"
    assert [c.name for m in traj.messages for c in m.get_tool_calls()] == ["add", "complete_task"]
    first, second = (c.tokens for c in traj.completions)
    assert first is not None and second is not None
    # what was sent: the rendered conversation as ids, then the previous ids extended
    assert completions[0].json["prompt"] == list(first.prompt_ids)
    assert completions[1].json["prompt"] == list(second.prompt_ids)
    assert completions[0].json["return_tokens"] is True and completions[0].json["n_probs"] == 1
    assert completions[0].json["top_k"] == 0 and completions[0].json["stream"] is True
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    # what came back: ids and log-probs as the server sent them, consistent with the text
    assert fake_detokenize(list(first.completion_ids)) == ADD + "<|im_end|>"
    assert first.logprobs == tuple(-0.01 * (i + 1) for i in range(len(first.completion_ids)))
    appended = fake_detokenize(list(second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]))
    assert appended == "\n<|im_start|>tool\nAdded 5 to 0. Current value: 5<|im_end|>\n<|im_start|>assistant\n"
    sample = TrainingSample.from_eval_sample(Sample("s", {}, traj, status="completed"), 0)
    model_text = fake_detokenize([t for t, m in zip(sample.tokens, sample.loss_mask, strict=True) if m])
    assert model_text == ADD + "<|im_end|>" + DONE + "<|im_end|>"


async def test_llamacpp_token_path_records_a_truncated_reply_and_closes_the_turn() -> None:
    async with open_fake_server(["abcdefgh", "ok"], formats=[LlamaCppFormat()]) as srv:
        endpoint = Endpoint("llamacpp", "fake", api_base=srv.base_url, max_tokens=4, temperature=1.0)
        state = AgentState(Actor(Trajectory((Message("user", "hi"),)), endpoint))
        states = await run_agent(state, RunConfig(use_tito=True, max_turns=1))
        traj = states[-1].actor.trajectory
        assert traj.completions[0].finish_reason == "max_tokens"
        assert traj.messages[-1].text == "abcd"
        follow = AgentState(Actor(traj.append(Message("user", "go on")), endpoint))
        states = await run_agent(follow, RunConfig(use_tito=True, max_turns=1))
    first, second = (c.tokens for c in states[-1].actor.trajectory.completions)
    assert first is not None and second is not None
    tail = fake_detokenize(list(second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]))
    # the model never wrote <|im_end|>, so the turn is closed for it (and not trained on)
    assert tail == "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"


async def test_defect2_a_reply_cut_at_max_tokens_after_a_text_tool_call_stays_truncated_and_is_closed_by_the_special_token() -> (
    None
):
    """The model writes a text tool call, then a literal "<", and max_tokens cuts it there. The
    stream used to report tool_use, and the next prompt then took the "<" for the start of
    `<|im_end|>` and closed the turn with the characters "|im_end|>"."""
    async with open_fake_server([ADD + "<", DONE], formats=[LlamaCppFormat()]) as srv:
        endpoint = Endpoint("llamacpp", "fake", api_base=srv.base_url, max_tokens=len(ADD) + 1, temperature=1.0)
        env = CalculatorEnvironment()
        state = AgentState(Actor(Trajectory((Message("user", "add 5"),)), endpoint, tuple(env.get_tools())), env)
        states = await run_agent(state, RunConfig(use_tito=True, max_turns=2))
    traj = states[-1].actor.trajectory
    assert traj.completions[0].finish_reason == "max_tokens"
    first, second = (c.tokens for c in traj.completions)
    assert first is not None and second is not None
    assert fake_detokenize(list(first.completion_ids)) == ADD + "<"  # cut before <|im_end|>
    appended = list(second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :])
    assert appended[0] == SPECIAL["<|im_end|>"]  # the special token, not "|", "i", "m", ...
    assert fake_detokenize(appended).startswith("<|im_end|>\n<|im_start|>tool\n")


# ---------------------------------------------------------------------------------------------
# The real embedded model
# ---------------------------------------------------------------------------------------------


@pytest.mark.local_model
async def test_embedded_llamacpp_returns_token_ids_and_logprobs_consistent_with_its_text() -> None:
    from rollouts.local_model import ensure_local_server

    endpoint = Endpoint("local", "qwen2.5-coder-0.5b", max_tokens=48, temperature=1.0)
    env = CalculatorEnvironment()
    question = "Use the tools: add 5, then call complete_task with the current value."
    state = AgentState(Actor(Trajectory((Message("user", question),)), endpoint, tuple(env.get_tools())), env)
    states = await run_agent(state, RunConfig(use_tito=True, max_turns=3))
    traj = states[-1].actor.trajectory
    server = await ensure_local_server()
    tok = LlamaCppChatTokenizer(Endpoint("llamacpp", "x", api_base=server.api_base))
    assert traj.completions and all(c.tokens is not None for c in traj.completions)
    for c in traj.completions:
        rec = c.tokens
        assert rec is not None and len(rec.completion_ids) == len(rec.logprobs) > 0
        assert all(math.isfinite(lp) and lp <= 0 for lp in rec.logprobs)
        text = await tok.decode(rec.completion_ids)
        message = traj.messages[c.message_index]
        # the model either ended its turn or ran into max_tokens (a reply cut there can still hold
        # a whole tool call, and then its finish_reason is tool_use, not max_tokens)
        assert text.endswith("<|im_end|>") or len(rec.completion_ids) == endpoint.max_tokens, text
        # the message is the sampled text (tool calls written as JSON became tool calls)
        visible = text.removesuffix("<|im_end|>")
        assert message.text in visible
        for call in message.get_tool_calls():
            assert f'"{call.name}"' in visible
    # the first prompt is the template's rendering, tokenised by the server
    rendered = await tok.render(
        [
            {"role": "user", "content": question},
        ],
        tools=[
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
            }
            for t in env.get_tools()
        ],
        generation_prompt=True,
    )
    assert list(traj.completions[0].tokens.prompt_ids) == await tok.encode(rendered)  # type: ignore[union-attr]
    tokens, mask, logprobs = token_view(traj)
    assert sum(mask) == sum(len(c.tokens.completion_ids) for c in traj.completions)  # type: ignore[union-attr]
    assert len(tokens) == len(logprobs)


# ---------------------------------------------------------------------------------------------
# vLLM
# ---------------------------------------------------------------------------------------------


def _render_chatml(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


class VLLMFormat:
    """vLLM's `/tokenize` (a prompt, or messages through the template), `/detokenize`, and
    streamed `/v1/completions` with a token-id prompt and `return_tokens_as_token_ids`."""

    name = "vllm"

    def matches(self, method: str, path: str) -> bool:
        return path in ("/tokenize", "/detokenize", "/v1/completions")

    def static_response(self, request: RecordedRequest) -> Any | None:
        body = request.body if isinstance(request.body, dict) else {}
        if request.path == "/tokenize":
            assert body["add_special_tokens"] is False
            if "messages" in body:
                return {"tokens": fake_tokenize(_render_chatml(body["messages"], body["add_generation_prompt"]))}
            return {"tokens": fake_tokenize(body["prompt"])}
        if request.path == "/detokenize":
            return {"prompt": fake_detokenize(body["tokens"])}
        return None

    def is_stream(self, request: RecordedRequest) -> bool:
        return bool(request.json.get("stream"))

    def stream_events(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        body = request.json
        assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 0
        assert all(isinstance(t, int) for t in body["prompt"])
        ids = [*fake_tokenize(reply.text), SPECIAL["<|im_end|>"]]
        events = []
        for i in range(0, len(ids), 2):  # two tokens per chunk
            part = ids[i : i + 2]
            last = i + 2 >= len(ids)
            choice = {
                "index": 0,
                "text": fake_detokenize([t for t in part if t not in BY_ID]),
                "logprobs": {"tokens": [f"token_id:{t}" for t in part], "token_logprobs": [-0.5] * len(part)},
                "finish_reason": "stop" if last else None,
            }
            events.append(sse({"id": "cmpl-1", "object": "text_completion", "choices": [choice]}))
        events.append(b"data: [DONE]\n\n")
        return events

    def complete_response(self, reply: ScriptedReply, request: RecordedRequest, ctx: RenderContext) -> Any:
        raise AssertionError("the token path streams")

    def error_body(self, status: int, message: str, code: str | None) -> Any:
        return {"error": {"code": status, "message": message}}


async def test_vllm_token_path_at_the_wire() -> None:
    async with open_fake_server([ADD, DONE], formats=[VLLMFormat()]) as srv:
        endpoint = Endpoint("vllm", "served-model", api_base=srv.base_url, max_tokens=200, temperature=1.0)
        env = CalculatorEnvironment()
        state = AgentState(Actor(Trajectory((Message("user", "add 5"),)), endpoint, tuple(env.get_tools())), env)
        states = await run_agent(state, RunConfig(use_tito=True, max_turns=4))
        sent = [r.json for r in srv.requests if r.path == "/v1/completions"]
    traj = states[-1].actor.trajectory
    assert states[-1].stop is not None and states[-1].stop.value == "task_completed"
    first, second = (c.tokens for c in traj.completions)
    assert first is not None and second is not None
    assert sent[0]["prompt"] == list(first.prompt_ids) and sent[0]["model"] == "served-model"
    assert fake_detokenize(list(first.completion_ids)) == ADD + "<|im_end|>"
    assert first.logprobs == (-0.5,) * len(first.completion_ids)
    assert (
        second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)]
        == first.prompt_ids + first.completion_ids
    )
    appended = fake_detokenize(list(second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]))
    assert appended == "\n<|im_start|>tool\nAdded 5 to 0. Current value: 5<|im_end|>\n<|im_start|>assistant\n"
