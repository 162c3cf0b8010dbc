"""Provider-error retries: exponential backoff with jitter, capped, bounded in number; a
provider-error sample is rerun on resume."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rollouts import EvalConfig, Message, ScriptedModel, evaluate
from rollouts.errors import ProviderError
from rollouts.providers.scripted import ScriptedRequest


def _config(model: ScriptedModel, **kw: Any) -> EvalConfig:
    return EvalConfig(
        endpoint=model.endpoint,
        prepare_messages=lambda row: [Message("user", str(row["q"]))],
        show_progress=False,
        **kw,
    )


async def test_backoff_doubles_with_jitter_up_to_its_cap(autojump_clock: Any) -> None:
    import trio

    times: list[float] = []

    def reply(req: ScriptedRequest) -> Any:
        times.append(trio.current_time())
        return ProviderError("overloaded", provider="scripted", status_code=529, retryable=True)

    model = ScriptedModel(reply)
    config = _config(model, provider_error_retries=5, retry_backoff_s=1.0, retry_backoff_max_s=3.0)
    report = await evaluate([{"q": "down"}], config)
    sample = report.samples[0]
    assert sample.status == "provider_error" and sample.metadata["attempts"] == 6 and len(times) == 6
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # retry k waits min(cap, 1 s * 2**k) times a jitter factor in [0.5, 1]
    for k, gap in enumerate(gaps):
        full = min(3.0, 1.0 * 2**k)
        assert 0.5 * full - 1e-6 <= gap <= full + 1e-3, (k, gaps)
    assert max(gaps) <= 3.0 + 1e-3


async def test_no_retries_when_told_and_the_time_limit_bounds_backoff(autojump_clock: Any) -> None:
    calls: list[str] = []

    def reply(req: ScriptedRequest) -> Any:
        calls.append(req.last_user_text)
        return ProviderError("unavailable", provider="scripted", status_code=503, retryable=True)

    model = ScriptedModel(reply)
    report = await evaluate([{"q": "a"}], _config(model, provider_error_retries=0))
    assert report.samples[0].status == "provider_error" and calls == ["a"]

    calls.clear()
    config = _config(model, provider_error_retries=50, retry_backoff_s=10.0, sample_timeout_s=25.0)
    report = await evaluate([{"q": "b"}], config)
    assert report.samples[0].status == "failed" and "timed out after 25.0s" in (report.samples[0].error or "")
    assert 2 <= len(calls) <= 4  # waits of 5-10 s, 10-20 s, ... fit only a few attempts in 25 s


async def test_provider_error_samples_are_rerun_on_resume(tmp_path: Path) -> None:
    healthy = False
    calls: list[str] = []

    def reply(req: ScriptedRequest) -> Any:
        calls.append(req.last_user_text)
        if req.last_user_text == "2" and not healthy:
            return ProviderError("unavailable", provider="scripted", status_code=503, retryable=True)
        return f"answer {req.last_user_text}"

    model = ScriptedModel(reply)
    rows = [{"q": i} for i in range(4)]
    first = await evaluate(rows, _config(model, output_dir=tmp_path, provider_error_retries=0))
    assert [s.status for s in first.samples] == ["completed", "completed", "provider_error", "completed"]
    healthy = True
    calls.clear()
    second = await evaluate(rows, _config(model, output_dir=tmp_path, provider_error_retries=0))
    assert calls == ["2"] and second.reused == 3
    assert [s.status for s in second.samples] == ["completed"] * 4
