"""evaluate() through the real OpenAI provider (SDK and lean http transports) against the
wire-faithful fake server on 127.0.0.1: in-flight requests counted at the server, order,
provider errors, resume and secrets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import trio

from rollouts import Endpoint, EvalConfig, Message, evaluate
from rollouts.eval.scorers import combine, exact_match, extract_tag, metric
from rollouts.testing.fake_server import RecordedRequest, http_error, open_fake_server

Transport = Literal["sdk", "http"]


def _question(request: RecordedRequest) -> str:
    content = request.json["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def _endpoint(base_url: str, transport: Transport, **kw: Any) -> Endpoint:
    kw.setdefault("api_key", "sk-test-not-a-real-key")
    return Endpoint("openai-compatible", "fake-model", api_base=base_url, transport=transport, **kw)


def _config(endpoint: Endpoint, **kw: Any) -> EvalConfig:
    kw.setdefault("show_progress", False)
    return EvalConfig(
        endpoint=endpoint,
        prepare_messages=lambda row: [Message("user", f"q{row['q']}")],
        score_fn=combine(metric("correct", exact_match(extract=extract_tag("answer")), weight=1.0)),
        **kw,
    )


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_model_call_limit_is_respected_at_the_server(transport: Transport) -> None:
    def reply(request: RecordedRequest) -> str:
        return f"<answer>{_question(request)[1:]}</answer>"

    async with open_fake_server(reply, latency_s=0.02) as srv:
        config = _config(_endpoint(srv.base_url, transport), max_concurrent=12, max_concurrent_model_calls=5)
        rows = [{"q": i, "answer": str(i)} for i in range(40)]
        report = await evaluate(rows, config)
        assert srv.max_in_flight == 5
        assert len(srv.scripted_requests) == 40
    assert [s.id for s in report.samples] == [str(i) for i in range(40)]
    assert report.summary["reward"]["mean"] == 1.0
    assert report.summary["tokens"]["output"] > 0


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_max_concurrent_bounds_requests_at_the_server(transport: Transport) -> None:
    async with open_fake_server(lambda r: "<answer>x</answer>", latency_s=0.02) as srv:
        config = _config(_endpoint(srv.base_url, transport), max_concurrent=3)
        report = await evaluate([{"q": i, "answer": "x"} for i in range(15)], config)
        assert srv.max_in_flight == 3
    assert report.summary["counts"]["completed"] == 15


async def test_http_errors_end_as_provider_error_samples_others_complete() -> None:
    def reply(request: RecordedRequest) -> Any:
        if _question(request) == "q2":
            return http_error(500, message="internal error")
        return f"<answer>{_question(request)[1:]}</answer>"

    async with open_fake_server(reply) as srv:
        endpoint = _endpoint(srv.base_url, "http", max_retries=1)
        config = _config(endpoint, provider_error_retries=1, retry_backoff_s=0.001, retry_backoff_max_s=0.002)
        report = await evaluate([{"q": i, "answer": str(i)} for i in range(4)], config)
        failed_calls = [r for r in srv.scripted_requests if _question(r) == "q2"]
    statuses = [s.status for s in report.samples]
    assert statuses == ["completed", "completed", "provider_error", "completed"]
    # Endpoint.max_retries=1 -> 2 requests per run; provider_error_retries=1 -> 2 runs
    assert len(failed_calls) == 4
    assert report.samples[2].metadata["attempts"] == 2


async def test_resume_against_the_server_and_no_secret_on_disk(tmp_path: Path) -> None:
    secret = "sk-live-SECRET-0987654321"
    seen: list[str] = []

    def reply(request: RecordedRequest) -> str:
        seen.append(_question(request))
        return f"<answer>{_question(request)[1:]}</answer>"

    async with open_fake_server(reply, latency_s=0.005) as srv:
        endpoint = _endpoint(srv.base_url, "http", api_key=secret)
        rows = [{"q": i, "answer": str(i)} for i in range(10)]
        await evaluate(rows, _config(endpoint, output_dir=tmp_path, max_samples=6))
        assert all(r.headers.get("authorization") == f"Bearer {secret}" for r in srv.scripted_requests)
        seen.clear()
        report = await evaluate(rows, _config(endpoint, output_dir=tmp_path))
    assert sorted(seen) == ["q6", "q7", "q8", "q9"]
    assert report.reused == 6 and report.summary["counts"]["completed"] == 10
    for name in ("samples.jsonl", "report.json"):
        assert secret not in (tmp_path / name).read_text()
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["config"]["endpoint"]["api_base"] == srv.base_url
    assert "api_key" not in data["config"]["endpoint"]


async def test_cancelled_eval_against_the_server_keeps_finished_samples(tmp_path: Path) -> None:
    async def reply(request: RecordedRequest) -> str:
        if int(_question(request)[1:]) >= 4:
            await trio.sleep(30)
        return "<answer>ok</answer>"

    ended: list[str] = []
    four_ended = trio.Event()  # cancel once rows 0-3 are done, not after a guessed time

    def on_end(sample: Any) -> None:
        ended.append(sample.id)
        if len(ended) == 4:
            four_ended.set()

    async with open_fake_server(reply) as srv:
        config = _config(_endpoint(srv.base_url, "sdk"), output_dir=tmp_path, max_concurrent=8, on_sample_end=on_end)
        with trio.fail_after(20), trio.CancelScope() as scope:  # fail_after: a hang guard only
            async with trio.open_nursery() as nursery:
                nursery.start_soon(evaluate, [{"q": i, "answer": "ok"} for i in range(8)], config)
                await four_ended.wait()
                scope.cancel()
        assert scope.cancelled_caught
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["status"] == "cancelled"
    assert data["summary"]["counts"]["completed"] == 4
