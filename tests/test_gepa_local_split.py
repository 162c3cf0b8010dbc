"""benchmarks/gepa_local.py's rows: train, validation and held-out share nothing (no row, noun or
adjective), labels are balanced, and the score is strict about the form (checked without a model)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "gepa_local.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gepa_local_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_splits_share_nothing_and_are_balanced() -> None:
    bench = _bench()
    splits = {name: bench.split_rows(name) for name in ("train", "val", "heldout")}
    bench.check_disjoint(splits)
    words = [w for name in splits for part in bench._SPLITS[name] for w in part]
    assert len(words) == len(set(words))  # no noun or adjective twice, in any split
    texts = [r["text"] for rows in splits.values() for r in rows]
    assert len(texts) == len(set(texts))
    for rows in splits.values():
        labels = [r["label"] for r in rows]
        assert labels.count("POSITIVE") == labels.count("NEGATIVE")
        for r in rows:  # the row's own adjective decides its label
            _nouns, pos, neg = bench._SPLITS[r["id"].split("-")[0]]
            assert any(a in r["text"] for a in (pos if r["label"] == "POSITIVE" else neg))
    assert [len(splits[n]) for n in ("train", "val", "heldout")] == [8, 8, 16]


def test_the_score_wants_exactly_the_label() -> None:
    bench = _bench()
    assert bench.grade(" POSITIVE\n", "POSITIVE")[0] == 1.0
    for reply in ("Positive", "POSITIVE.", "The sentiment is POSITIVE", "NEGATIVE"):
        value, feedback = bench.grade(reply, "POSITIVE")
        assert value == 0.0 and "expected exactly 'POSITIVE'" in feedback and "capital letters" in feedback
