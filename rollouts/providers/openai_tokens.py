"""Token-exact rollouts through OpenAI-compatible servers (`RunConfig.use_tito`): llama.cpp
(providers `local`, `llamacpp`) and vLLM (provider `vllm`).

Chat endpoints take text, so they cannot be token-exact. These paths use the servers' own
endpoints instead; prompts are built with `rollouts.providers.tito.next_prompt_ids` (the first
call renders the conversation, later calls extend the previous call's prompt and completion ids):

* llama.cpp: `GET /props` gives the chat template (rendered here with a sandboxed jinja2, as
  transformers renders templates), `POST /tokenize` (special tokens parsed, no BOS) and
  `/detokenize` convert text and ids; `POST /completion` takes the prompt as token ids, streamed,
  with `return_tokens` and `n_probs: 1`, so every chunk carries the sampled ids and their
  log-probs. The samplers are set neutral (`top_k 0, top_p 1, min_p 0`, no penalties) so the
  distribution sampled from is the softmax at `temperature`; llama.cpp reports log-probs of the
  untempered softmax, equal to the sampler's at temperature 1 (use 1.0 for training).
* vLLM: `POST /tokenize` with `messages` applies the template on the server (the ids are turned
  back into text with `/detokenize`), `/tokenize` with `prompt` encodes text; `POST
  /v1/completions` takes the token-id prompt with `logprobs: 0` and `return_tokens_as_token_ids`,
  so each chunk's `logprobs.tokens` are `token_id:N` with `token_logprobs` beside them (vLLM
  reports the log-probs of the distribution it sampled from).

SGLang's `/generate` (`input_ids`, `return_logprob`) offers the same and is not wired yet. Text
deltas stream through the OpenAI chat translator (tool calls written as JSON become tool calls),
so events and the Message match the chat path.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx2
import trio

from rollouts.dtypes import Actor, Completion, Endpoint, TokenRecord
from rollouts.errors import ConfigurationError, ProviderError
from rollouts.events import LLMCallStart, OnChunk, StreamEvent, StreamStart
from rollouts.providers._aggregate import MessageBuilder, append_assistant
from rollouts.providers._chat_format import ChatStreamTranslator
from rollouts.providers._clients import shared_ssl_context
from rollouts.providers._retry import Failure, HTTPStatusFailure, classify_common, stream_with_retries
from rollouts.providers.openai_http import iter_sse_json
from rollouts.providers.tito import call_seed, next_prompt_ids

_MAX_ERROR_BODY = 64 * 1024


@asynccontextmanager
async def http_client(endpoint: Endpoint) -> AsyncIterator[httpx2.AsyncClient]:
    """An httpx2 client for one token-exact call (these calls are few and long: the lean
    transport's pooled connections are for the fan-out of evaluations)."""
    timeout = httpx2.Timeout(endpoint.timeout, connect=min(10.0, endpoint.timeout))
    async with httpx2.AsyncClient(timeout=timeout, verify=shared_ssl_context()) as client:
        yield client


def server_root(api_base: str) -> str:
    """`http://host:port` from an OpenAI-style base URL (`.../v1` dropped)."""
    root = api_base.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


async def _post_json(endpoint: Endpoint, url: str, body: Mapping[str, Any]) -> Any:
    async with http_client(endpoint) as client:
        response = await client.post(
            url, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
    if response.status_code >= 400:
        raise HTTPStatusFailure(response.status_code, dict(response.headers), response.text[:_MAX_ERROR_BODY])
    return response.json()


@dataclass
class _Template:
    source: str
    bos_token: str
    eos_token: str
    compiled: Any


_TEMPLATES: dict[str, _Template] = {}


def _compile(source: str) -> Any:
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigurationError(
            "token-exact rollouts through llama.cpp render the chat template with jinja2: pip install 'rollouts[train]'"
        ) from None

    def raise_exception(message: str) -> None:
        raise ConfigurationError(f"the chat template refused the conversation: {message}")

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return env.from_string(source)


class LlamaCppChatTokenizer:
    """A `tito.ChatTokenizer` backed by a llama.cpp server (template from `/props`)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.root = server_root(endpoint.api_base)

    async def _template(self) -> _Template:
        found = _TEMPLATES.get(self.root)
        if found is None:
            async with http_client(self.endpoint) as client:
                response = await client.get(self.root + "/props")
            if response.status_code >= 400:
                raise HTTPStatusFailure(response.status_code, dict(response.headers), response.text[:_MAX_ERROR_BODY])
            props = response.json()
            source = props.get("chat_template") or ""
            if not source:
                raise ConfigurationError(f"the server at {self.root} reports no chat template (/props)")
            found = _Template(source, props.get("bos_token", ""), props.get("eos_token", ""), _compile(source))
            _TEMPLATES[self.root] = found
        return found

    async def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        generation_prompt: bool,
    ) -> str:
        t = await self._template()
        return str(
            t.compiled.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=generation_prompt,
                bos_token=t.bos_token,
                eos_token=t.eos_token,
            )
        )

    async def encode(self, text: str) -> list[int]:
        if not text:
            return []
        body = {"content": text, "add_special": False, "parse_special": True}
        answer = await _post_json(self.endpoint, self.root + "/tokenize", body)
        return [int(t) for t in answer["tokens"]]

    async def decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        answer = await _post_json(self.endpoint, self.root + "/detokenize", {"tokens": list(ids)})
        return str(answer["content"])


@asynccontextmanager
async def _open_stream(endpoint: Endpoint, url: str, body: dict[str, Any]) -> AsyncIterator[AsyncIterator[Any]]:
    async with http_client(endpoint) as client:
        request = client.build_request(
            "POST", url, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        response = await client.send(request, stream=True)
        try:
            if response.status_code >= 400:
                raw = b""
                async for part in response.aiter_bytes():
                    raw += part
                    if len(raw) > _MAX_ERROR_BODY:
                        break
                raise HTTPStatusFailure(response.status_code, dict(response.headers), raw.decode("utf-8", "replace"))
            async with aclosing(iter_sse_json(response)) as events:
                yield events
        finally:
            with trio.CancelScope(shield=True):
                await response.aclose()


@dataclass(frozen=True)
class _Piece:
    """What one stream chunk carried: sampled ids, their log-probs, text, and the finish
    ("stop" or "length") if the model finished."""

    ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    text: str = ""
    finish: str | None = None


def completion_request(prompt_ids: Sequence[int], endpoint: Endpoint, seed: int | None) -> dict[str, Any]:
    """llama.cpp's `/completion` body: token-id prompt, neutral samplers, token ids and log-probs back."""
    body: dict[str, Any] = {
        "prompt": list(prompt_ids),
        "n_predict": endpoint.max_tokens,
        "temperature": 1.0 if endpoint.temperature is None else endpoint.temperature,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repeat_penalty": 1.0,
        "stream": True,
        "return_tokens": True,
        "n_probs": 1,
        "post_sampling_probs": False,
        "cache_prompt": True,
    }
    if seed is not None:
        body["seed"] = seed % (1 << 32)
    return body


def _llamacpp_piece(chunk: Any, provider: str) -> _Piece:
    tokens = chunk.get("tokens") or []
    probs = chunk.get("completion_probabilities") or []
    if len(probs) != len(tokens):
        raise ProviderError(
            f"{provider}: the server sent {len(tokens)} tokens with {len(probs)} log-probs; it must support "
            "return_tokens and n_probs (a llama.cpp server from 2025 or later)",
            retryable=False,
        )
    for token, p in zip(tokens, probs, strict=True):
        if int(p["id"]) != int(token):
            raise ProviderError(f"{provider}: log-prob entry for token {p['id']} beside token {token}")
    finish = None
    if chunk.get("stop"):
        finish = "length" if chunk.get("stop_type") == "limit" else "stop"
    return _Piece(
        tuple(int(t) for t in tokens), tuple(float(p["logprob"]) for p in probs), chunk.get("content") or "", finish
    )


def vllm_completion_request(prompt_ids: Sequence[int], endpoint: Endpoint, seed: int | None) -> dict[str, Any]:
    """vLLM's `/v1/completions` body: a token-id prompt, the sampled ids (as `token_id:N`
    strings) with their log-probs back."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "prompt": list(prompt_ids),
        "max_tokens": endpoint.max_tokens,
        "temperature": 1.0 if endpoint.temperature is None else endpoint.temperature,
        "top_p": 1.0,
        "top_k": -1,
        "stream": True,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        body["seed"] = seed % (1 << 32)
    return body


def _vllm_piece(chunk: Any, provider: str) -> _Piece:
    choices = chunk.get("choices") or []
    if not choices:
        return _Piece()
    choice = choices[0]
    lp = choice.get("logprobs") or {}
    names = lp.get("tokens") or []
    values = lp.get("token_logprobs") or []
    if len(names) != len(values):
        raise ProviderError(f"{provider}: {len(names)} tokens with {len(values)} log-probs in a chunk", retryable=False)
    ids = []
    for name in names:
        if not (isinstance(name, str) and name.startswith("token_id:")):
            raise ProviderError(
                f"{provider}: token {name!r} is not an id; the server must honour return_tokens_as_token_ids",
                retryable=False,
            )
        ids.append(int(name[len("token_id:") :]))
    reason = choice.get("finish_reason")
    finish = None if reason is None else "length" if reason == "length" else "stop"
    return _Piece(tuple(ids), tuple(float(v) for v in values), choice.get("text") or "", finish)


class VLLMChatTokenizer(LlamaCppChatTokenizer):
    """A `tito.ChatTokenizer` over vLLM's `/tokenize` and `/detokenize` (the chat template is
    applied by the server: `/tokenize` with `messages`, then the ids back to text)."""

    async def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        generation_prompt: bool,
    ) -> str:
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": list(messages),
            "add_generation_prompt": generation_prompt,
            "continue_final_message": False,
            "add_special_tokens": False,
        }
        if tools:
            body["tools"] = list(tools)
        answer = await _post_json(self.endpoint, self.root + "/tokenize", body)
        return await self.decode(answer["tokens"])

    async def encode(self, text: str) -> list[int]:
        if not text:
            return []
        body = {"model": self.endpoint.model, "prompt": text, "add_special_tokens": False}
        answer = await _post_json(self.endpoint, self.root + "/tokenize", body)
        return [int(t) for t in answer["tokens"]]

    async def decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        answer = await _post_json(
            self.endpoint, self.root + "/detokenize", {"model": self.endpoint.model, "tokens": list(ids)}
        )
        return str(answer["prompt"])


async def _stream_tokens(
    actor: Actor,
    on_chunk: OnChunk,
    tokenizer: Any,
    url: str,
    make_body: Any,
    parse: Any,
) -> Actor:
    ep = actor.endpoint
    started = time.perf_counter()
    await on_chunk(LLMCallStart(provider=ep.provider, model=ep.model))
    try:
        prompt_ids = await next_prompt_ids(tokenizer, actor.trajectory, actor.tools)
    except (HTTPStatusFailure, httpx2.TransportError) as e:
        failure = classify_common(e, ep.provider)
        assert failure is not None
        raise failure.error from e
    params = dict(ep.extra_params or {})
    body = make_body(prompt_ids, ep, call_seed(actor.trajectory, params.get("seed")))
    names = frozenset(t.name for t in actor.tools) or None
    builder = MessageBuilder(ep.provider, ep.model)
    record: dict[str, Any] = {}
    first_at: float | None = None

    async def emit(event: StreamEvent) -> None:
        builder.feed(event)
        await on_chunk(event)

    async def attempt(emit: OnChunk, n: int) -> str | None:
        nonlocal first_at
        ids: list[int] = []
        logprobs: list[float] = []
        async with _open_stream(ep, url, body) as chunks:
            await emit(StreamStart(attempt=n))
            translator = ChatStreamTranslator(emit, text_tool_names=names, text_tool_limit=1)
            finish = None
            async for chunk in chunks:
                if first_at is None:
                    first_at = time.perf_counter()
                piece = parse(chunk, ep.provider)
                ids.extend(piece.ids)
                logprobs.extend(piece.logprobs)
                if piece.text:
                    await translator.feed({"choices": [{"delta": {"content": piece.text}}]})
                if piece.finish is not None:
                    finish = piece.finish
                    break
            if finish is None:
                raise ProviderError(f"{ep.provider}: the stream ended before the model finished", retryable=True)
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
            await translator.feed({"choices": [{"delta": {}, "finish_reason": finish}], "usage": usage})
            reason, _ = await translator.finish()
            record["ids"], record["logprobs"] = ids, logprobs
            return reason

    def classify(exc: Exception) -> Failure | None:
        return classify_common(exc, ep.provider)

    finish_reason, attempts = await stream_with_retries(attempt, endpoint=ep, on_chunk=emit, classify=classify)
    completion = Completion(
        provider=ep.provider,
        model=ep.model,
        finish_reason=finish_reason,
        message_index=len(actor.trajectory.messages),
        duration_s=time.perf_counter() - started,
        time_to_first_token_s=(first_at - started) if first_at is not None else None,
        attempts=attempts,
        tokens=TokenRecord(tuple(prompt_ids), tuple(record["ids"]), tuple(record["logprobs"])),
    )
    return append_assistant(actor, builder.finish(), completion)


def _needs_api_base(endpoint: Endpoint, example: str) -> None:
    if not endpoint.api_base:
        raise ConfigurationError(f"provider {endpoint.provider!r} needs Endpoint.api_base (e.g. {example!r})")


async def stream_llamacpp_tokens(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Token-exact streaming from a llama.cpp server at `Endpoint.api_base`."""
    ep = actor.endpoint
    _needs_api_base(ep, "http://localhost:8080/v1")
    url = server_root(ep.api_base) + "/completion"
    return await _stream_tokens(actor, on_chunk, LlamaCppChatTokenizer(ep), url, completion_request, _llamacpp_piece)


async def stream_vllm_tokens(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Token-exact streaming from a vLLM server at `Endpoint.api_base` (`/v1/completions`)."""
    ep = actor.endpoint
    _needs_api_base(ep, "http://localhost:8000/v1")
    url = ep.api_base.rstrip("/") + "/completions"
    return await _stream_tokens(actor, on_chunk, VLLMChatTokenizer(ep), url, vllm_completion_request, _vllm_piece)


async def stream_local_tokens(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Token-exact streaming from the embedded model (provider `local`)."""
    from rollouts.local_model import ensure_local_server, resolve_local_model

    ep = actor.endpoint
    if ep.api_base:
        raise ConfigurationError(
            f"provider 'local' runs the embedded model and takes no api_base (got {ep.api_base!r})"
        )
    server = await ensure_local_server(resolve_local_model(ep.model))
    served = replace(actor, endpoint=replace(ep, api_base=server.api_base, api_key=""))
    new_actor = await stream_llamacpp_tokens(served, on_chunk)
    return replace(new_actor, endpoint=ep)
