"""`--mcp` in `rollouts run` and `rollouts eval`, through the real command, against the test MCP
server (tests/_mcp_server.py) over stdio and streamable HTTP on 127.0.0.1. The scripted `shell`
model calls a tool named `bash`: here the server's."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from cli_support import cli_env, files_containing, run_cli

SERVER = str(Path(__file__).with_name("_mcp_server.py"))
STDIO = f"{sys.executable} {SERVER} stdio"


def test_run_with_an_mcp_server_over_stdio(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/shell", "--mcp", STDIO, "-p", "ls -la", "--no-session", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Done. Output:\nmcp ran: ls -la" in r.stdout


def test_run_with_an_mcp_server_over_http_with_a_header_from_the_environment(tmp_path: Path) -> None:
    secret = "Bearer cli-mcp-secret-0123456789"
    proc = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])  # printed once it listens
        spec = f"http://127.0.0.1:{port}/mcp Authorization=$MCP_TEST_AUTH"
        env = cli_env(tmp_path, MCP_TEST_AUTH=secret)
        r = run_cli("run", "-m", "scripted/shell", "--mcp", spec, "-p", "whoami", tmp=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert f"mcp ran: whoami as {hashlib.sha256(secret.encode()).hexdigest()[:12]}" in r.stdout
        assert files_containing(tmp_path, ["cli-mcp-secret"]) == []
        missing = run_cli("run", "-m", "scripted/shell", "--mcp", spec, "-p", "x", "--no-session", tmp=tmp_path)
        assert missing.returncode != 0 and "MCP_TEST_AUTH, which is not set" in missing.stderr
    finally:
        proc.kill()
        proc.wait()


def test_mcp_user_errors_are_one_clear_line(tmp_path: Path) -> None:
    r = run_cli("run", "-m", "scripted/shell", "--mcp", "http://127.0.0.1:1/mcp oops", "-p", "x", tmp=tmp_path)
    assert r.returncode == 2 and "Header=$VARIABLE" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("run", "-m", "scripted/shell", "--mcp", f"{sys.executable} -c pass", "-p", "x", tmp=tmp_path)
    assert r.returncode != 0 and "could not connect to the MCP server" in r.stderr and "Traceback" not in r.stderr


def test_eval_with_an_mcp_server_over_stdio(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "question": f"echo {i}", "answer": f"mcp ran: echo {i}"} for i in range(4)]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_scores.py").write_text(
        "from rollouts.eval.sample import Metric, Score\n"
        "def score(sample):\n"
        "    return Score((Metric('ran', float(str(sample.ground_truth) in sample.response), weight=1.0),))\n"
    )
    r = run_cli(
        "eval", "rows.jsonl", "-m", "scripted/shell", "--mcp", STDIO, "--score", "my_scores:score",
        "--output", "out", tmp=tmp_path, env=cli_env(tmp_path), timeout=180,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["summary"]["counts"]["completed"] == 4
    assert report["summary"]["metrics"]["ran"]["mean"] == 1.0
