"""benchmarks/evaluate.py runs end to end at a small scale and its last line is the JSON the
issue asks for, with figures that agree with each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_prints_consistent_json_last() -> None:
    n, conc, latency = 60, 10, 0.02
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "evaluate.py"), "--samples", str(n), "--concurrency", str(conc)]
        + ["--latency", str(latency), "--repeats", "1", "--big-samples", "200", "--big-concurrency", "50"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    for key in (
        "wall_s",
        "wall_s_sdk",
        "ideal_s",
        "samples_per_s",
        "cpu_ms_per_sample",
        "cpu_ms_per_sample_default",
        "ratio_to_ideal_default",
        "cpu_ms_per_sample_otel_off",
        "cpu_ms_per_sample_otel_on",
        "rss_mb_100k",
        "cpu_ms_per_sample_100k",
        "rss_mb_10k",
        "cpu_ms_per_sample_10k",
    ):
        assert isinstance(result[key], int | float) and result[key] > 0, key
    ideal = n / conc * latency
    assert result["ideal_s"] == round(ideal, 4)
    assert result["wall_s"] >= ideal and result["wall_s_sdk"] >= ideal  # nothing beats the server
    assert result["wall_s"] <= result["wall_s_sdk"]  # wall_s is the best path
    assert abs(result["samples_per_s"] - n / result["wall_s"]) <= 0.01 * n / result["wall_s"] + 0.1
    assert result["samples"] == n and result["concurrency"] == conc
    text = out.stdout
    assert "where the client CPU goes (http" in text and "where the client CPU goes (sdk" in text
    assert "openai SDK" in text and "x ideal" in text and "samples/s" in text and "ms/sample" in text
    by_part = result["cpu_ms_per_sample_by_part"]
    best = result["best_transport"]
    for transport, cpu in ((best, result["cpu_ms_per_sample"]), ("sdk", result["cpu_ms_per_sample_sdk"])):
        assert abs(sum(by_part[transport].values()) - cpu) <= 0.02 * cpu + 0.01, transport
