"""Data for the viewer's tests, written through rollouts' own writers: a session store with
branches, two eval runs on the same dataset, a finished GEPA run and a running one."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from rollouts.dtypes import (
    Completion,
    Endpoint,
    Message,
    TextContent,
    ThinkingContent,
    ToolCallContent,
    Trajectory,
    Usage,
)
from rollouts.eval.io import REPORT_FILE, SAMPLES_FILE, SampleLog, write_json_atomic
from rollouts.eval.report import EvalReport
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.gepa.budget import Budget
from rollouts.gepa.checkpoint import REFLECTIONS_FILE, STATE_FILE, JsonlLog, write_result_files
from rollouts.gepa.result import CandidateRecord, GEPAResult, IterationRecord
from rollouts.gepa.state import GEPAState
from rollouts.store import FileSessionStore, SessionStatus

XSS = '<script>document.body.setAttribute("data-pwned", "1")</script><img src=x onerror="document.body.setAttribute(\'data-pwned\',\'2\')">'
EP = Endpoint("anthropic", "claude-sonnet-4-5")


@dataclass(frozen=True)
class ViewData:
    root: Path
    sessions: Path
    eval_a: Path
    eval_b: Path
    gepa: Path
    gepa_running: Path
    eval_running: Path
    root_session: str
    branch_session: str
    xss_session: str


def assistant(text: str, *, tool: bool = False, thinking: str = "") -> Message:
    blocks: list[ThinkingContent | TextContent | ToolCallContent] = []
    if thinking:
        blocks.append(ThinkingContent(thinking))
    blocks.append(TextContent(text))
    if tool:
        blocks.append(ToolCallContent("call_1", "calculator", {"expression": "7 + 5 * 3"}))
    return Message("assistant", tuple(blocks), provider="anthropic", model="claude-sonnet-4-5",
                   usage=Usage(input_tokens=120, output_tokens=30, cost_usd=0.0012))  # fmt: skip


async def write_sessions(root: Path) -> tuple[str, str, str]:
    async with FileSessionStore(root, fsync_every=0) as store:
        s = await store.create(endpoint=EP, tags={"project": "demo"})
        await store.append_message(s.session_id, Message("user", "what is 7 + 5 * 3?"))
        await store.append_message(s.session_id, assistant("Let me compute.", tool=True, thinking="precedence first"))
        await store.append_message(
            s.session_id, Message("tool", "22", tool_call_id="call_1", details={"tool_name": "calculator"})
        )
        await store.append_message(s.session_id, assistant("The answer is 22."))
        await store.update(s.session_id, status=SessionStatus.COMPLETED)
        b = await store.branch(s.session_id, 2, tags={"variant": "retry"})
        await store.append_message(
            b.session_id,
            Message("tool", "division by zero", tool_call_id="call_1", details={"is_error": True}),
        )
        await store.append_message(b.session_id, assistant("The tool failed; the answer is 22 anyway."))
        await store.update(b.session_id, status=SessionStatus.FAILED)
        x = await store.create(endpoint=Endpoint("openai", "gpt-4.1"), tags={"project": "xss"})
        await store.append_message(x.session_id, Message("user", "say something dangerous"))
        await store.append_message(x.session_id, assistant(XSS))
        await store.update(x.session_id, status=SessionStatus.COMPLETED)
    return s.session_id, b.session_id, x.session_id


def make_sample(i: int, correct: bool, *, status: str = "completed", text: str | None = None) -> Sample:
    answer = str(i * 3)
    response = text if text is not None else (answer if correct else "I am not sure")
    traj = Trajectory(
        messages=(Message("user", f"what is {i} * 3?"), assistant(response)),
        completions=(Completion("anthropic", "claude-sonnet-4-5", "stop", 1, 0.25 + i / 100),),
    )
    score = Score((Metric("correct", 1.0 if correct else 0.0, 1.0), Metric("length", float(len(response)), 0.0)))
    return Sample(
        id=f"q{i:03d}",
        input={"question": f"what is {i} * 3?", "answer": answer},
        trajectory=traj if status == "completed" else None,
        score=score if status == "completed" else None,
        status=status,  # type: ignore[arg-type]
        error=None if status == "completed" else "provider error: 529 overloaded",
        metadata={"level": "easy" if i % 2 else "hard"},
    )


def write_eval(out: Path, samples: list[Sample], name: str, *, report: bool = True) -> None:
    log = SampleLog(out / SAMPLES_FILE)
    for s in samples:
        log.write(s)
    log.close()
    if report:
        write_json_atomic(
            out / REPORT_FILE,
            EvalReport(name, tuple(samples), duration_s=3.5, started_at="2026-11-24T08:00:00Z").to_dict(),
        )


def gepa_result(n: int = 4) -> GEPAResult:
    texts = ["Answer briefly.", "Answer briefly.\nShow the arithmetic.", "Answer with the number only.",
             "Answer with the number only.\nCheck operator precedence."]  # fmt: skip
    cands = []
    for i in range(n):
        scores = {k: float((k + i) % 3 != 0 or i == n - 1) for k in range(4)}
        parents = () if i == 0 else ((i - 1,) if i != 2 else (0,))
        cands.append(CandidateRecord(i, {"system_prompt": texts[i % 4]}, parents, "seed" if i == 0 else "mutation",
                                     i, ("system_prompt",) if i else (), scores, {}, 4))  # fmt: skip
    history = tuple(
        IterationRecord(
            i,
            "mutation",
            "accepted",
            (cands[i].parents[0],),
            (0, 1),
            ("system_prompt",),
            (0.0, 1.0),
            (1.0, 1.0),
            i,
            4 + 6 * i,
            "improved on the minibatch",
        )
        for i in range(1, n)
    )
    best = max(range(n), key=lambda i: (cands[i].val_score, -i))
    front = tuple(
        tuple(c.idx for c in cands if c.val_scores[k] == max(x.val_scores[k] for x in cands)) for k in range(4)
    )
    return GEPAResult(tuple(cands), best, 4 + 6 * (n - 1), 100, n - 1, "budget", 4, front, history)


def write_gepa(run_dir: Path, *, finished: bool = True, n: int = 4) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    result = gepa_result(n)
    state = GEPAState(valset_size=4, candidates=list(result.candidates), history=list(result.history),
                      iteration=n - 1, budget=Budget(spent=result.metric_calls))  # fmt: skip
    write_json_atomic(run_dir / STATE_FILE, state.to_dict())
    log = JsonlLog(run_dir / REFLECTIONS_FILE)
    for i in range(1, n):
        log.append({"key": f"{i}:system_prompt:x", "iteration": i, "component": "system_prompt",
                    "prompt": f"Improve this prompt (iteration {i}) {XSS}", "answer": f"```\n{result.candidates[i].components['system_prompt']}\n```"})  # fmt: skip
    log.close()
    if finished:
        write_result_files(run_dir, result)


async def make_view_data(root: Path) -> ViewData:
    rng = random.Random(1)
    sessions = root / "sessions"
    a, b, x = await write_sessions(sessions)
    runs = root / "runs"
    samples_a = [make_sample(i, rng.random() < 0.6) for i in range(120)]
    samples_a[5] = make_sample(5, False, status="provider_error")
    samples_a[7] = make_sample(7, True, text=XSS)
    write_eval(runs / "baseline", samples_a, "arith-baseline")
    samples_b = [make_sample(i, (s.reward > 0) != (i % 10 == 0)) for i, s in enumerate(samples_a)]
    write_eval(runs / "candidate", samples_b, "arith-candidate")
    write_eval(runs / "live-eval", [make_sample(i, True) for i in range(10)], "arith-live", report=False)
    write_gepa(runs / "gepa-done", finished=True)
    write_gepa(runs / "gepa-live", finished=False, n=2)
    return ViewData(
        root,
        sessions,
        runs / "baseline",
        runs / "candidate",
        runs / "gepa-done",
        runs / "gepa-live",
        runs / "live-eval",
        a,
        b,
        x,
    )


def append_gepa_candidate(run_dir: Path, n: int) -> None:
    """Rewrite state.json as a running GEPA run with `n` candidates (what the engine does)."""
    result = gepa_result(n)
    state = GEPAState(valset_size=4, candidates=list(result.candidates), history=list(result.history),
                      iteration=n - 1, budget=Budget(spent=result.metric_calls))  # fmt: skip
    write_json_atomic(run_dir / STATE_FILE, state.to_dict())


def read_json(path: Path) -> object:
    return json.loads(path.read_text())
