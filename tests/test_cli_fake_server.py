"""`rollouts run` / `eval` against a real provider (the OpenAI SDK) talking to the local fake
server: keys travel only in the request header, never to output or files."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from cli_support import CLI, FAKE_KEYS, cli_env, files_containing

from rollouts.providers.scripted import ScriptedReply, ScriptedToolCall
from rollouts.testing import FakeTurn, open_fake_server

TEAM_KEY = "team-FAKEKEY-for-the-fake-server-42"


async def _run(tmp: Path, *args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await trio.run_process(
        [*CLI, *args], cwd=tmp, env=env, capture_stdout=True, capture_stderr=True, check=False, stdin=b""
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_openai_compatible_one_shot_with_api_key_env(tmp_path: Path) -> None:
    env = cli_env(tmp_path, TEAM_KEY=TEAM_KEY, **FAKE_KEYS)
    async with open_fake_server([ScriptedReply("Hello from the fake server!")], chunk_size=5) as srv:
        code, out, err = await _run(
            tmp_path, "run", "-m", "openai-compatible/fake-model", "--api-base", srv.base_url,
            "--api-key-env", "TEAM_KEY", "-p", "say hello", "--no-session", env=env,
        )  # fmt: skip
        request = srv.last_request
    assert code == 0, err
    assert out == "Hello from the fake server!\n"
    assert request.headers["authorization"] == f"Bearer {TEAM_KEY}"
    assert request.json["model"] == "fake-model"
    assert request.json["messages"][-1]["content"] in ("say hello", [{"type": "text", "text": "say hello"}])
    for key in (TEAM_KEY, *FAKE_KEYS.values()):
        assert key not in out + err
    assert files_containing(tmp_path, [TEAM_KEY, *FAKE_KEYS.values()]) == []


async def test_openai_provider_tool_calls_json_stream(tmp_path: Path) -> None:
    env = cli_env(tmp_path, **FAKE_KEYS)
    script = [
        ScriptedReply("Adding.", tool_calls=(ScriptedToolCall("add", {"value": 4}),)),
        ScriptedReply("Done.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "4"}),)),
    ]
    async with open_fake_server(script) as srv:
        code, out, err = await _run(
            tmp_path, "run", "-m", "openai/gpt-4.1", "--api-base", srv.base_url, "--env", "calculator",
            "-p", "add four", "--json", "--no-session", env=env,
        )  # fmt: skip
        auth = srv.last_request.headers["authorization"]
    assert code == 0, err
    assert auth == f"Bearer {FAKE_KEYS['OPENAI_API_KEY']}"
    records = [json.loads(line) for line in out.splitlines()]
    types = [r["type"] for r in records]
    assert types.count("llm_call_start") == 2
    ends = [r for r in records if r["type"] == "tool_call_end"]
    assert [e["tool_call"]["name"] for e in ends] == ["add", "complete_task"]
    results = [r for r in records if r["type"] == "tool_result_received"]
    assert results[0]["result"]["content"] == "Added 4 to 0. Current value: 4"
    assert records[-1]["stop"] == "task_completed"
    assert FAKE_KEYS["OPENAI_API_KEY"] not in out + err


async def test_rejected_key_is_one_line_and_not_echoed(tmp_path: Path) -> None:
    env = cli_env(tmp_path, TEAM_KEY=TEAM_KEY)
    turn = FakeTurn(status=401, error_message=f"Incorrect API key provided: {TEAM_KEY}", error_code="invalid_api_key")
    async with open_fake_server([turn]) as srv:
        code, out, err = await _run(
            tmp_path, "run", "-m", "openai-compatible/fake-model", "--api-base", srv.base_url,
            "--api-key-env", "TEAM_KEY", "-p", "hi", "--no-session", env=env,
        )  # fmt: skip
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rollouts: error:")
    assert TEAM_KEY not in out + err


async def test_anthropic_provider_with_thinking_through_the_cli(tmp_path: Path) -> None:
    env = cli_env(tmp_path, **FAKE_KEYS)
    reply = ScriptedReply("Four.", thinking="2 and 2 make 4")
    async with open_fake_server([reply]) as srv:
        code, out, err = await _run(
            tmp_path, "run", "-m", "claude-sonnet-4-5", "--api-base", srv.url, "-p", "2+2?", "--no-session", env=env
        )
        headers = srv.last_request.headers
    assert code == 0, err
    assert out == "Four.\n"
    assert "thinking: 2 and 2 make 4" in err
    key = FAKE_KEYS["ANTHROPIC_API_KEY"]
    assert headers.get("x-api-key") == key or headers.get("authorization") == f"Bearer {key}"
    assert FAKE_KEYS["ANTHROPIC_API_KEY"] not in out + err
