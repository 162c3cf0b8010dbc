"""The embedded model's file handling, on small synthetic parts: assembly, pinned hash, cache
verification, clear errors. (The real 491 MB file is exercised by the local_model tier.)"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

import rollouts.local_model._files as files
from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.errors import ConfigurationError, ModelFileError
from rollouts.events import ignore_chunk
from rollouts.local_model import (
    QWEN25_CODER_05B,
    ModelPart,
    ModelSpec,
    ensure_model_file,
    locate_parts,
    resolve_local_model,
    verify_model_file,
)
from rollouts.providers import get_provider_function


def _parts(tmp: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for i, data in enumerate(contents):
        p = tmp / f"part{i}.bin"
        p.write_bytes(data)
        paths.append(p)
    return paths


def _spec(contents: list[bytes], sha256: str | None = None) -> ModelSpec:
    digest = sha256 or hashlib.sha256(b"".join(contents)).hexdigest()
    parts = tuple(ModelPart(f"no-such-dist-{i}", f"data/part{i}.bin", len(c)) for i, c in enumerate(contents))
    return ModelSpec("tiny", "tiny.gguf", parts, digest)


CONTENTS = [b"GGUF" + b"a" * 1000, b"b" * 777, b"c" * 5]


def test_assembles_once_and_trusts_its_stamp_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, cache = _spec(CONTENTS), tmp_path / "cache"
    lines: list[str] = []
    path = ensure_model_file(spec, cache_dir=cache, parts=_parts(tmp_path, CONTENTS), progress=lines.append)
    assert path == cache / "tiny.gguf" and path.read_bytes() == b"".join(CONTENTS)
    assert any("assembling the local model tiny" in line for line in lines)
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.gguf", "tiny.gguf.verified"]  # no temp file left

    hashed: list[Path] = []
    real = files._sha256_of
    monkeypatch.setattr(files, "_sha256_of", lambda p: hashed.append(p) or real(p))
    assert ensure_model_file(spec, cache_dir=cache, parts=[]) == path
    assert hashed == []  # the stamp matches size, inode and mtime: no re-hash
    verify_model_file(path, spec, force=True)
    assert hashed == [path]


def test_a_corrupted_cached_file_is_detected_and_rebuilt(tmp_path: Path) -> None:
    spec, cache = _spec(CONTENTS), tmp_path / "cache"
    parts = _parts(tmp_path, CONTENTS)
    path = ensure_model_file(spec, cache_dir=cache, parts=parts)
    with path.open("r+b") as f:  # same size, one byte flipped
        f.seek(10)
        f.write(b"X")
    with pytest.raises(ModelFileError, match="SHA-256"):
        verify_model_file(path, spec)
    lines: list[str] = []
    assert ensure_model_file(spec, cache_dir=cache, parts=parts, progress=lines.append) == path
    assert path.read_bytes() == b"".join(CONTENTS)
    assert any("failed verification" in line for line in lines)


def test_parts_that_do_not_match_the_pinned_hash_are_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    spec, cache = _spec(CONTENTS, sha256="0" * 64), tmp_path / "cache"
    with pytest.raises(ModelFileError) as e:
        ensure_model_file(spec, cache_dir=cache, parts=_parts(tmp_path, CONTENTS))
    message = str(e.value)
    assert "expected " + "0" * 64 in message and "was not used" in message and "force-reinstall" in message
    assert list(cache.iterdir()) == []


def test_missing_packages_name_the_package_and_the_fix() -> None:
    with pytest.raises(ModelFileError, match=r"package 'no-such-dist-0' is missing.*pip install 'rollouts\[local\]'"):
        locate_parts(_spec(CONTENTS))


def test_parts_are_located_through_metadata_without_importing_their_code() -> None:
    code = (
        "import sys; from rollouts.local_model import locate_parts; ps = locate_parts(); "
        "print(len(ps), sum(p.stat().st_size for p in ps), any(m.startswith('pandas_sns') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["6", str(QWEN25_CODER_05B.size), "False"]


def test_unknown_local_model_and_api_base_are_configuration_errors() -> None:
    assert resolve_local_model("Qwen2.5-Coder-0.5B") is QWEN25_CODER_05B
    with pytest.raises(ConfigurationError, match=r"unknown local model 'llama-70b'.*qwen2.5-coder-0.5b"):
        resolve_local_model("llama-70b")


async def test_local_provider_rejects_an_api_base() -> None:
    actor = Actor(Trajectory((Message("user", "hi"),)), Endpoint("local", "qwen2.5-coder-0.5b", api_base="http://x/v1"))
    with pytest.raises(ConfigurationError, match="openai-compatible"):
        await get_provider_function("local", "qwen2.5-coder-0.5b")(actor, ignore_chunk)
