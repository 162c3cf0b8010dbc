"""Issue 13 item 2: no secret anywhere. `rollouts run` (plain and --json), `eval`, `gepa` and the
`sessions` commands run against the fake provider server, which echoes every key it receives —
the provider key, a key named by --api-key-env, and a key sent in an `extra_params` header —
back in error bodies and in content: text and thinking cut into 3-character deltas (so every
key is split across chunks), tool-call arguments, and the reflection model's new prompt. Then
every byte written (sessions, results, GEPA run directory, exports, stdout, stderr) is searched
for the keys: zero hits. `--json` text deltas are also joined, as a consumer would."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import trio
from cli_support import CLI, FAKE_KEYS, cli_env

from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.testing import FakeTurn, RecordedRequest, http_error, open_fake_server

TEAM_KEY = "team-FAKEKEY-0123456789-secret"
HEADER_KEY = "hdr-FAKEKEY-9876543210-secret"
KEYS = [TEAM_KEY, HEADER_KEY, *FAKE_KEYS.values()]
_REFLECTION_MARK = b"new version of the instructions"


def _keys_sent(request: RecordedRequest) -> list[str]:
    """Every key value in the request: its auth headers and the extra_params header in the body."""
    found = []
    for name in ("authorization", "x-api-key", "x-goog-api-key"):
        value = request.headers.get(name, "")
        if value:
            found.append(value.removeprefix("Bearer ").strip())
    body = request.body if isinstance(request.body, dict) else {}
    headers = body.get("extra_headers")
    if isinstance(headers, dict):
        found += [str(v) for v in headers.values()]
    return found


def _echo_server() -> Callable[[RecordedRequest], FakeTurn | ScriptedReply]:
    """A server and a model that repeat every key they were given, everywhere they can."""
    refused: set[str] = set()

    def reply(request: RecordedRequest) -> FakeTurn | ScriptedReply:
        said = " and ".join(_keys_sent(request)) or "no key"
        if said not in refused:  # the first request with these keys: an error body quoting them (retried)
            refused.add(said)
            return http_error(503, retry_after=0.01, message=f"upstream refused the keys {said}")
        return _content(request, said)

    return reply


def _content(request: RecordedRequest, said: str) -> ScriptedReply | FakeTurn:
    if _REFLECTION_MARK in request.raw_body:  # GEPA's reflection model
        return ScriptedReply(f"Here:\n```\nAnswer briefly. The keys are {said}.\n```", thinking=f"I hold {said}")
    messages = request.json.get("messages", [])
    if messages and messages[-1].get("role") == "tool":
        return ScriptedReply(f"Finished with {said}.")
    if b"please fail" in request.raw_body:
        return http_error(400, message=f"bad request from {said}")
    return ScriptedReply(
        f"The keys are {said}, as you asked.",
        thinking=f"I was called with {said}",
        tool_calls=(ScriptedToolCall("complete_task", {"final_result": f"keys: {said}"}),),
    )


async def _cli(tmp: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await trio.run_process(
        [*CLI, *args], cwd=tmp, env=env, capture_stdout=True, capture_stderr=True, check=False, stdin=b""
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


# A scripted model (the in-process provider) that reads the keys from its environment and says
# them in 2-character pieces: in thinking, text and tool arguments; asked to fail, it raises an
# error quoting them.
ECHO_MODULE = """
import os
from rollouts import Metric, RolloutsError, Score, ScriptedModel, ScriptedReply, ScriptedToolCall

def _reply(req):
    said = " and ".join(v for k, v in sorted(os.environ.items()) if k.endswith("_KEY"))
    if "please fail" in req.last_user_text:
        raise RolloutsError(f"the model refused the keys {said}")
    if req.messages[-1].role == "tool":
        return f"Finished with {said}."
    return ScriptedReply(
        f"The keys are {said}.", thinking=f"I hold {said}",
        tool_calls=(ScriptedToolCall("complete_task", {"final_result": f"keys: {said}"}),),
    )

ScriptedModel(_reply, name="echo-keys", chunk_size=2)

def score(sample):
    return Score((Metric("said", float("***" in sample.response), 1.0, {"feedback": sample.response}),))
"""


def _setup(tmp: Path, base_url: str) -> dict[str, str]:
    """rollouts.toml with an endpoint whose key comes from TEAM_KEY and whose extra_params carry
    a header holding HEADER_KEY; datasets. (These input files are the only ones allowed keys.)"""
    (tmp / "rollouts.toml").write_text(
        f'[endpoints.team]\nmodel = "openai-compatible/fake-model"\napi_base = "{base_url}"\n'
        f'api_key_env = "TEAM_KEY"\nextra_params = {{ extra_headers = {{ "X-Team-Key" = "{HEADER_KEY}" }} }}\n'
    )
    rows = [{"id": f"r{i}", "question": f"topic {i}", "answer": "keys"} for i in range(3)]
    rows.append({"id": "bad", "question": "please fail", "answer": "x"})
    (tmp / "echo_keys.py").write_text(ECHO_MODULE)
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # GEPA: answers the model never gives, so every minibatch asks the reflection model
    (tmp / "train.jsonl").write_text("".join(json.dumps({**r, "answer": "zebra"}) + "\n" for r in rows[:3]))
    return cli_env(tmp, TEAM_KEY=TEAM_KEY, **FAKE_KEYS)


def _leaks(tmp: Path, outputs: list[str]) -> list[str]:
    inputs = {tmp / "rollouts.toml"}  # (the user's own file holding the header key)
    hits = [f"output {i}: {k}" for i, text in enumerate(outputs) for k in KEYS if k in text]
    for path in tmp.rglob("*"):
        if path.is_file() and path not in inputs:
            data = path.read_bytes()
            hits += [f"{path.relative_to(tmp)}: {k}" for k in KEYS if k.encode() in data]
    return hits


async def test_no_key_is_printed_or_written_by_any_command(tmp_path: Path) -> None:
    outputs: list[str] = []
    async with open_fake_server(_echo_server(), chunk_size=3) as srv:
        env = _setup(tmp_path, srv.base_url)

        async def cli(*args: str, ok: tuple[int, ...] = (0,)) -> str:
            code, out, err = await _cli(tmp_path, env, *args)
            outputs.extend((out, err))
            assert code in ok, f"rollouts {' '.join(args)} -> {code}\n{err}"
            return out

        # run, plain: the key named by --api-key-env and the header key, through the config endpoint
        plain = await cli("run", "-m", "team", "--env", "calculator", "--yes", "-p", "what is my key?")
        # run, --json, with the provider's own variable (OPENAI_API_KEY)
        streamed = await cli(
            "run", "-m", "openai/gpt-4.1", "--api-base", srv.base_url, "--env", "calculator", "--yes",
            "-p", "and now?", "--json",
        )  # fmt: skip
        # eval: the row that fails makes exit status 1 (its error body quotes the keys)
        task = ("-m", "team", "--env", "calculator", "--score", "contains")
        await cli("eval", "data.jsonl", *task, "--no-progress", ok=(1,))
        await cli("eval", "data.jsonl", *task, "--json", "--output", "results-json", ok=(1,))
        # eval with the scripted model that echoes the keys from its environment
        await cli(
            "eval", "data.jsonl", "-m", "scripted/echo-keys", "--env", "calculator", "--score", "echo_keys:score",
            "--output", "results-scripted", "--no-progress", ok=(1,),
        )  # fmt: skip
        await cli(
            "gepa", "train.jsonl", "-m", "team", "--reflection-model", "team", "--env", "calculator",
            "--score", "contains", "--system-prompt", "Answer.", "--max-iterations", "2", "--output", "gepa-run",
        )  # fmt: skip
        assert srv.requests, "the server was called"
        assert any(TEAM_KEY in _keys_sent(r) and HEADER_KEY in _keys_sent(r) for r in srv.requests)
        assert any(FAKE_KEYS["OPENAI_API_KEY"] in _keys_sent(r) for r in srv.requests)

    # the content really was there, masked: the keys were echoed and replaced, not lost
    assert "The keys are ***" in plain
    records = [json.loads(line) for line in streamed.splitlines()]
    joined = "".join(r["delta"] for r in records if r["type"] == "text_delta")
    thinking = "".join(r["delta"] for r in records if r["type"] == "thinking_delta")
    args = "".join(r["delta"] for r in records if r["type"] == "tool_call_delta")
    assert "The keys are ***" in joined and "called with ***" in thinking and "keys: ***" in args, streamed
    assert all(k not in joined + thinking + args for k in KEYS)
    assert any(r["type"] == "stream_error" and "refused the keys ***" in r["error"] for r in records)
    scripted = (tmp_path / "results-scripted" / "samples.jsonl").read_text()
    assert "The keys are ***" in scripted and "I hold ***" in scripted and "refused the keys ***" in scripted
    gepa = tmp_path / "gepa-run"
    assert "The keys are ***" in (gepa / "reflections.jsonl").read_text()  # the prompt proposed
    assert "keys: ***" in (gepa / "rollouts.jsonl").read_text()

    sessions = [p.name for p in (tmp_path / "sessions").iterdir() if p.is_dir()]
    assert sessions
    listed = await cli_no_keys(tmp_path, env, outputs, "sessions", "list")
    assert sessions[0] in listed
    await cli_no_keys(tmp_path, env, outputs, "sessions", "list", "--json")
    for sid in sessions:
        shown = await cli_no_keys(tmp_path, env, outputs, "sessions", "show", sid)
        assert "***" in shown
        await cli_no_keys(tmp_path, env, outputs, "sessions", "tree", sid)
        await cli_no_keys(tmp_path, env, outputs, "sessions", "export", sid, "--format", "jsonl")
        for fmt in ("md", "html", "jsonl"):
            await cli_no_keys(tmp_path, env, outputs, "sessions", "export", sid, "--format", fmt, "-o", f"{sid}.{fmt}")
    session_json = json.loads((tmp_path / "sessions" / sessions[0] / "session.json").read_text())
    headers = [
        json.loads((tmp_path / "sessions" / s / "session.json").read_text())["endpoint"]["extra_params"]
        for s in sessions
    ]
    assert {"extra_headers": {"X-Team-Key": "[redacted]"}} in headers, session_json

    assert _leaks(tmp_path, outputs) == []


async def cli_no_keys(tmp: Path, env: dict[str, str], outputs: list[str], *args: str) -> str:
    code, out, err = await _cli(tmp, env, *args)
    outputs.extend((out, err))
    assert code == 0, f"rollouts {' '.join(args)} -> {code}\n{err}"
    return out
