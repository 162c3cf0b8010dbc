"""The embedded llama.cpp server: started lazily once per process, shared, stopped at exit.

`xllamacpp.Server` runs llama.cpp's OpenAI-compatible HTTP server inside this process on
127.0.0.1 and a free port. The `local` provider talks to it through the same OpenAI-compatible
code path as any remote server. Starting it (about 2 s: the weights are memory-mapped) happens
in a worker thread so the trio loop keeps running; a process-wide lock makes concurrent first
calls, from any trio run, share one server.

Settings come from `LocalServerSettings` (or the environment: `ROLLOUTS_LOCAL_THREADS`,
`ROLLOUTS_LOCAL_PARALLEL`, `ROLLOUTS_LOCAL_CTX`); `ROLLOUTS_LOCAL_LOG=1` lets llama.cpp print its own
log lines to stderr. The server keeps `parallel` sequences in flight
(continuous batching), each with a context of `ctx_per_slot` tokens.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import trio

from rollouts.errors import ConfigurationError, ModelFileError
from rollouts.local_model._files import (
    DEFAULT_MODEL,
    LOCAL_MODELS,
    MODEL_NAMES,
    ModelSpec,
    Progress,
    ensure_model_file,
)

logger = logging.getLogger("rollouts.local_model")


def _env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigurationError(f"{name}={value} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class LocalServerSettings:
    """How the embedded server runs. Defaults suit a small CPU machine."""

    threads: int = field(default_factory=lambda: _env_int("ROLLOUTS_LOCAL_THREADS", min(os.cpu_count() or 2, 8)))
    parallel: int = field(default_factory=lambda: _env_int("ROLLOUTS_LOCAL_PARALLEL", 4))
    ctx_per_slot: int = field(default_factory=lambda: _env_int("ROLLOUTS_LOCAL_CTX", 4096, minimum=256))

    def __post_init__(self) -> None:
        for name in ("threads", "parallel", "ctx_per_slot"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"LocalServerSettings.{name} must be >= 1")


@dataclass(frozen=True)
class LocalServer:
    """A running embedded server."""

    spec: ModelSpec
    model_path: Path
    api_base: str  # e.g. http://127.0.0.1:41234/v1
    settings: LocalServerSettings
    startup_s: float


def resolve_local_model(name: str) -> ModelSpec:
    """The model spec for an `Endpoint("local", name)`; ConfigurationError lists the known names."""
    spec = LOCAL_MODELS.get(name.lower())
    if spec is not None:
        return spec
    raise ConfigurationError(
        f"unknown local model {name!r}; the embedded models are: {', '.join(MODEL_NAMES)} "
        "(for another server use provider 'openai-compatible' with api_base)"
    )


class _Running:
    """The process-wide servers, one per model. Guarded by `lock`; `servers` keeps the xllamacpp
    objects alive."""

    lock = threading.Lock()
    servers: ClassVar[dict[str, Any]] = {}
    info: ClassVar[dict[str, LocalServer]] = {}


def _start_blocking(spec: ModelSpec, settings: LocalServerSettings, progress: Progress) -> LocalServer:
    with _Running.lock:
        running = _Running.info.get(spec.name)
        if running is not None:
            if running.settings != settings:
                raise ConfigurationError(
                    f"the embedded server for {spec.name} is already running with other settings; "
                    "call shutdown_local_server() first to restart it"
                )
            return running
        try:
            import xllamacpp
        except ImportError:
            raise ModelFileError(
                f"the local model needs the llama.cpp engine (xllamacpp); install it with: {spec.install_hint}"
            ) from None
        path = ensure_model_file(spec, progress=progress)
        progress(f"starting llama.cpp with {spec.name} ({settings.threads} threads, {settings.parallel} slots)")
        started = time.perf_counter()
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_parallel = settings.parallel
        params.n_ctx = settings.ctx_per_slot * settings.parallel
        params.cpuparams.n_threads = settings.threads
        params.cpuparams_batch.n_threads = settings.threads
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # a free port, read back from listening_address
        if not os.environ.get("ROLLOUTS_LOCAL_LOG"):
            params.verbosity = -1  # llama.cpp's own log lines off (ROLLOUTS_LOCAL_LOG=1 shows them)
        params.warmup = False
        server = xllamacpp.Server(params)
        address = str(server.listening_address).rstrip("/")
        assert address.startswith("http://127.0.0.1:"), f"unexpected listening address {address!r}"
        info = LocalServer(spec, path, f"{address}/v1", settings, time.perf_counter() - started)
        _Running.servers[spec.name], _Running.info[spec.name] = server, info
        progress(f"local model ready in {info.startup_s:.1f} s at {info.api_base}")
        return info


async def ensure_local_server(
    spec: ModelSpec = DEFAULT_MODEL,
    settings: LocalServerSettings | None = None,
    *,
    progress: Progress | None = None,
) -> LocalServer:
    """The running embedded server for `spec`, starting it on first use (model assembly and hash
    check included). `progress` receives one line per stage; by default they go to the
    `rollouts.local_model` logger."""
    info = _Running.info.get(spec.name)
    if info is not None and (settings is None or info.settings == settings):
        return info
    return await trio.to_thread.run_sync(
        _start_blocking, spec, settings or LocalServerSettings(), progress or logger.info
    )


def running_local_server(spec: ModelSpec = DEFAULT_MODEL) -> LocalServer | None:
    """The embedded server for `spec` if it is running, else None."""
    return _Running.info.get(spec.name)


def shutdown_local_server(spec: ModelSpec | None = None) -> None:
    """Stop the embedded server for `spec`, or all of them (they are also stopped at interpreter exit)."""
    with _Running.lock:
        names = [spec.name] if spec is not None else list(_Running.servers)
        stopped = [_Running.servers.pop(n, None) for n in names]
        for n in names:
            _Running.info.pop(n, None)
    del stopped  # xllamacpp stops a server and frees its model when the object goes


atexit.register(shutdown_local_server)
