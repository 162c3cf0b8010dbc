"""OpenTelemetry traces of agent runs, model calls, tool calls, evaluations and GEPA.

    from rollouts.tracing import enable_tracing
    enable_tracing()          # the standard OTLP exporter, configured by the OTEL_* variables
    ...
    disable_tracing()         # flush what is buffered and stop

Off by default, and then free: every hook is one test of a module attribute (`tracer is None`;
`benchmarks/evaluate.py` measures the difference). On (`enable_tracing()`, or `ROLLOUTS_OTEL=1`
for the CLI), each of these is a span, nested as they run:

* `invoke_agent` — one `run_agent` (`gen_ai.operation.name`, `gen_ai.provider.name`,
  `gen_ai.request.model`, `rollouts.session.id`; at its end `rollouts.turns`, `rollouts.stop_reason`);
* `turn N` — one step of the loop (`rollouts.turn.index`);
* `chat MODEL` — one model call, named and described by the OpenTelemetry GenAI semantic
  conventions: `gen_ai.operation.name = "chat"`, `gen_ai.provider.name` (and the older
  `gen_ai.system`), `gen_ai.request.model`, `gen_ai.request.max_tokens`,
  `gen_ai.request.temperature`, `gen_ai.response.model`, `gen_ai.response.finish_reasons`,
  `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, plus `rollouts.usage.*` (cache
  tokens), `rollouts.cost_usd` and `rollouts.attempts`;
* `execute_tool NAME` — one tool call (`gen_ai.tool.name`, `gen_ai.tool.call.id`,
  `gen_ai.tool.type`; an error result sets the span's status to ERROR);
* `evaluate_sample` — one sample of `evaluate()` (`rollouts.eval.name`, `rollouts.sample.id`,
  `rollouts.sample.epoch` when epochs > 1; at its end `rollouts.sample.status`,
  `rollouts.sample.reward`);
* `gepa.iteration` and `gepa.reflection` — one GEPA proposal and one reflection call
  (`rollouts.gepa.iteration`, `rollouts.gepa.kind`, `rollouts.gepa.component`).

No message, prompt or tool argument text is put in a span (the GenAI conventions make content
opt-in); every string attribute and status description is masked with the process's known
secrets (`rollouts.redaction`), and exceptions are recorded by type and masked message, never
with a traceback's locals. Exporting: with no `tracer_provider`, `enable_tracing()` uses the
tracer provider the application installed globally, else makes one with the standard OTLP/HTTP
exporter (`opentelemetry-exporter-otlp-proto-http`), which reads `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_HEADERS`, ..., and a resource from
`OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` (service name `rollouts` by default).
Install with `pip install 'rollouts[otel]'`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeAlias

from rollouts.redaction import known_secrets

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from rollouts.dtypes import Actor, AgentState, ToolCall, ToolResult
    from rollouts.eval.sample import Sample

__all__ = [
    "Attributes",
    "disable_tracing",
    "enable_tracing",
    "enable_tracing_from_env",
    "span",
    "tracer",
]

Attributes: TypeAlias = Mapping[str, "str | bool | int | float | Sequence[str] | None"]

tracer: Tracer | None = None
"""The tracer spans are made with; None while tracing is off (every hook tests this first)."""

_owned: Any = None  # the TracerProvider enable_tracing() made (shut down by disable_tracing)
_MAX_TEXT = 500  # characters of an error text kept in a status description


def enable_tracing(tracer_provider: TracerProvider | None = None) -> None:
    """Turn tracing on. `tracer_provider`: where spans go (e.g. an SDK `TracerProvider` with an
    in-memory exporter in tests); None: the globally installed one if the application set one,
    else a new SDK provider exporting over OTLP/HTTP as the `OTEL_*` variables say. Needs the
    `otel` extra (`opentelemetry-api`, `-sdk`, `-exporter-otlp-proto-http`)."""
    global tracer, _owned
    try:
        from opentelemetry import trace
    except ImportError as e:  # pragma: no cover (the otel extra is part of the test install)
        from rollouts.errors import ConfigurationError

        raise ConfigurationError(
            "tracing needs OpenTelemetry: pip install 'rollouts[otel]' (opentelemetry-api, -sdk and the OTLP exporter)"
        ) from e
    from rollouts import __version__

    provider = tracer_provider
    if provider is None:
        installed = trace.get_tracer_provider()
        if isinstance(installed, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            provider = _owned = _otlp_provider()
        else:
            provider = installed
    tracer = trace.get_tracer("rollouts", __version__, tracer_provider=provider)


def _otlp_provider() -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    defaults = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "rollouts"}
    provider = TracerProvider(resource=Resource.create(defaults))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def enable_tracing_from_env() -> bool:
    """`enable_tracing()` when `ROLLOUTS_OTEL` is `1`/`true`/`yes` (the CLI calls this); whether it did."""
    if os.environ.get("ROLLOUTS_OTEL", "").strip().lower() in ("1", "true", "yes"):
        enable_tracing()
        return True
    return False


def disable_tracing() -> None:
    """Turn tracing off; a provider `enable_tracing()` made is flushed and shut down."""
    global tracer, _owned
    tracer = None
    owned, _owned = _owned, None
    if owned is not None:
        owned.shutdown()  # (flushes the batch processor: spans of a run are exported before exit)


# ---- spans ------------------------------------------------------------------------------------


def _masked(attributes: Attributes) -> dict[str, Any]:
    redact = known_secrets().redact
    out: dict[str, Any] = {}
    for k, v in attributes.items():
        if v is None:
            continue
        if isinstance(v, str):
            out[k] = redact(v)
        elif isinstance(v, list | tuple):
            out[k] = [redact(x) if isinstance(x, str) else x for x in v]
        else:
            out[k] = v
    return out


def set_attributes(sp: Span, attributes: Attributes) -> None:
    """Set `attributes` on `sp`, masked (None values left out)."""
    sp.set_attributes(_masked(attributes))


def fail(sp: Span, error: BaseException | str) -> None:
    """Mark `sp` failed: status ERROR with a masked description, `error.type` the exception's type."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, BaseException):
        kind, text = type(error).__qualname__, f"{type(error).__name__}: {error}"
    else:
        kind, text = "error", error
    text = known_secrets().redact(text)[:_MAX_TEXT]
    sp.set_attribute("error.type", kind)
    sp.set_status(Status(StatusCode.ERROR, text))


@contextmanager
def span(name: str, attributes: Attributes) -> Iterator[Span]:
    """A span named `name` (the current one while the block runs), with masked `attributes`;
    an exception leaving the block marks it failed (and propagates). Only call it when
    `tracer is not None`."""
    assert tracer is not None, "tracing is off: test rollouts.tracing.tracer first"
    with tracer.start_as_current_span(
        known_secrets().redact(name),
        attributes=_masked(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as sp:
        try:
            yield sp
        except BaseException as e:
            fail(sp, e)
            raise


# ---- what each hook records ------------------------------------------------------------------------


def agent_attributes(state: AgentState) -> dict[str, Any]:
    ep = state.actor.endpoint
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.provider.name": ep.provider,
        "gen_ai.request.model": ep.model,
        "rollouts.session.id": state.session_id,
        "rollouts.environment": type(state.environment).__name__ if state.environment is not None else None,
    }


def agent_end_attributes(states: Sequence[AgentState]) -> dict[str, Any]:
    final = states[-1]
    return {
        "rollouts.turns": final.turn_idx,
        "rollouts.stop_reason": final.stop.value if final.stop is not None else None,
        "rollouts.session.id": final.session_id,
    }


def model_call_name(actor: Actor) -> str:
    return f"chat {actor.endpoint.model}"


def model_call_attributes(actor: Actor) -> dict[str, Any]:
    ep = actor.endpoint
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": ep.provider,
        "gen_ai.system": ep.provider,
        "gen_ai.request.model": ep.model,
        "gen_ai.request.max_tokens": ep.max_tokens,
        "gen_ai.request.temperature": ep.temperature,
        "rollouts.messages": len(actor.trajectory.messages),
        "rollouts.tools": len(actor.tools),
    }


def model_result_attributes(before: Actor, after: Actor) -> dict[str, Any]:
    """What the call produced: the new message's model and usage, the completion's finish reason."""
    messages = after.trajectory.messages
    message = messages[-1] if len(messages) > len(before.trajectory.messages) else None
    completion = after.trajectory.completions[-1] if after.trajectory.completions else None
    out: dict[str, Any] = {}
    if message is not None:
        out["gen_ai.response.model"] = message.model
        usage = message.usage
        if usage is not None:
            out.update(
                {
                    "gen_ai.usage.input_tokens": usage.input_tokens,
                    "gen_ai.usage.output_tokens": usage.output_tokens,
                    "rollouts.usage.cache_read_tokens": usage.cache_read_tokens,
                    "rollouts.usage.cache_write_tokens": usage.cache_write_tokens,
                    "rollouts.usage.reasoning_tokens": usage.reasoning_tokens,
                    "rollouts.cost_usd": usage.cost_usd,
                }
            )
    if completion is not None:
        out["gen_ai.response.finish_reasons"] = [completion.finish_reason or "unknown"]
        out["rollouts.attempts"] = completion.attempts
        out["rollouts.duration_s"] = completion.duration_s
    return out


def sample_result(sp: Span, sample: Sample) -> None:
    """A finished sample's status and reward; a failed sample (or a provider error) fails the span."""
    set_attributes(
        sp,
        {
            "rollouts.sample.status": sample.status,
            "rollouts.sample.reward": sample.reward if sample.score is not None else None,
        },
    )
    if sample.status != "completed":
        lines = (sample.error or "").strip().splitlines()
        fail(sp, lines[0] if lines else sample.status)


def tool_attributes(call: ToolCall) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }


def tool_result(sp: Span, result: ToolResult) -> None:
    if result.is_error:
        fail(sp, result.content)
    if result.stop_reason is not None:
        sp.set_attribute("rollouts.stop_reason", str(result.stop_reason))


_OFF: AbstractContextManager[None] = nullcontext()


def gepa_iteration(iteration: int, kind: str) -> AbstractContextManager[Any]:
    """The span of one GEPA proposal (a no-op context while tracing is off)."""
    if tracer is None:
        return _OFF
    return span("gepa.iteration", {"rollouts.gepa.iteration": iteration, "rollouts.gepa.kind": kind})


def gepa_reflection(iteration: int, component: str) -> AbstractContextManager[Any]:
    """The span of one reflection-model call (a no-op context while tracing is off)."""
    if tracer is None:
        return _OFF
    return span("gepa.reflection", {"rollouts.gepa.iteration": iteration, "rollouts.gepa.component": component})
