"""The benchmarks run and their last line is the JSON the issues ask for, with figures that are
consistent with each other (tiny sizes here: the figures themselves are measured on a quiet machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
        check=True,
    ).stdout
    last = out.strip().splitlines()[-1]
    result = json.loads(last)
    assert isinstance(result, dict)
    return result


def test_agent_loop_benchmark_prints_per_turn_figures() -> None:
    r = _run("agent_loop.py", "--repeats", "20")
    for n in (10, 100, 1000):
        assert r[f"per_turn_us_{n}"] > 0
        assert r[f"loop_overhead_us_{n}"] == pytest.approx(r[f"per_turn_us_{n}"] - r[f"provider_only_us_{n}"], abs=0.2)


@pytest.mark.slow
def test_providers_benchmark_prints_ratios_against_the_bare_sdk() -> None:
    r = _run("providers.py", "--deltas", "300", "--repeats", "1", "--rounds", "1", "--concurrency", "20")
    providers = ["openai", "openai_compatible", "anthropic", "openai_responses", "google"]
    for p in providers:
        ours, bare = r[f"us_per_event_ours_{p}"], r[f"us_per_event_bare_{p}"]
        assert ours > 0 and bare > 0
        assert r[f"overhead_ratio_{p}"] == pytest.approx(ours / bare, rel=0.02)  # ours over the bare SDK, same run
    assert r["overhead_ratio_max"] == max(r[f"overhead_ratio_{p}"] for p in providers)
    assert r["concurrent200_wall_s"] > 0 and r["concurrent200_sdk_wall_s"] > 0
    assert r["concurrent200_ratio_to_sdk"] == pytest.approx(
        r["concurrent200_wall_s"] / r["concurrent200_sdk_wall_s"], rel=0.02
    )
    assert r["concurrent200_wall_s"] >= r["concurrent200_ideal_s"] == 0.1  # nothing beats the first-byte latency


def test_evaluate_workers_benchmark_prints_both_rates() -> None:
    r = _run("evaluate_workers.py", "--samples", "40", "--concurrency", "8", "--latency", "0.01", "--repeats", "1")
    for name in ("inprocess", "w2"):
        assert r[f"samples_per_s_{name}"] > 0 and r[f"cpu_ms_per_sample_{name}"] > 0
        assert r[f"first_result_s_{name}"] > 0
    assert r["samples"] == 40


def test_sandbox_benchmark_prints_the_per_command_overhead() -> None:
    r = _run("sandbox.py", "--commands", "6", "--canonical-n", "2", "--humaneval-n", "0")
    assert r["bash_ms_bwrap"] > 0 and r["bash_ms_unsandboxed"] > 0 and r["bash_commands"] == 6
    assert r["sandbox_overhead_ms"] == pytest.approx(r["bash_ms_bwrap"] - r["bash_ms_unsandboxed"], abs=0.02)
    assert r["humaneval_exec_n"] == 2 and r["humaneval_exec_s_bwrap"] > 0 and r["humaneval_exec_s_unsandboxed"] > 0
    assert len(r["load_avg"]) == 3
