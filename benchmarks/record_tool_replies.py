"""Record what the packaged local models write when they are offered tools (issue 33 item 12).

The tests of text tool-call recovery (tests/test_recorded_tool_replies.py) feed real replies to
the recovery code: the exact reply text each model wrote, before any parsing. This script makes
them. For each packaged model it runs a handful of tool tasks through the agent loop, sample
after sample (one request in flight, so batching does not change a reply):

* `steps/<calc id>`: a calc-steps chain with a `submit_answer` tool of the user's own
  (`StepsCalculator` from benchmarks/submit_answer_task.py), up to steps + 2 turns;
* `calculator/<calc id>`: the same chains on the built-in `CalculatorEnvironment` (finishes
  with `complete_task`);
* `bfcl/<row id>`: BFCL `simple` rows, one call each (one turn).

Each task runs at temperature 0 (seed 0); the steps chains also at temperature 0.7 with seeds 1
and 2, for the shapes greedy decoding does not show. The model is the embedded llama.cpp server
of the `local` provider; the agent talks to it through a recording proxy (`rollouts.testing`'s
fake server, whose turn function forwards the very request body the `openai-compatible`
provider built to the llama.cpp server, non-streaming, and returns the reply text unchanged), so
the agent loop, tool execution and text tool-call recovery are those of a `local` run, and every
raw reply text is saved. At most `--max-replies` replies (default 40) and 256 tokens per reply
per model bound a run (a reply is mostly prompt processing: tens of seconds each on an idle
2-core machine, minutes on a loaded one).

Output: one `<model>.jsonl` per model in `--out` (default tests/data/recorded_tool_replies), one
line per reply: `{model, prompt_id, turn, temperature, seed, tools, reply, finish_reason}` where
`tools` are the tools offered (name, description, JSON-schema parameters), `reply` is the
assistant's text exactly as the server returned it and `finish_reason` the server's (`stop`,
`length`). Last line on stdout: one JSON object `{models, replies, wall_s, load_avg}`.

Re-record (needs `pip install -e '.[local]'` and the models, fetched on first use into
~/.cache/rollouts/models):

    python benchmarks/record_tool_replies.py                    # both models, up to 40 replies each
    python benchmarks/record_tool_replies.py --models qwen2.5-coder-1.5b --max-replies 20

The committed recordings (31 replies) are `--models M --max-replies 12`, one process per model,
run side by side on 2026-11-27: the first 12 replies of the order in `tasks()` (BFCL, one steps
chain, one calculator chain, then the steps chain sampled with seed 1), which took 51 and 58
minutes of wall time on the shared 2-core machine at a load average of 7-33 (last lines:
`{"models": {"qwen2.5-coder-0.5b": 12}, "replies": 12, "wall_s": 3047.5, "load_avg": [8.91, 13.25, 14.36]}`,
`{"models": {"qwen2.5-coder-1.5b": 12}, "replies": 12, "wall_s": 3492.9, "load_avg": [6.24, 9.12, 11.95]}`);
then `--models M --runs 7 --append --max-replies 4` (the steps chain sampled with seed 2; 4 and 3
replies, 493 s and 471 s at a load average of 8-9).

then review what the recovery code makes of each reply and update the tests' expectations:

    python benchmarks/record_tool_replies.py --review           # prints reply -> recovered calls

tests/test_recorded_tool_replies.py holds the expected calls of every recorded reply (keyed by
model, prompt id, turn and seed); a re-recording whose replies differ makes those tests fail
until the expectations are reviewed and updated, by design.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark module below

from submit_answer_task import SYSTEM_PROMPT as STEPS_PROMPT
from submit_answer_task import StepsCalculator

from rollouts import CalculatorEnvironment, Message, RunConfig, run_agent
from rollouts.datasets import bfcl, calc_steps
from rollouts.dtypes import Actor, AgentState, Endpoint, Tool, Trajectory
from rollouts.environments.base import EnvironmentBase
from rollouts.local_model import ensure_local_server, resolve_local_model, shutdown_local_server
from rollouts.providers._text_tool_calls import extract_text_tool_calls
from rollouts.testing import RecordedRequest, ScriptedReply, open_fake_server

MODELS = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "recorded_tool_replies"
MAX_TOKENS = 256
REPLY_TIMEOUT_S = 1800.0  # one reply on a loaded 2-core machine can take minutes
SAMPLED = ((0.7, 1), (0.7, 2))  # (temperature, seed) runs besides the greedy one


@dataclass(frozen=True)
class Task:
    """One prompt: its id, first messages, environment and turn bound."""

    prompt_id: str
    messages: tuple[Message, ...]
    environment: Callable[[], EnvironmentBase]
    max_turns: int


def tasks() -> list[tuple[Task, float, int]]:
    """The (task, temperature, seed) runs, in recording order: the kinds take turns, so a run
    cut short by `--max-replies` still holds every kind."""
    chains = calc_steps.load_calc_steps()
    steps = [
        Task(
            f"steps/{row['id']}",
            (Message("system", STEPS_PROMPT), Message("user", row["question"])),
            StepsCalculator,
            int(row["steps"]) + 2,
        )
        for row in chains[:3]
    ]
    calculator = [
        Task(
            f"calculator/{row['id']}",
            tuple(calc_steps.prepare_messages(row)),
            CalculatorEnvironment,
            int(row["steps"]) + 2,
        )
        for row in chains[3:5]
    ]
    rows = bfcl.load_bfcl("simple")[:4]
    single = [Task(f"bfcl/{row['id']}", tuple(bfcl.prepare_messages(row)), _bfcl_env(row), 1) for row in rows]
    (t1, s1), (t2, s2) = SAMPLED
    return [
        *[(t, 0.0, 0) for t in single[:3]],
        (steps[0], 0.0, 0),
        (calculator[0], 0.0, 0),
        (steps[0], t1, s1),
        (steps[1], 0.0, 0),
        (steps[0], t2, s2),
        (single[3], 0.0, 0),
        (calculator[1], 0.0, 0),
        (steps[1], t1, s1),
        (steps[2], 0.0, 0),
        (steps[1], t2, s2),
    ]


def _bfcl_env(row: dict[str, Any]) -> Callable[[], EnvironmentBase]:
    return lambda: bfcl.BFCLEnvironment.for_row(row)


def tool_spec(tool: Tool) -> dict[str, Any]:
    """A tool as recorded: name, description, JSON-schema parameters."""
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


class Recorder:
    """The proxy's turn function: forwards a chat request to the llama.cpp server and records
    the reply text. `current` names the run in progress (one at a time)."""

    def __init__(self, model: str, api_base: str, client: httpx2.AsyncClient, limit: int, out: Path) -> None:
        self.model = model
        self.out = out
        self.api_base = api_base
        self.client = client
        self.limit = limit
        self.rows: list[dict[str, Any]] = []
        self.current: tuple[Task, float, int, list[dict[str, Any]]] | None = None
        self._turn = 0

    def start(self, task: Task, temperature: float, seed: int, tools: Sequence[Tool]) -> None:
        self.current = (task, temperature, seed, [tool_spec(t) for t in tools])
        self._turn = 0

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.limit

    async def __call__(self, request: RecordedRequest) -> ScriptedReply:
        assert self.current is not None, "a request arrived outside a recorded run"
        task, temperature, seed, tools = self.current
        body = dict(request.json)
        body.pop("stream_options", None)
        body.update(stream=False, temperature=temperature, seed=seed, max_tokens=MAX_TOKENS)
        response = await self.client.post(f"{self.api_base}/chat/completions", json=body)
        response.raise_for_status()
        choice = response.json()["choices"][0]
        message = choice["message"]
        assert not message.get("tool_calls"), "the embedded server parsed tool calls itself (jinja on?)"
        reply = message.get("content") or ""
        row = {
            "model": self.model,
            "prompt_id": task.prompt_id,
            "turn": self._turn,
            "temperature": temperature,
            "seed": seed,
            "tools": tools,
            "reply": reply,
            "finish_reason": choice["finish_reason"],
        }
        self.rows.append(row)
        with self.out.open("a", encoding="utf-8") as f:  # as it comes: a run cut short keeps its replies
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._turn += 1
        # "length" is passed on, so a cut reply stays cut in the agent loop too
        return ScriptedReply(text=reply, finish_reason="length" if choice["finish_reason"] == "length" else None)


async def record_model(model: str, limit: int, out: Path, runs: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Run the tasks on one model until `limit` replies are recorded, each appended to `out`
    as it comes; the recorded rows."""
    server = await ensure_local_server(resolve_local_model(model))
    async with httpx2.AsyncClient(timeout=REPLY_TIMEOUT_S) as client:
        recorder = Recorder(model, server.api_base, client, limit, out)
        async with open_fake_server(recorder, chunk_size=3) as proxy:
            endpoint = Endpoint(
                "openai-compatible",
                model,
                api_base=proxy.base_url,
                transport="http",
                temperature=0.0,
                max_tokens=MAX_TOKENS,
                timeout=REPLY_TIMEOUT_S,  # never cut for slowness and never retried:
                max_retries=0,  # a retried request would record a reply twice
                extra_params={"parallel_tool_calls": False},  # as the `local` provider sends
            )
            planned = tasks()
            for task, temperature, seed in planned if runs is None else [planned[i] for i in runs]:
                if recorder.full:
                    break
                env = task.environment()
                recorder.start(task, temperature, seed, env.get_tools())
                actor = Actor(Trajectory(task.messages), endpoint, tools=tuple(env.get_tools()))
                turns = min(task.max_turns, limit - len(recorder.rows))
                await run_agent(AgentState(actor=actor, environment=env), RunConfig(max_turns=turns))
                print(
                    f"{model} {task.prompt_id} t={temperature} seed={seed}: {len(recorder.rows)} replies",
                    file=sys.stderr,
                )
    shutdown_local_server(server.spec)  # one model in memory at a time
    return recorder.rows


def review(out: Path) -> None:
    """Print each recorded reply and the calls the recovery code finds in it now."""
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            names = [t["name"] for t in row["tools"]]
            calls, rest = extract_text_tool_calls(row["reply"], names, limit=1)
            found = [(c.name, c.arguments) for c in calls]
            print(f"{row['model']} {row['prompt_id']} turn {row['turn']} seed {row['seed']} {row['finish_reason']}")
            print(f"  reply: {row['reply']!r}")
            print(f"  calls: {found!r}  rest: {rest.strip()!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--max-replies", type=int, default=40, help="replies recorded per model (default 40)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--review", action="store_true", help="print the recorded replies and what is recovered")
    parser.add_argument("--runs", type=int, nargs="+", help="only these runs (indices into tasks(), from 0)")
    parser.add_argument("--append", action="store_true", help="add to the model's file instead of replacing it")
    args = parser.parse_args()
    if args.review:
        review(args.out)
        return
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    for model in args.models:
        out = args.out / f"{model}.jsonl"
        if not args.append:
            out.write_text("", encoding="utf-8")
        rows = trio.run(record_model, model, args.max_replies, out, args.runs)
        counts[model] = len(rows)
    result = {
        "models": counts,
        "replies": sum(counts.values()),
        "wall_s": round(time.perf_counter() - started, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
