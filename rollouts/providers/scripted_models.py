"""Built-in scripted models for offline demos and tests: `--model scripted/NAME`, or
`BaseModelConfig("scripted/NAME").to_endpoint()` from Python (which creates them on first use).

    echo        answers "You said: <your message>" (with a short thinking block first)
    calculator  solves "what is 7 + 5 * 3?" left to right with the calculator tools when the
                environment has them, otherwise answers in text
    slow        streams a long answer slowly (about 30 s): for trying Ctrl-C
    shell       runs your message as a `bash` command (with --env coding), then reports the result
    fail        fails every call with a provider error

They stream exactly like a real provider (same events, same aggregation). When the environment
variable ROLLOUTS_SCRIPTED_CALL_LOG names a file, every call appends one line to it, so a test
in another process can count model calls.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

from rollouts.errors import ProviderError
from rollouts.providers.scripted import (
    ReplyLike,
    ScriptedModel,
    ScriptedReply,
    ScriptedRequest,
    ScriptedToolCall,
    get_scripted_model,
)

__all__ = ["BUILTIN_SCRIPTED_MODELS", "ensure_builtin_scripted_model"]

CALL_LOG_ENV = "ROLLOUTS_SCRIPTED_CALL_LOG"


def _log_call(name: str, request: ScriptedRequest) -> None:
    path = os.environ.get(CALL_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(
                json.dumps({"model": name, "call_index": request.call_index, "user": request.last_user_text}) + "\n"
            )


def _echo(request: ScriptedRequest) -> ReplyLike:
    _log_call("echo", request)
    text = request.last_user_text.strip()
    return ScriptedReply(text=f"You said: {text}", thinking="The user wants their words back.")


_NUMBER = r"-?\d+(?:\.\d+)?"
_OPS = {"+": "add", "-": "subtract", "*": "multiply", "x": "multiply", "/": "divide"}
_CURRENT = re.compile(r"Current value: (" + _NUMBER + r")")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _num(s: str) -> float:
    return float(s) if "." in s else int(s)


def _parse_chain(text: str) -> tuple[float, list[tuple[str, float]]] | None:
    """`7 + 5 * 3` -> (7, [("+", 5), ("*", 3)]), read left to right."""
    cleaned = text.replace("(", " ").replace(")", " ")
    m = re.search(rf"({_NUMBER})((?:\s*[-+*/x]\s*{_NUMBER})+)", cleaned)
    if m is None:
        return None
    first = _num(m.group(1))
    steps = [(op, _num(n)) for op, n in re.findall(rf"\s*([-+*/x])\s*({_NUMBER})", m.group(2))]
    return first, steps


def _apply(value: float, op: str, n: float) -> float:
    if op == "+":
        return value + n
    if op == "-":
        return value - n
    if op in ("*", "x"):
        return value * n
    return value / n if n else float("nan")


def _calculator(request: ScriptedRequest) -> ReplyLike:
    _log_call("calculator", request)
    has_tools = any(t.name == "add" for t in request.tools)
    last = request.messages[-1] if request.messages else None
    chain = _parse_chain(request.last_user_text)
    if chain is None:
        return "I can only do arithmetic: ask me something like 'what is 7 + 5 * 3?'"
    first, steps = chain
    if not has_tools:
        value = first
        for op, n in steps:
            value = _apply(value, op, n)
        return f"The answer is {_fmt(value)}."
    if last is not None and last.role == "tool":
        found = _CURRENT.findall(last.text)
        result = found[-1] if found else "unknown"
        return ScriptedReply(
            text=f"The answer is {result}.",
            tool_calls=(ScriptedToolCall("complete_task", {"final_result": result}),),
        )
    calls = [ScriptedToolCall("add", {"value": first})]
    calls += [ScriptedToolCall(_OPS[op], {"value": n}) for op, n in steps]
    return ScriptedReply(text="Let me work that out step by step.", tool_calls=tuple(calls))


_SLOW_TEXT = " ".join(f"word{i}" for i in range(1, 401))


def _slow(request: ScriptedRequest) -> ReplyLike:
    _log_call("slow", request)
    return ScriptedReply(text=f"Here is a long answer: {_SLOW_TEXT}.", thinking="This will take a while.")


def _shell(request: ScriptedRequest) -> ReplyLike:
    _log_call("shell", request)
    if not any(t.name == "bash" for t in request.tools):
        return "I need a bash tool: run me with --env coding."
    last = request.messages[-1] if request.messages else None
    if last is not None and last.role == "tool":
        if last.is_error:
            return f"The command did not run: {last.text}"
        return f"Done. Output:\n{last.text.strip()}"
    return ScriptedReply(
        text="I'll run that.", tool_calls=(ScriptedToolCall("bash", {"command": request.last_user_text.strip()}),)
    )


def _fail(request: ScriptedRequest) -> ReplyLike:
    _log_call("fail", request)
    return ProviderError("scripted/fail always fails (HTTP 500 from a pretend server)", provider="scripted")


BUILTIN_SCRIPTED_MODELS: dict[str, Callable[[], ScriptedModel]] = {
    "echo": lambda: ScriptedModel(_echo, name="echo", chunk_size=4),
    "calculator": lambda: ScriptedModel(_calculator, name="calculator", chunk_size=6),
    "slow": lambda: ScriptedModel(_slow, name="slow", chunk_size=6, chunk_delay_s=0.1),
    "shell": lambda: ScriptedModel(_shell, name="shell"),
    "fail": lambda: ScriptedModel(_fail, name="fail"),
}


def ensure_builtin_scripted_model(name: str) -> ScriptedModel:
    """The scripted model `name`, creating a built-in one on first use. Raises RolloutsError
    listing the built-in names when there is no such model."""
    from rollouts.errors import RolloutsError

    try:
        return get_scripted_model(name)
    except RolloutsError:
        factory = BUILTIN_SCRIPTED_MODELS.get(name)
        if factory is None:
            raise RolloutsError(
                f"no scripted model named {name!r}; built-in ones: {', '.join(sorted(BUILTIN_SCRIPTED_MODELS))}"
            ) from None
        return factory()
