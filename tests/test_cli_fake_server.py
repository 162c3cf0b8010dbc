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


async def test_key_named_by_a_config_endpoint_is_scrubbed_too(tmp_path: Path) -> None:
    # the server echoes the key back in its error; the key's variable is named only in rollouts.toml
    env = cli_env(tmp_path, VLLM_KEY=TEAM_KEY)
    turn = FakeTurn(status=401, error_message=f"Incorrect API key provided: {TEAM_KEY}", error_code="invalid_api_key")
    async with open_fake_server([turn]) as srv:
        (tmp_path / "rollouts.toml").write_text(
            f'[endpoints.vllm]\nmodel = "openai-compatible/fake-model"\napi_base = "{srv.base_url}"\n'
            'api_key_env = "VLLM_KEY"\n'
        )
        code, out, err = await _run(tmp_path, "run", "-m", "vllm", "-p", "hi", "--no-session", env=env)
        auth = srv.last_request.headers["authorization"]
    assert auth == f"Bearer {TEAM_KEY}"  # the key was sent...
    assert code == 1
    assert "Incorrect API key provided: ***" in err  # ...and never shown
    assert TEAM_KEY not in out + err


async def test_google_provider_through_the_cli(tmp_path: Path) -> None:
    env = cli_env(tmp_path, **FAKE_KEYS)
    async with open_fake_server([ScriptedReply("Bonjour!")]) as srv:
        code, out, err = await _run(
            tmp_path, "run", "-m", "google/gemini-2.5-flash", "--api-base", srv.url, "-p", "say hi in French", env=env
        )
        request = srv.last_request
    assert code == 0, err
    assert out == "Bonjour!\n"
    assert "gemini-2.5-flash" in request.path
    assert FAKE_KEYS["GEMINI_API_KEY"] in request.headers.values()  # the first of GEMINI_API_KEY, GOOGLE_API_KEY
    for key in FAKE_KEYS.values():
        assert key not in out + err
    assert files_containing(tmp_path, list(FAKE_KEYS.values())) == []  # nor in the session written
    assert any((tmp_path / "sessions").rglob("messages.jsonl"))


async def test_a_continued_session_takes_a_new_server_url_and_settings(tmp_path: Path) -> None:
    env = cli_env(tmp_path, TEAM_KEY=TEAM_KEY)
    async with open_fake_server([ScriptedReply("first answer")]) as old:
        code, _, err = await _run(
            tmp_path, "run", "-m", "openai-compatible/fake-model", "--api-base", old.base_url,
            "--api-key-env", "TEAM_KEY", "-p", "one", env=env,
        )  # fmt: skip
    assert code == 0, err
    sid = err.split("rollouts run --session ")[1].split(")")[0]
    async with open_fake_server([ScriptedReply("second answer")]) as new:  # the server moved
        code, out, err = await _run(
            tmp_path, "run", "--session", sid, "--api-base", new.base_url, "--api-key-env", "TEAM_KEY",
            "--max-tokens", "77", "-p", "two", env=env,
        )  # fmt: skip
        request = new.last_request
    assert code == 0, err
    assert out == "second answer\n"
    body = request.json
    assert body["model"] == "fake-model"
    assert body.get("max_tokens", body.get("max_completion_tokens")) == 77
    texts = [m["content"] if isinstance(m["content"], str) else m["content"][0]["text"] for m in body["messages"]]
    assert texts == ["one", "first answer", "two"]  # the session's history went to the new server
    assert request.headers["authorization"] == f"Bearer {TEAM_KEY}"
    assert files_containing(tmp_path, [TEAM_KEY]) == []
