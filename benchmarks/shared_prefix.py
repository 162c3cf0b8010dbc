"""The shared prompt prefix, measured on the multi-turn calculator task of benchmarks/grpo.py.

Every rollout of that task starts with the same ~330 tokens (the tool instructions and the worked
episode) and differs only in its last ~20 (the task) plus what the model and the tools wrote.
Two places run that beginning:

1. generation (`GenerationEngine`, always on): a batch of `--rows` first-turn prompts (the
   task's training rows, each `--group` times, as a GRPO step samples them), prefilled as whole
   left-padded rows (`prefill_whole_s`) against the shared beginning once plus each row's rest
   (`prefill_shared_s`); then `--decode` greedy tokens (`decode_step_s`, the same either way).
   The sampled tokens must be equal (checked).
2. the training pass (`GRPOConfig.share_prefix`): one forward and backward over `--train-rows`
   whole episodes (the first turn plus a tool reply and a second call, ~450 tokens each) with the
   prefix run per row (`train_whole_s`) and once (`train_shared_s`); the loss and gradient norm
   must agree (checked; the run fails otherwise).

Each figure is the median of `--repeats`, at `--threads` torch threads, after one warm-up.

    python benchmarks/shared_prefix.py [--rows 4 --group 8 --train-rows 16 --threads 1]

Last line: JSON with prefill_whole_s, prefill_shared_s, prefill_speedup, decode_step_s,
train_whole_s, train_shared_s, train_speedup, shared_tokens, prompt_tokens, episode_tokens,
load_average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo

from rollouts.dtypes import Trajectory
from rollouts.providers.tito import next_prompt_ids
from rollouts.providers.transformers_local import GenerationEngine, HFChatTokenizer, _Request, shared_prefix_length
from rollouts.training import load_causal_lm
from rollouts.training.distributed import selected_logits_module, shared_columns


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


async def prompts(tokenizer: Any, rows: list[dict[str, Any]]) -> list[list[int]]:
    chat = HFChatTokenizer(tokenizer)
    tools = grpo.AddCalculator().get_tools()
    return [await next_prompt_ids(chat, Trajectory(tuple(grpo.multiturn_messages(r))), tools) for r in rows]


def measure_generation(model: Any, tokenizer: Any, ids: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    engine = GenerationEngine(model, tokenizer)
    requests = [_Request(p, args.decode, 0.0, i, None, (0, i)) for i, p in enumerate(ids)]  # type: ignore[arg-type]

    def whole() -> Any:
        with torch.inference_mode():
            return engine._prefill_padded(requests)

    def shared() -> Any:
        with torch.inference_mode():
            return engine._prefill(requests)

    whole_s, (whole_logits, *_) = timed(whole, args.repeats)
    shared_s, batch = timed(shared, args.repeats)
    assert torch.equal(whole_logits.argmax(-1), batch.logits.argmax(-1)), "the first sampled tokens differ"
    assert torch.allclose(whole_logits, batch.logits, atol=1e-3), "the prefill logits differ"
    engine._send = lambda request, item: None  # type: ignore[method-assign]
    t0 = time.perf_counter()
    steps = 0
    while steps < args.decode:
        _, finished = engine._step(batch)
        steps += 1
        if finished:
            break
    decode_s = (time.perf_counter() - t0) / steps
    return {"prefill_whole_s": whole_s, "prefill_shared_s": shared_s, "prefill_speedup": whole_s / shared_s,
            "decode_step_s": decode_s, "shared_tokens": shared_prefix_length(ids),
            "prompt_tokens": max(len(p) for p in ids)}  # fmt: skip


def episodes(tokenizer: Any, ids: list[list[int]], n: int) -> tuple[Any, Any, Any, Any]:
    """`n` right-padded training rows: each prompt, a call, a tool reply and a second call."""
    rows = []
    for i in range(n):
        p = ids[i % len(ids)]
        a = tokenizer.encode(
            f'{{"name": "add", "arguments": {{"value": {i % 10}}}}}<|im_end|>\n', add_special_tokens=False
        )
        reply = tokenizer.encode(f"<|im_start|>tool\nAdded {i % 10} to 0. Current value: {i % 10}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)  # fmt: skip
        b = tokenizer.encode(
            f'{{"name": "add", "arguments": {{"value": {i % 7}}}}}<|im_end|>', add_special_tokens=False
        )
        rows.append((p + a + reply + b, len(p), len(p) + len(a) + len(reply)))
    width = max(len(r[0]) for r in rows)
    ids_t = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, (tokens, first, second) in enumerate(rows):
        ids_t[i, : len(tokens)] = torch.tensor(tokens)
        attn[i, : len(tokens)] = 1
        mask[i, first : first + 16] = 1  # the model's own tokens
        mask[i, second : len(tokens)] = 1
    rows_i, cols = torch.nonzero(mask[:, 1:] > 0, as_tuple=True)
    return ids_t, attn, rows_i, cols


def measure_training(model: Any, tokenizer: Any, ids: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    batch = episodes(tokenizer, ids, args.train_rows)
    target = batch[0][batch[2], batch[3] + 1]
    results = {}
    for share in (False, True):
        module = selected_logits_module(model, share_prefix=share)

        def step(module: Any = module) -> tuple[float, float]:
            model.zero_grad(set_to_none=True)
            logits = module(*batch)
            loss = -torch.log_softmax(logits, -1).gather(-1, target[:, None]).mean()
            loss.backward()
            norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters() if p.grad is not None))
            return float(loss), float(norm)

        results[share] = timed(step, args.repeats)
    (whole_s, (loss0, norm0)), (shared_s, (loss1, norm1)) = results[False], results[True]
    assert abs(loss0 - loss1) <= 1e-4 * abs(loss0) and abs(norm0 - norm1) <= 1e-3 * abs(norm0), (
        loss0,
        loss1,
        norm0,
        norm1,
    )
    return {"train_whole_s": whole_s, "train_shared_s": shared_s, "train_speedup": whole_s / shared_s,
            "train_rows": args.train_rows, "episode_tokens": int(batch[0].shape[1]),
            "train_shared_columns": shared_columns(batch[0], batch[1])}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4, help="training rows (distinct prompts) per batch")
    parser.add_argument("--group", type=int, default=8, help="samples of each row")
    parser.add_argument("--train-rows", type=int, default=16)
    parser.add_argument("--decode", type=int, default=8, help="decode steps timed")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_causal_lm("smollm2-135m")
    rows, _ = grpo.multiturn_split(grpo.parse_args([]))
    ids = trio.run(prompts, tokenizer, [r for r in rows[: args.rows] for _ in range(args.group)])
    figures: dict[str, Any] = {"rows": args.rows, "group": args.group, "threads": args.threads}
    figures.update(measure_generation(model, tokenizer, ids, args))
    model.train(False)
    figures.update(measure_training(model, tokenizer, ids, args))
    figures["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
