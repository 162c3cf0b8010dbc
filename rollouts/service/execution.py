"""How a worker runs one task: the agent version's endpoint and environment, the batch's system
prompt, `evaluate_sample` (the same code path as `evaluate()`), the score function if the batch
names one, and the outcome as a JSON result.

A task's input is `{"user_message": str}` or `{"messages": [Message JSON, ...]}`, with an
optional `context` object. The row the score function sees is the context's fields plus
`user_message` / `messages` / `context`, so built-in scorers find `answer` in the context.

What a task may use is the operator's policy (rollouts.service.policy): provider keys come
only from credentials it configures, read from the worker's environment and sent only to
their addresses; code is imported only from the modules it allows (built-in environments and
scorers need none). A key value is scrubbed from every error and result before it is stored.
"""

from __future__ import annotations

import functools
import importlib
import json
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any

from rollouts.config import parse_model_spec
from rollouts.dtypes import Endpoint, Message
from rollouts.errors import AuthenticationError
from rollouts.eval import scorers
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.run import evaluate_sample
from rollouts.eval.sample import Sample
from rollouts.providers import shared_ssl_context
from rollouts.service.policy import ServicePolicy

__all__ = [
    "BUILTIN_SCORERS",
    "ENVIRONMENTS",
    "TaskOutcome",
    "TaskSetting",
    "default_task_timeout_ms",
    "endpoint_from_spec",
    "resolve_environment",
    "resolve_score",
    "run_task",
    "task_messages",
    "task_setting",
]

# Environments a batch may name (tools that touch the worker's files or network are opt-in by
# reference, `module:Class`, since a worker runs tasks for whoever holds a token).
ENVIRONMENTS: dict[str, str] = {
    "basic": "rollouts.environments.basic:BasicEnvironment",
    "calculator": "rollouts.environments.calculator:CalculatorEnvironment",
}

_BUILTIN = ServicePolicy()
BUILTIN_SCORERS = scorers.BUILTIN_METRICS  # the same names as `rollouts eval --score`: one table


def _import(ref: str, what: str) -> Any:
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} must be a built-in name or module:attribute, got {ref!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what} {ref!r}: cannot import {module_name!r} on this worker ({e})") from None
    obj = getattr(module, attr, None)
    if obj is None:
        raise ValueError(f"{what} {ref!r}: {module_name!r} has no attribute {attr!r}")
    return obj


def resolve_score(ref: str | None, policy: ServicePolicy | None = None) -> Callable[[Sample], Any] | None:
    """A score function from a built-in scorer name (comma-separated names combine, each
    weighted 1) or `module:function` (one `policy` allows; PolicyError otherwise)."""
    if not ref:
        return None
    if ":" in ref:
        (policy or _BUILTIN).check_import(ref, "score")
        fn = _import(ref, "score")
        if not callable(fn):
            raise ValueError(f"score {ref!r} is not a function")
        return fn  # type: ignore[no-any-return]
    names = [n.strip() for n in ref.split(",") if n.strip()]
    unknown = [n for n in names if n not in BUILTIN_SCORERS]
    if unknown or not names:
        raise ValueError(
            f"unknown scorer {', '.join(unknown) or ref!r}; built-in scorers: {', '.join(sorted(BUILTIN_SCORERS))}, "
            "or module:function"
        )
    return scorers.builtin_score_fn(names)


def resolve_environment(ref: str | None, policy: ServicePolicy | None = None) -> Callable[[], Any] | None:
    """A factory for the environment named `ref` (None: the agent has no tools): a built-in
    name, or `module:Class` that `policy` allows (PolicyError otherwise); several joined with
    '+' are composed, `mcp/<name>` being the policy's MCP server `name` (a connection per
    environment made, so per sample)."""
    if not ref or ref == "none":
        return None
    if "+" in ref or ref.startswith("mcp/"):
        return _composed_factory(ref, policy or _BUILTIN)
    if ref not in ENVIRONMENTS:
        (policy or _BUILTIN).check_import(ref, "environment")
    target = ENVIRONMENTS.get(ref, ref)
    cls = _import(target, "environment")
    if not callable(cls):
        raise ValueError(f"environment {ref!r} is not a class or factory")
    return cls  # type: ignore[no-any-return]


def _composed_factory(ref: str, policy: ServicePolicy) -> Callable[[], Any]:
    from rollouts.environments.compose import compose
    from rollouts.environments.mcp import MCPEnvironment

    parts: list[tuple[str, Callable[[], Any]]] = []
    for part in ref.split("+"):
        if part.startswith("mcp/"):
            name = part.removeprefix("mcp/")
            server = policy.mcp_server(name, "environment")
            parts.append((f"{name}_", functools.partial(MCPEnvironment.connect, server)))
        else:
            factory = resolve_environment(part, policy)
            if factory is None:
                raise ValueError(f"environment {ref!r}: 'none' cannot be combined")
            parts.append(("", factory))

    async def make() -> Any:
        made: list[Any] = []
        try:
            for _, factory in parts:
                env = factory()
                made.append(await env if hasattr(env, "__await__") else env)
            try:
                return compose(*made)
            except ValueError:  # clashing tool names: each MCP server's are offered as <name>_<tool>
                return compose(*made, prefixes=[prefix for prefix, _ in parts])
        except BaseException:
            for env in made:
                close = getattr(env, "aclose", None)
                if close is not None:
                    await close()
            raise

    make.__qualname__ = f"environment[{ref}]"
    return make


# Providers whose models run on this machine's CPU (or a self-hosted GPU server): a task of a few
# turns takes minutes there, not the seconds a hosted API takes.
_SLOW_PROVIDERS = frozenset({"local", "llamacpp", "transformers"})
HOSTED_TASK_TIMEOUT_MS = 30_000
LOCAL_TASK_TIMEOUT_MS = 600_000


def default_task_timeout_ms(endpoint_spec: Mapping[str, Any]) -> int:
    """A batch's or GEPA job's `timeout_per_task_ms` when the request gives none: 30 s for a
    hosted model, 10 minutes for one that runs locally (the embedded model, llama.cpp,
    transformers), which at 30 s timed out every task and scored 0."""
    model = str(endpoint_spec.get("model", ""))
    provider = str(endpoint_spec.get("provider") or "")
    if not provider:
        try:
            provider = parse_model_spec(model, api_base=str(endpoint_spec.get("api_base") or ""))[0]
        except ValueError:
            provider = ""
    return LOCAL_TASK_TIMEOUT_MS if provider in _SLOW_PROVIDERS else HOSTED_TASK_TIMEOUT_MS


def endpoint_from_spec(
    spec: Mapping[str, Any], model: str | None = None, policy: ServicePolicy | None = None
) -> Endpoint:
    """The Endpoint an agent version's spec describes, if `policy` allows it (PolicyError
    otherwise), its key read from its credential's variable in this process's environment."""
    return (policy or _BUILTIN).endpoint(spec, model)


def task_messages(task_input: Mapping[str, Any], system_prompt: str) -> list[Message]:
    msgs: list[Message] = []
    given = task_input.get("messages")
    if given is not None:
        msgs = [m if isinstance(m, Message) else Message.from_dict(m) for m in given]
    else:
        msgs = [Message("user", str(task_input.get("user_message", "")))]
    if system_prompt and not (msgs and msgs[0].role == "system"):
        msgs.insert(0, Message("system", system_prompt))
    return msgs


def task_row(task_input: Mapping[str, Any]) -> dict[str, Any]:
    context = task_input.get("context") or {}
    row: dict[str, Any] = dict(context) if isinstance(context, Mapping) else {}
    row.update({k: v for k, v in task_input.items() if k in ("user_message", "messages", "context")})
    return row


@dataclass(frozen=True)
class TaskOutcome:
    status: str  # completed | failed | timeout
    result: dict[str, Any] | None
    error: str | None
    execution_time_ms: int


def _scrub(text: str | None, secrets: tuple[str, ...]) -> str | None:
    if text is None:
        return None
    for s in secrets:
        if s and s in text:
            text = text.replace(s, "***")
    return text


def _scrub_json(data: dict[str, Any], secrets: tuple[str, ...]) -> dict[str, Any]:
    text = json.dumps(data)
    if not any(s and s in text for s in secrets):
        return data
    return json.loads(_scrub(text, secrets) or "{}")  # type: ignore[no-any-return]


# The input of the task being run (set by run_task in its trio task): a batch's one EvalConfig
# prepares every task's messages from it.
_TASK_INPUT: ContextVar[Mapping[str, Any]] = ContextVar("rollouts_service_task_input")


@dataclass(frozen=True)
class TaskSetting:
    """What every task of a batch shares, made once per batch (not per task): the EvalConfig
    (endpoint, score function, environment, max turns, the batch's system prompt, the per-task
    time limit) and the secrets to scrub from what is stored."""

    config: EvalConfig
    secrets: tuple[str, ...]


def task_setting(
    *,
    endpoint: Endpoint,
    system_prompt: str,
    max_turns: int,
    time_limit_s: float,
    score_fn: Callable[[Sample], Any] | None = None,
    environment_factory: Callable[[], Any] | None = None,
    provider_error_retries: int = 2,
) -> TaskSetting:
    """The TaskSetting of a batch; `time_limit_s` is its per-task limit (a task given less time,
    near the batch deadline, runs with a copy)."""

    def prepare(row: Row) -> list[Message]:
        return task_messages(_TASK_INPUT.get(), system_prompt)

    config = EvalConfig(
        endpoint=endpoint,
        score_fn=score_fn,
        prepare_messages=prepare,
        environment_factory=environment_factory,
        max_turns=max_turns,
        sample_timeout_s=max(time_limit_s, 0.001),
        provider_error_retries=provider_error_retries,
        retry_backoff_s=0.2,
        retry_backoff_max_s=5.0,
        show_progress=False,
        eval_name="service",
    )
    return TaskSetting(config, (endpoint.api_key,) if len(endpoint.api_key) >= 4 else ())


def warm_up() -> None:
    """Pay, before a worker takes its first task, what its first task would pay once per
    process (~90 ms of CPU): the TLS context every HTTP client is built with (~40 ms: the
    system's CA certificates are loaded) and the source lookups behind a batch setting's
    fingerprint (~50 ms: `inspect` maps every loaded module to its file the first time; the
    source hash of the setting's own code is then cached). Idempotent and cheap after the
    first call. Without it a worker's first batch, and each of a fleet's workers, pays it
    inside the batch's time: GEPA's minibatches of a few tasks most of all."""
    shared_ssl_context()
    setting = task_setting(
        endpoint=Endpoint("openai-compatible", "warm-up", api_base="http://127.0.0.1:9/v1", api_key="unused"),
        system_prompt="",
        max_turns=1,
        time_limit_s=1.0,
        score_fn=resolve_score("exact_match"),
    )
    assert setting.config.fingerprint is not None


async def run_task(
    task_input: Mapping[str, Any],
    task_id: str,
    setting: TaskSetting,
    *,
    time_limit_s: float,
    timeout_reason: str,
) -> TaskOutcome:
    """Run one task through `evaluate_sample`; never raises for a problem of the task (only
    cancellation propagates)."""
    started = time.perf_counter()
    secrets = setting.secrets
    config = setting.config
    if max(time_limit_s, 0.001) != config.sample_timeout_s:
        config = replace(config, sample_timeout_s=max(time_limit_s, 0.001))
    token = _TASK_INPUT.set(task_input)
    exited: SystemExit | None = None
    try:
        try:
            sample = await evaluate_sample(task_row(task_input), task_id, config)
        except* SystemExit as group:  # the task's code asked the process to exit: the task fails, the worker stays
            exited = group.exceptions[0] if isinstance(group.exceptions[0], SystemExit) else SystemExit()
    except AuthenticationError as e:
        ms = int((time.perf_counter() - started) * 1000)
        return TaskOutcome("failed", None, _scrub(f"authentication failed: {e}", secrets), ms)
    finally:
        _TASK_INPUT.reset(token)
    ms = int((time.perf_counter() - started) * 1000)
    if exited is not None:
        return TaskOutcome("failed", None, f"the task's code tried to exit the worker (SystemExit {exited.code!r})", ms)
    status = "completed"
    error = sample.error
    if sample.status != "completed":
        status = "failed"
        if error and error.startswith("timed out after"):
            status, error = "timeout", f"timed out after {time_limit_s:g}s ({timeout_reason})"
    result = {
        "trajectory": sample.trajectory.to_dict() if sample.trajectory is not None else None,
        "score": sample.score.to_dict() if sample.score is not None else None,
        "stop_reason": sample.stop_reason,
        "usage": sample.metadata.get("usage"),
        "turns": sample.metadata.get("turns"),
    }
    return TaskOutcome(status, _scrub_json(result, secrets), _scrub(error, secrets), ms)
