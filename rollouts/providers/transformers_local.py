"""Provider `transformers`: a Hugging Face causal LM run in this process by torch.

    Endpoint("transformers", "path/to/model-dir")        # a saved model (config + weights + tokenizer)
    Endpoint("transformers", "path/to/model.gguf")       # a GGUF file (dequantised; needs `gguf`)
    Endpoint("transformers", "smollm2-135m")             # the registry-packaged SmolLM2 (see rollouts.local_model.packaged)
    register_transformers_model("policy", model, tokenizer)   # a model object already in memory

Every call is token-exact (it records a `TokenRecord`: prompt ids, sampled ids and their
log-probs, see `rollouts.providers.tito`), so the same provider serves evals and training; a
trainer that registers its own module under a name keeps generation in sync with its weights
for free.

Generation runs off the event loop: one engine per model and trio run (a system task) takes
every request waiting when the program has nothing else to do, sorts them, and decodes them as
one left-padded batch with a KV cache, one worker-thread call per token (the prompts' common
beginning — a GRPO group's shared prompt, an evaluation's system prompt and examples — runs
once, its cache copied to every row); each token is streamed back to its request as it is
sampled, through the OpenAI chat stream translator, so the events, the Message and tool calls
written as text (`{"name": ..., "arguments": ...}`) are exactly those of an OpenAI-compatible
server. Each request samples with its own torch generator, seeded from
`tito.call_seed`, so its tokens do not depend on what it was batched with. `temperature=0` is
greedy; log-probs are those of the distribution sampled from (logits / temperature; at
temperature 0, the untempered one).

Install with `pip install 'rollouts[train]'` (torch, transformers, gguf).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from rollouts.dtypes import Actor, Completion, TokenRecord
from rollouts.errors import ConfigurationError, ContextTooLongError
from rollouts.events import LLMCallStart, OnChunk, StreamEvent, StreamStart
from rollouts.providers._aggregate import MessageBuilder, append_assistant
from rollouts.providers._chat_format import ChatStreamTranslator
from rollouts.providers.kv_cache import cache_of, with_cache
from rollouts.providers.tito import call_seed, next_prompt_ids


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigurationError(
            "provider 'transformers' needs torch and transformers: pip install torch==2.13.0 'rollouts[train]'"
        ) from None
    return torch


class HFChatTokenizer:
    """A `tito.ChatTokenizer` over a Hugging Face tokenizer (chat template, encode, decode)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigurationError("provider 'transformers': the tokenizer has no chat_template; set one")
        self.tokenizer = tokenizer

    async def render(self, messages: Any, *, tools: Any, generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), tools=tools, add_generation_prompt=generation_prompt, tokenize=False
        )
        assert isinstance(text, str)
        return text

    async def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    async def decode(self, ids: Any) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def visible_text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


# --------------------------------------------------------------------------------------------
# The batching engine
# --------------------------------------------------------------------------------------------


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    seed: int | None
    send: trio.MemorySendChannel[Any]
    order: tuple[int, int]
    alive: bool = True


@dataclass
class _Batch:
    requests: list[_Request]
    generators: list[Any]
    cache: Any = None
    logits: Any = None  # [B, V] next-token logits
    attention: Any = None  # [B, L]
    positions: Any = None  # [B] position of the last token
    produced: list[int] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)


_END = object()


MIN_SHARED_PREFIX = 16
"""Prompts of one batch sharing at least this many first tokens run them once (`_prefill_shared`)."""


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """How many first tokens all `prompts` share, leaving each at least one token of its own (the
    last token's logits are what the first sample is drawn from)."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


class GenerationEngine:
    """Batched sampling for one model. `generate(...)` yields `(token_id, logprob)` then ends
    with the finish reason ("stop" or "length") as its last item."""

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int = 64) -> None:
        torch = _torch()
        self.model = model
        self.max_batch_size = max_batch_size
        stop: set[int] = set()
        for source in (getattr(model, "generation_config", None), tokenizer):
            eos = getattr(source, "eos_token_id", None)
            if isinstance(eos, int):
                stop.add(eos)
            elif isinstance(eos, list | tuple):
                stop.update(int(e) for e in eos)
        if not stop:
            raise ConfigurationError("provider 'transformers': the model and tokenizer define no eos_token_id")
        self.stop_ids = frozenset(stop)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(pad) if pad is not None else min(self.stop_ids)
        self.context_length = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
        self._runvar: trio.lowlevel.RunVar[trio.MemorySendChannel[_Request]] = trio.lowlevel.RunVar(
            f"generation-engine-{id(self)}"
        )
        self._counter = 0
        self._device = next(model.parameters()).device
        self._torch = torch
        # Generation and weight updates must not overlap: a trainer holds this lock in train_step.
        self.weights_lock = threading.Lock()

    def _channel(self) -> trio.MemorySendChannel[_Request]:
        try:
            return self._runvar.get()
        except LookupError:
            send, receive = trio.open_memory_channel[_Request](math.inf)
            self._runvar.set(send)
            trio.lowlevel.spawn_system_task(self._serve, receive, name=f"generation engine {id(self)}")
            return send

    async def generate(
        self, prompt_ids: list[int], *, max_new_tokens: int, temperature: float, seed: int | None
    ) -> AsyncIterator[Any]:
        """Sample up to `max_new_tokens` after `prompt_ids`."""
        send, receive = trio.open_memory_channel[Any](max_new_tokens + 2)
        self._counter += 1
        request = _Request(prompt_ids, max_new_tokens, temperature, seed, send, (seed or 0, self._counter))
        self._channel().send_nowait(request)
        try:
            async with receive:
                async for item in receive:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if isinstance(item, str):
                        return
        finally:
            request.alive = False

    async def _serve(self, receive: trio.MemoryReceiveChannel[_Request]) -> None:
        import trio.testing

        while True:
            pending = [await receive.receive()]
            # Take every request the program can make before it has to wait for us: the
            # concurrent samples of an evaluation arrive together and are decoded as one batch.
            await trio.testing.wait_all_tasks_blocked()
            while True:
                try:
                    pending.append(receive.receive_nowait())
                except trio.WouldBlock:
                    break
            pending.sort(key=lambda r: r.order)
            for i in range(0, len(pending), self.max_batch_size):
                live = [r for r in pending[i : i + self.max_batch_size] if r.alive]
                if live:
                    await self._run(live)

    async def _run(self, requests: list[_Request]) -> None:
        try:
            batch = await trio.to_thread.run_sync(self._prefill, requests)
            while True:
                emitted, finished = await trio.to_thread.run_sync(self._step, batch)
                for row, item in emitted:
                    self._send(batch.requests[row], item)
                if finished:
                    return
        except Exception as e:  # delivered to every request of the batch
            for r in requests:
                self._send(r, e)

    def _send(self, request: _Request, item: Any) -> None:
        if not request.alive:
            return
        try:
            request.send.send_nowait(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            request.alive = False

    def _prefill(self, requests: list[_Request]) -> _Batch:
        torch = self._torch
        generators = []
        for r in requests:
            g = torch.Generator(device="cpu")
            if r.seed is not None:
                g.manual_seed(r.seed)
            else:
                g.seed()
            generators.append(g)
        shared = shared_prefix_length([r.prompt_ids for r in requests])
        with self.weights_lock, torch.inference_mode():
            if len(requests) > 1 and shared >= MIN_SHARED_PREFIX:
                logits, mask, positions, cache = self._prefill_shared(requests, shared)
            else:
                logits, mask, positions, cache = self._prefill_padded(requests)
        return _Batch(
            requests=requests,
            generators=generators,
            cache=cache,
            logits=logits,
            attention=mask,
            positions=positions,
            produced=[0] * len(requests),
            done=[False] * len(requests),
        )

    def _prefill_padded(self, requests: list[_Request]) -> tuple[Any, Any, Any, Any]:
        """Every prompt whole, left-padded to the longest: (next-token logits, attention mask,
        last positions, KV cache)."""
        torch = self._torch
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            n = len(r.prompt_ids)
            ids[i, width - n :] = torch.tensor(r.prompt_ids, dtype=torch.long)
            mask[i, width - n :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids.to(self._device),
            attention_mask=mask.to(self._device),
            position_ids=positions.to(self._device),
            use_cache=True,
            logits_to_keep=1,  # the output layer only where a token is sampled
        )
        return out.logits[:, -1, :].float().cpu(), mask, positions[:, -1], cache_of(out)

    def _prefill_shared(self, requests: list[_Request], shared: int) -> tuple[Any, Any, Any, Any]:
        """The prompts' common first `shared` tokens run once (a GRPO group's samples, an
        evaluation's system prompt and examples), their KV cache copied to every row, then each
        prompt's own rest, padded on its left — between the shared part and the rest. The
        attention mask hides the padding and the positions skip it, so each row computes what
        it would alone (to float rounding)."""
        torch = self._torch
        head = torch.tensor([requests[0].prompt_ids[:shared]], dtype=torch.long, device=self._device)
        cache = cache_of(self.model(input_ids=head, use_cache=True, logits_to_keep=1))
        cache.batch_repeat_interleave(len(requests))
        width = max(len(r.prompt_ids) for r in requests) - shared
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.ones((len(requests), shared + width), dtype=torch.long)
        positions = torch.full((len(requests), width), shared, dtype=torch.long)
        for i, r in enumerate(requests):
            rest = r.prompt_ids[shared:]
            n = len(rest)
            ids[i, width - n :] = torch.tensor(rest, dtype=torch.long)
            mask[i, shared : shared + width - n] = 0
            positions[i, width - n :] = torch.arange(shared, shared + n)
        out = self.model(
            input_ids=ids.to(self._device),
            attention_mask=mask.to(self._device),
            position_ids=positions.to(self._device),
            **with_cache(cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().cpu(), mask, positions[:, -1], cache_of(out)

    def _step(self, batch: _Batch) -> tuple[list[tuple[int, Any]], bool]:
        """Sample one token per live row, then run the model on them. Returns the items to
        send and whether the batch is finished."""
        torch = self._torch
        emitted: list[tuple[int, Any]] = []
        next_ids = torch.full((len(batch.requests),), self.pad_id, dtype=torch.long)
        for i, r in enumerate(batch.requests):
            if batch.done[i]:
                continue
            if not r.alive:
                batch.done[i] = True
                continue
            logits = batch.logits[i]
            if r.temperature > 0:
                logprobs = torch.log_softmax(logits / r.temperature, dim=-1)
                token = int(torch.multinomial(logprobs.exp(), 1, generator=batch.generators[i]).item())
            else:
                logprobs = torch.log_softmax(logits, dim=-1)
                token = int(torch.argmax(logits).item())
            emitted.append((i, (token, float(logprobs[token].item()))))
            batch.produced[i] += 1
            next_ids[i] = token
            if token in self.stop_ids:
                batch.done[i] = True
                emitted.append((i, "stop"))
            elif batch.produced[i] >= r.max_new_tokens:
                batch.done[i] = True
                emitted.append((i, "length"))
        if all(batch.done):
            return emitted, True
        batch.attention = torch.cat([batch.attention, torch.ones((len(batch.requests), 1), dtype=torch.long)], dim=1)
        batch.positions = batch.positions + 1
        with self.weights_lock, torch.inference_mode():
            out = self.model(
                input_ids=next_ids[:, None].to(self._device),
                attention_mask=batch.attention.to(self._device),
                position_ids=batch.positions[:, None].to(self._device),
                **with_cache(batch.cache),
                use_cache=True,
            )
        batch.cache = cache_of(out)
        batch.logits = out.logits[:, -1, :].float().cpu()
        return emitted, False


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass
class TransformersModel:
    """A model, its tokenizer and its generation engine, as the provider uses them."""

    name: str
    model: Any
    tokenizer: Any
    chat: HFChatTokenizer
    engine: GenerationEngine


_MODELS: dict[str, TransformersModel] = {}
_load_lock = threading.Lock()


def register_transformers_model(
    name: str, model: Any, tokenizer: Any, *, max_batch_size: int = 64
) -> TransformersModel:
    """Serve `model` (a torch causal LM, used as is: later weight updates are seen by the next
    token sampled) as `Endpoint("transformers", name)`."""
    entry = TransformersModel(
        name,
        model,
        tokenizer,
        HFChatTokenizer(tokenizer),
        GenerationEngine(model, tokenizer, max_batch_size=max_batch_size),
    )
    _MODELS[name] = entry
    return entry


def unregister_transformers_model(name: str) -> None:
    """Forget the model registered (or loaded) as `name`."""
    _MODELS.pop(name, None)


def load_causal_lm(source: str) -> tuple[Any, Any]:
    """`(model, tokenizer)` from a directory or hub name, a `.gguf` file (dequantised to float32),
    a packaged model name (`rollouts.local_model.packaged`), or a directory of LoRA adapters
    (`adapter_config.json`, as `rollouts train grpo --lora-r` writes): the base model it names
    with the adapters merged in. The model is in eval mode."""
    _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollouts.local_model.packaged import resolve_weights

    adapter = Path(source).expanduser()
    if adapter.is_dir() and (adapter / "adapter_config.json").is_file():
        return load_merged_adapter(adapter)
    path = resolve_weights(source)
    if path.suffix == ".gguf":
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype="float32")
        # The weights are dequantised, but the model still carries the GGUF "quantizer", which
        # makes transformers refuse to save or fine-tune it: rebuild it as a plain model.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=_torch().float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        del loaded
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    model.eval()
    return model, tokenizer


def load_merged_adapter(directory: Path, *, base: str | None = None) -> tuple[Any, Any]:
    """`(model, tokenizer)`: the base model named in `directory`'s adapter_config.json (or
    `base`) with the LoRA adapters of `directory` merged into its weights (peft's
    `merge_and_unload`): a plain model again. The tokenizer is `directory`'s when it holds one."""
    import json

    try:
        import peft
    except ImportError:
        raise ConfigurationError(
            f"{directory} holds LoRA adapters; loading them needs peft: pip install peft"
        ) from None
    recorded = json.loads((directory / "adapter_config.json").read_text(encoding="utf-8")).get(
        "base_model_name_or_path"
    )
    source = base or recorded
    if not source:
        raise ConfigurationError(
            f"{directory} holds LoRA adapters but does not name their base model; give it (--base)"
        )
    model, tokenizer = load_causal_lm(str(source))
    merged = peft.PeftModel.from_pretrained(model, str(directory)).merge_and_unload()
    merged.eval()
    if (directory / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    return merged, tokenizer


async def get_transformers_model(name: str) -> TransformersModel:
    """The registered model `name`, else the model loaded from it (once per process)."""
    entry = _MODELS.get(name)
    if entry is not None:
        return entry

    def load() -> TransformersModel:
        with _load_lock:
            found = _MODELS.get(name)
            if found is not None:
                return found
            model, tokenizer = load_causal_lm(name)
            return register_transformers_model(name, model, tokenizer)

    return await trio.to_thread.run_sync(load)


# --------------------------------------------------------------------------------------------
# The provider
# --------------------------------------------------------------------------------------------


class _VisibleText:
    """Turns sampled ids into text deltas (special tokens hidden, partial UTF-8 held back)."""

    def __init__(self, chat: HFChatTokenizer) -> None:
        self._chat = chat
        self._ids: list[int] = []
        self._sent = 0

    def add(self, token: int) -> str:
        self._ids.append(token)
        text = self._chat.visible_text(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self._sent = text[self._sent :], len(text)
        return piece


async def stream_transformers(actor: Actor, on_chunk: OnChunk) -> Actor:
    """Stream one reply from an in-process transformers model (token-exact, see module docstring)."""
    ep = actor.endpoint
    started = time.perf_counter()
    entry = await get_transformers_model(ep.model)
    await on_chunk(LLMCallStart(provider=ep.provider, model=ep.model))
    prompt_ids = await next_prompt_ids(entry.chat, actor.trajectory, actor.tools)
    room = entry.engine.context_length - len(prompt_ids)
    if room <= 0:
        raise ContextTooLongError(
            f"the prompt has {len(prompt_ids)} tokens; {ep.model!r} takes {entry.engine.context_length}",
            provider=ep.provider,
        )
    params = dict(ep.extra_params or {})
    builder = MessageBuilder(ep.provider, ep.model)

    async def emit(event: StreamEvent) -> None:
        builder.feed(event)
        await on_chunk(event)

    await emit(StreamStart(attempt=1))
    names = frozenset(t.name for t in actor.tools) or None
    translator = ChatStreamTranslator(
        emit, text_tool_names=names, text_tool_limit=None if params.get("parallel_tool_calls") else 1
    )
    visible = _VisibleText(entry.chat)
    ids: list[int] = []
    logprobs: list[float] = []
    finish = "length"
    first_at: float | None = None
    async for item in entry.engine.generate(
        prompt_ids,
        max_new_tokens=min(ep.max_tokens, room),
        temperature=1.0 if ep.temperature is None else float(ep.temperature),
        seed=call_seed(actor.trajectory, params.get("seed")),
    ):
        if isinstance(item, str):
            finish = item
            break
        token, logprob = item
        if first_at is None:
            first_at = time.perf_counter()
        ids.append(token)
        logprobs.append(logprob)
        piece = visible.add(token)
        if piece:
            await translator.feed({"choices": [{"delta": {"content": piece}}]})
    usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
    await translator.feed({"choices": [{"delta": {}, "finish_reason": finish}], "usage": usage})
    reason, _ = await translator.finish()
    completion = Completion(
        provider=ep.provider,
        model=ep.model,
        finish_reason=reason,
        message_index=len(actor.trajectory.messages),
        duration_s=time.perf_counter() - started,
        time_to_first_token_s=(first_at - started) if first_at is not None else None,
        tokens=TokenRecord(tuple(prompt_ids), tuple(ids), tuple(logprobs)),
    )
    return append_assistant(actor, builder.finish(), completion)
