"""Raw requests and responses of model calls (`RunConfig(record_raw=True)`; issue 28's "the raw
request and response of each call where the run recorded them (masked like everything else)"):
off by default, masked and bounded when on, shown in a sample's timeline."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Literal

import pytest
import trio

from rollouts import Endpoint, EvalConfig, Message, RunConfig, evaluate
from rollouts.eval.scorers import combine, exact_match, extract_tag, metric
from rollouts.providers.raw import RAW_MAX_CHARS
from rollouts.redaction import register_secrets
from rollouts.testing.fake_server import RecordedRequest, open_fake_server

KEY = "sk-test-RAWCALL-0123456789"
PARAM_SECRET = "param-secret-RAWCALL-9876"  # sent in a secret-looking body field (extra_params)
PROMPT_SECRET = "prompt-secret-RAWCALL-5555"  # a registered secret the prompt happens to contain
REPLY = "<answer>42</answer> <script>window.__pwned = 1</script>"


def _config(
    base_url: str, transport: Literal["sdk", "http"], record: bool | None, question: str, out: Path
) -> EvalConfig:
    endpoint = Endpoint("openai-compatible", "fake-model", api_base=base_url, transport=transport, api_key=KEY,
                        extra_params={"auth_token": PARAM_SECRET, "seed": 7})  # fmt: skip
    return EvalConfig(
        endpoint=endpoint,
        prepare_messages=lambda row: [Message("user", f"{question} {PROMPT_SECRET}")],
        score_fn=combine(metric("correct", exact_match(extract=extract_tag("answer")), weight=1.0)),
        run_config=None if record is None else RunConfig(record_raw=record),
        show_progress=False,
        output_dir=out,
    )


async def _run(
    tmp_path: Path, transport: Literal["sdk", "http"], record: bool | None, question: str = "q", chunk_size: int = 4
) -> Any:
    register_secrets(PROMPT_SECRET)

    def reply(request: RecordedRequest) -> str:
        return REPLY

    async with open_fake_server(reply, chunk_size=chunk_size) as srv:
        report = await evaluate(
            [{"answer": "42"}], _config(srv.base_url, transport, record, question, tmp_path / "run")
        )
    return report.samples[0]


@pytest.mark.parametrize("record", [None, False])
async def test_raw_calls_are_not_recorded_by_default(tmp_path: Path, record: bool | None) -> None:
    sample = await _run(tmp_path, "http", record)
    (c,) = sample.trajectory.completions
    assert c.raw_request is None and c.raw_response is None
    line = json.loads((tmp_path / "run" / "samples.jsonl").read_text())
    assert all("raw_request" not in c and "raw_response" not in c for c in line["trajectory"]["completions"])


@pytest.mark.parametrize("transport", ["sdk", "http"])
async def test_raw_calls_recorded_when_asked_with_every_secret_masked(tmp_path: Path, transport: str) -> None:
    sample = await _run(tmp_path, transport, True)  # type: ignore[arg-type]
    (c,) = sample.trajectory.completions
    assert c.raw_request is not None and c.raw_response is not None
    request = json.loads(c.raw_request)
    assert request["model"] == "fake-model" and request["seed"] == 7 and request["stream"] is True
    assert request["messages"][-1]["content"] == "q ***"  # a known secret in the prompt: masked
    assert request["auth_token"] == "[redacted]"  # a secret-looking field: blanked
    items = [json.loads(line) for line in c.raw_response.splitlines()]
    assert len(items) > 2 and all(isinstance(i, dict) for i in items)
    assert (
        "".join((ch.get("delta") or {}).get("content") or "" for i in items for ch in i.get("choices") or []) == REPLY
    )  # the raw stream items, as the server sent them
    on_disk = (tmp_path / "run" / "samples.jsonl").read_text()
    assert "raw_request" in on_disk and "raw_response" in on_disk
    for secret in (KEY, PARAM_SECRET, PROMPT_SECRET):
        assert secret not in c.raw_request and secret not in c.raw_response and secret not in on_disk


async def test_raw_calls_are_cut_at_the_bound_with_a_marker(tmp_path: Path) -> None:
    sample = await _run(tmp_path, "http", True, question="x" * (RAW_MAX_CHARS + 5000))
    (c,) = sample.trajectory.completions
    assert c.raw_request is not None and len(c.raw_request) < RAW_MAX_CHARS + 200
    assert c.raw_request.endswith("more characters not kept]")


async def test_the_timeline_shows_raw_calls_collapsed_and_escaped(tmp_path: Path, nursery: trio.Nursery) -> None:
    from test_view_browser import _in_browser, _require_browser

    from rollouts.view import FilesCatalog, create_app, serve

    _require_browser()
    await _run(tmp_path, "sdk", True, chunk_size=1000)  # (the reply in one chunk: one piece of text)
    catalog = FilesCatalog([tmp_path / "run"], cache_dir=tmp_path / "cache")
    await catalog.index_once()
    url = (await nursery.start(serve, create_app(catalog))).rstrip("/")
    run = catalog.run_id(tmp_path / "run")

    def drive(page: Any) -> None:
        page.goto(f"{url}/evals/{run}/samples/0")
        raw = page.locator("#timeline details.raw")
        assert raw.count() == 1 and not raw.first.evaluate("e => e.open")  # collapsed
        assert not page.locator("#timeline pre.raw-request").first.is_visible()
        raw.first.locator("summary").click()
        request = page.inner_text("#timeline pre.raw-request")
        assert '"model": "fake-model"' in request and '"auth_token": "[redacted]"' in request
        response = page.inner_text("#timeline pre.raw-response")
        assert "<script>window.__pwned = 1</script>" in response  # shown as text, never run
        assert page.evaluate("window.__pwned === undefined")
        body = page.content()
        assert all(s not in body for s in (KEY, PARAM_SECRET, PROMPT_SECRET))
        page.screenshot(path=tmp_path / "raw.png", full_page=True)

    await trio.to_thread.run_sync(_in_browser(drive))
    keep = os.environ.get("ROLLOUTS_VIEW_SCREENSHOTS")  # (how docs/view-raw-call.png is made)
    if keep:
        shutil.copyfile(tmp_path / "raw.png", Path(keep) / "view-raw-call.png")


async def test_raw_calls_keep_only_the_attempt_that_succeeded(tmp_path: Path) -> None:
    """A stream dropped mid-way is retried: the raw response is the retry's items, not both."""
    from rollouts.testing.fake_server import FakeTurn

    calls: list[int] = []

    def reply(request: RecordedRequest) -> Any:
        calls.append(1)
        return FakeTurn(reply=REPLY, drop_after=3) if len(calls) == 1 else REPLY

    async with open_fake_server(reply, chunk_size=1000) as srv:
        config = _config(srv.base_url, "http", True, "q", tmp_path / "run")
        config = dataclasses.replace(config, endpoint=dataclasses.replace(config.endpoint, max_retries=2))
        report = await evaluate([{"answer": "42"}], config)
    (c,) = report.samples[0].trajectory.completions
    assert c.attempts == 2 and len(calls) == 2
    assert c.raw_response is not None
    items = [json.loads(line) for line in c.raw_response.splitlines()]
    assert sum(1 for i in items for ch in i.get("choices") or [] if ch.get("finish_reason") == "stop") == 1
    assert sum(1 for i in items for ch in i.get("choices") or [] if (ch.get("delta") or {}).get("role")) == 1
