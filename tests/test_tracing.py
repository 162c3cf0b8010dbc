"""Issue 30 item 3: OpenTelemetry traces.

With the SDK's in-memory exporter: the spans of an evaluation (sample -> agent -> turn -> model
call / tool call) with the GenAI semantic-convention attributes, failures as ERROR statuses,
GEPA's iteration and reflection spans, and no key anywhere in a span although the fake server
repeats every key it is sent (in content, in error bodies). Then the real thing: `rollouts eval`
with `ROLLOUTS_OTEL=1` exports over the standard OTLP/HTTP exporter to a collector on 127.0.0.1
named only by `OTEL_EXPORTER_OTLP_ENDPOINT`. Tracing off records nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import pytest
import trio
from _gepa_task import TagTask, rows
from cli_support import CLI, FAKE_KEYS, cli_env
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from rollouts import tracing
from rollouts.dtypes import Endpoint, Message, Usage
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.eval.config import EvalConfig
from rollouts.eval.run import evaluate
from rollouts.gepa import optimize
from rollouts.providers._retry import retry_policy
from rollouts.testing import RecordedRequest, ScriptedReply, ScriptedToolCall, http_error, open_fake_server

KEY = "sk-FAKEKEY-tracing-0123456789-secret"
MODEL = "fake-model"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable_tracing(provider)
    with retry_policy(base_delay=0.01, max_delay=0.02):
        try:
            yield exporter
        finally:
            tracing.disable_tracing()
            provider.shutdown()


def _by_name(finished: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name.startswith(prefix)]


def _parent(finished: tuple[ReadableSpan, ...], span: ReadableSpan) -> ReadableSpan:
    assert span.parent is not None, span.name
    return next(s for s in finished if s.context.span_id == span.parent.span_id)


def _everything(span: ReadableSpan) -> str:
    """Every text a span carries: name, attributes, status, events."""
    return json.dumps(
        [
            span.name,
            {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
            span.status.description,
            [[e.name, dict(e.attributes or {})] for e in span.events],
        ],
        default=str,
    )


def _calculator(request: RecordedRequest) -> ScriptedReply:
    """Adds the row's number, then completes; repeats the key it was sent in everything it says."""
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    messages = request.json["messages"]
    if messages[-1]["role"] == "tool":
        return ScriptedReply(
            f"Done with {key}.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": key}),), usage=_USAGE
        )
    value = int(messages[-1]["content"].split()[-1])
    return ScriptedReply(f"Adding, key {key}.", tool_calls=(ScriptedToolCall("add", {"value": value}),), usage=_USAGE)


_USAGE = Usage(input_tokens=21, output_tokens=7)


async def test_an_evaluation_is_traced_sample_agent_turn_model_call_and_tool_call(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    async with open_fake_server(_calculator) as srv:
        ep = Endpoint("openai-compatible", MODEL, api_base=srv.url, api_key=KEY, max_tokens=64, temperature=0.5)
        config = EvalConfig(
            endpoint=ep,
            environment_factory=CalculatorEnvironment,
            prepare_messages=lambda row: [Message("user", f"add {row['n']}")],
            score_fn=None,
            show_progress=False,
            eval_name="traced",
        )
        report = await evaluate([{"id": "r1", "n": 3}, {"id": "r2", "n": 4}], config)
    assert report.summary["counts"]["completed"] == 2
    finished = spans.get_finished_spans()

    samples = _by_name(finished, "evaluate_sample")
    assert sorted(s.attributes["rollouts.sample.id"] for s in samples) == ["r1", "r2"]  # type: ignore[index]
    for s in samples:
        assert s.attributes is not None
        assert (s.attributes["rollouts.eval.name"], s.attributes["rollouts.sample.status"]) == ("traced", "completed")
        assert s.status.status_code == StatusCode.UNSET

    agents = _by_name(finished, "invoke_agent")
    assert len(agents) == 2
    for a in agents:
        assert _parent(finished, a).name == "evaluate_sample"
        assert a.attributes is not None
        assert a.attributes["gen_ai.request.model"] == MODEL
        assert (a.attributes["rollouts.turns"], a.attributes["rollouts.stop_reason"]) == (2, "task_completed")

    turns = _by_name(finished, "turn ")
    assert sorted(t.name for t in turns) == ["turn 0", "turn 0", "turn 1", "turn 1"]
    assert {_parent(finished, t).name for t in turns} == {"invoke_agent"}

    calls = _by_name(finished, "chat ")
    assert len(calls) == 4 and {c.name for c in calls} == {f"chat {MODEL}"}
    for c in calls:
        assert _parent(finished, c).name.startswith("turn ")
        attrs = c.attributes
        assert attrs is not None
        assert attrs["gen_ai.operation.name"] == "chat"
        assert (attrs["gen_ai.provider.name"], attrs["gen_ai.request.model"]) == ("openai-compatible", MODEL)
        assert (attrs["gen_ai.request.max_tokens"], attrs["gen_ai.request.temperature"]) == (64, 0.5)
        assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (21, 7)
        assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("tool_use",)  # type: ignore[arg-type]
        assert attrs["gen_ai.response.model"] == MODEL

    tools = _by_name(finished, "execute_tool ")
    assert sorted(t.name for t in tools) == ["execute_tool add"] * 2 + ["execute_tool complete_task"] * 2
    for t in tools:
        assert t.attributes is not None
        assert t.attributes["gen_ai.operation.name"] == "execute_tool"
        assert t.attributes["gen_ai.tool.name"] == t.name.removeprefix("execute_tool ")
        assert str(t.attributes["gen_ai.tool.call.id"])
        assert _parent(finished, t).name.startswith("turn ")
    # one trace per sample
    assert len({s.context.trace_id for s in samples}) == 2
    assert all(KEY not in _everything(s) for s in finished)


async def test_failures_are_error_spans_with_the_key_masked(spans: InMemorySpanExporter) -> None:
    script = [
        ScriptedReply("Dividing.", tool_calls=(ScriptedToolCall("divide", {"value": 0}),)),
        http_error(400, message=f"bad request: the key {KEY} is not allowed here"),
    ]
    async with open_fake_server(script) as srv:
        ep = Endpoint("openai-compatible", MODEL, api_base=srv.url, api_key=KEY)
        config = EvalConfig(endpoint=ep, environment_factory=CalculatorEnvironment, show_progress=False)
        report = await evaluate([{"question": "divide by zero"}], config)
    assert report.summary["counts"]["provider_error"] + report.summary["counts"]["failed"] == 1
    finished = spans.get_finished_spans()
    tool = _by_name(finished, "execute_tool divide")[0]
    assert tool.status.status_code == StatusCode.ERROR and "zero" in (tool.status.description or "").lower()
    failed_calls = [c for c in _by_name(finished, "chat ") if c.status.status_code == StatusCode.ERROR]
    assert failed_calls and "***" in (failed_calls[0].status.description or "")
    assert failed_calls[0].attributes is not None and failed_calls[0].attributes["error.type"]
    sample = _by_name(finished, "evaluate_sample")[0]
    assert sample.status.status_code == StatusCode.ERROR
    assert all(KEY not in _everything(s) for s in finished)


async def test_gepa_iterations_and_reflections_are_spans(spans: InMemorySpanExporter) -> None:
    task = TagTask()
    result = await optimize(
        task.seed(),
        rows("abcd"),
        rows("abcd", "v"),
        task=task.config(),
        reflection_endpoint=task.reflector.endpoint,
        max_metric_calls=30,
    )
    finished = spans.get_finished_spans()
    iterations = _by_name(finished, "gepa.iteration")
    reflections = _by_name(finished, "gepa.reflection")
    assert len(iterations) == len(result.history) > 0
    assert sorted(int(s.attributes["rollouts.gepa.iteration"]) for s in iterations) == sorted(  # type: ignore[index]
        r.iteration for r in result.history
    )
    assert reflections and all(_parent(finished, r).name == "gepa.iteration" for r in reflections)
    assert {r.attributes["rollouts.gepa.component"] for r in reflections} <= {"system_prompt", "hint"}  # type: ignore[index]
    # the minibatch evaluations inside an iteration are its children
    assert any(_parent(finished, s).name == "gepa.iteration" for s in _by_name(finished, "evaluate_sample") if s.parent)


async def test_sample_spans_name_their_epoch(spans: InMemorySpanExporter) -> None:
    async with open_fake_server(lambda request: ScriptedReply("Hi.")) as srv:
        ep = Endpoint("openai-compatible", MODEL, api_base=srv.url)
        await evaluate([{"id": "q", "question": "hello"}], EvalConfig(endpoint=ep, show_progress=False, epochs=2))
    samples = _by_name(spans.get_finished_spans(), "evaluate_sample")
    found = sorted((s.attributes or {})["rollouts.sample.epoch"] for s in samples)  # type: ignore[type-var]
    assert found == [1, 2]
    assert sorted((s.attributes or {})["rollouts.sample.id"] for s in samples) == ["q#1", "q#2"]  # type: ignore[type-var]


async def test_tracing_off_records_nothing() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable_tracing(provider)
    tracing.disable_tracing()
    assert tracing.tracer is None
    async with open_fake_server([ScriptedReply("Hi.")]) as srv:
        ep = Endpoint("openai-compatible", MODEL, api_base=srv.url)
        await evaluate([{"question": "hello"}], EvalConfig(endpoint=ep, show_progress=False))
    assert exporter.get_finished_spans() == ()


# ---- the standard OTLP exporter, configured by OTEL_* variables only ----------------------------


async def _collector(received: list[bytes], task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """A minimal OTLP/HTTP collector: accepts POST /v1/traces, keeps the bodies, answers 200."""

    async def handle(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                received.append(body)
                body = b""
                headers = [("content-type", "application/x-protobuf"), ("content-length", "0")]
                await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
                await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(handle, listeners)


async def test_rollouts_eval_exports_spans_over_otlp_configured_by_otel_variables(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text(json.dumps({"id": "q1", "question": "2+2?", "answer": "4"}) + "\n")
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        port = await nursery.start(_collector, received)
        async with open_fake_server([ScriptedReply(f"4, and my key is {FAKE_KEYS['OPENAI_API_KEY']}")]) as srv:
            env = cli_env(
                tmp_path,
                ROLLOUTS_OTEL="1",
                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
                OTEL_SERVICE_NAME="evals-under-test",
                TEAM_KEY=FAKE_KEYS["OPENAI_API_KEY"],
            )
            model = ["--model", f"openai-compatible/{MODEL}", "--api-base", srv.url, "--api-key-env", "TEAM_KEY"]
            args = ["eval", "data.jsonl", *model, "--score", "contains", "--output", "out", "--no-progress"]
            proc = await trio.run_process(
                [*CLI, *args], cwd=tmp_path, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
        nursery.cancel_scope.cancel()
    assert proc.returncode == 0, proc.stderr.decode()
    names, services = [], set()
    for body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
        assert FAKE_KEYS["OPENAI_API_KEY"].encode() not in body
    assert services == {"evals-under-test"}
    assert sorted(names) == [f"chat {MODEL}", "evaluate_sample", "invoke_agent", "turn 0"]
