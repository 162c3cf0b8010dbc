"""benchmarks/view.py runs end to end at a tiny size and its last line has the figures issue 16
asks for (the figures themselves are measured on a quiet machine at full size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_view_benchmark_prints_its_figures() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "view.py"),
            "--samples",
            "300",
            "--sessions",
            "40",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    for key in ("eval_first_page_ms", "sessions_first_page_ms", "sample_page_ms", "big_message_page_ms", "rss_mb"):
        assert r[key] > 0, key
    assert r["samples"] == 300 and r["sessions_total"] == 40
