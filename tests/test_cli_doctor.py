"""`rollouts doctor`: versions, which keys are set (never their values), the local model, storage."""

from __future__ import annotations

import json
import platform
from pathlib import Path

from cli_support import FAKE_KEYS, cli_env, run_cli

import rollouts
from rollouts.local_model import QWEN25_CODER_05B


def test_doctor_reports_versions_keys_local_model_and_storage(tmp_path: Path) -> None:
    (tmp_path / "rollouts.toml").write_text(
        '[defaults]\nmodel = "vllm"\nresults_dir = "evals"\n\n'
        '[endpoints.vllm]\nmodel = "openai-compatible/q"\napi_base = "http://127.0.0.1:9/v1"\napi_key_env = "VLLM_KEY"\n'
    )
    env = cli_env(tmp_path, OPENAI_API_KEY=FAKE_KEYS["OPENAI_API_KEY"], GOOGLE_API_KEY=FAKE_KEYS["GOOGLE_API_KEY"])
    del env["ROLLOUTS_RESULTS_DIR"]  # so that rollouts.toml chooses it

    r = run_cli("doctor", "--json", tmp=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["python"]["version"] == platform.python_version()
    assert report["packages"]["rollouts"] == rollouts.__version__
    assert all(report["packages"][p] for p in ("trio", "anthropic", "openai", "google-genai", "xllamacpp"))
    keys = {k["provider"]: (k["variables"], k["set"]) for k in report["keys"]}
    assert keys["openai"] == (["OPENAI_API_KEY"], ["OPENAI_API_KEY"])
    assert keys["anthropic"] == (["ANTHROPIC_API_KEY"], [])
    assert keys["google"] == (["GEMINI_API_KEY", "GOOGLE_API_KEY"], ["GOOGLE_API_KEY"])
    assert keys["endpoint vllm"] == (["VLLM_KEY"], [])
    lm = report["local_model"]
    assert lm["model"] == QWEN25_CODER_05B.name and lm["installed"] is True and lm["available"] is True
    if lm["assembled"]:  # (the shared cache may not hold it yet: then it is assembled on first use)
        assert lm["verified"] is True, lm
    assert report["sessions"] == {"dir": str(tmp_path / "sessions"), "exists": False, "count": None,
                                  "from": "$ROLLOUTS_SESSIONS_DIR"}  # fmt: skip
    assert report["results"]["dir"] == str((tmp_path / "evals").resolve())
    assert report["results"]["from"] == f"[defaults] results_dir in {tmp_path / 'rollouts.toml'}"
    assert report["endpoints"] == ["vllm"] and report["default_model"] == "vllm"

    r = run_cli("doctor", "--no-verify", tmp=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert f"(Python {platform.python_version()}," in text.splitlines()[0]
    assert "API keys (values never shown):" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert lines["openai"].endswith("set (OPENAI_API_KEY)")
    assert lines["anthropic"].endswith("not set (export ANTHROPIC_API_KEY=...)")
    assert "VLLM_KEY" in text and "not set (export VLLM_KEY=...)" in text
    assert f"sessions: {tmp_path / 'sessions'} (not created yet; from $ROLLOUTS_SESSIONS_DIR)" in text
    assert f"results: {(tmp_path / 'evals').resolve()} (not created yet; from [defaults] results_dir" in text
    assert "local model: qwen2.5-coder-0.5b" in text
    for key in FAKE_KEYS.values():
        assert key not in r.stdout + r.stderr


def test_doctor_reports_a_model_file_that_fails_its_hash_check(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / QWEN25_CODER_05B.file_name).write_bytes(b"not a model")
    r = run_cli("doctor", tmp=tmp_path, env=cli_env(tmp_path, ROLLOUTS_MODEL_CACHE=str(cache)))
    assert r.returncode == 0, r.stderr
    assert "local model: qwen2.5-coder-0.5b (llama.cpp engine xllamacpp" in r.stdout
    assert "FAILED its hash check" in r.stdout
    r = run_cli("doctor", "--json", tmp=tmp_path, env=cli_env(tmp_path, ROLLOUTS_MODEL_CACHE=str(cache)))
    assert json.loads(r.stdout)["local_model"]["verified"] is False
