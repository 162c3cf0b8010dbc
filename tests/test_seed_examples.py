"""Issue 30 item 4: the seed's quick examples run as written, and its `Endpoint.oauth_token`.

The two examples of seed 003 ("Quick Examples") are copied below verbatim. Each runs in a fresh
Python process against the fake provider server speaking Anthropic's wire format, reached through
the real `anthropic` SDK via its standard `ANTHROPIC_BASE_URL` variable: the imports, the
`Endpoint(provider="anthropic", model="claude-sonnet-4")` and every call are exactly the seed's.
Only what cannot run as printed is supplied around it: the top-level `await`s run inside
`async def main()` under `trio.run`, the dataset's `...` placeholder becomes a second row, and
the second example's two names that the seed uses without importing (`stdout_handler`,
`handle_stop_max_turns`) come from `rollouts.agents`, where the original rollouts had them.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from cli_support import FAKE_KEYS, cli_env

from rollouts.dtypes import Actor, Endpoint, Message, Trajectory
from rollouts.eval.config import EvalConfig
from rollouts.eval.run import evaluate
from rollouts.providers.anthropic import OAUTH_BETA
from rollouts.redaction import MASK, known_secrets
from rollouts.testing import RecordedRequest, ScriptedReply, ScriptedToolCall, open_fake_server
from tests._provider_helpers import call

SEED_EVALUATE = """\
from rollouts.evaluation import evaluate
from rollouts.dtypes import Endpoint, Message, EvalConfig, Metric, Score
from rollouts.training.types import Sample

def prepare_messages(sample: dict) -> list[Message]:
    return [Message(role="user", content=sample["question"])]

def score_fn(sample: Sample) -> Score:
    correct = sample.response == str(sample.ground_truth)
    return Score(metrics=(
        Metric("correct", 1.0 if correct else 0.0, weight=1.0),
    ))

config = EvalConfig(
    endpoint=Endpoint(provider="anthropic", model="claude-sonnet-4"),
    score_fn=score_fn,
    prepare_messages=prepare_messages,
    max_concurrent=4,
)

dataset = [{"question": "2+2?", "ground_truth": "4"}, ...]
report = await evaluate(iter(dataset), config)
print(f"Mean reward: {report.summary_metrics['mean_reward']:.3f}")
"""

SEED_AGENT = """\
from rollouts.agents import run_agent
from rollouts.environments.calculator import CalculatorEnvironment
from rollouts.dtypes import AgentState, Actor, Endpoint, Message, Trajectory, RunConfig, StopReason

state = AgentState(
    actor=Actor(
        trajectory=Trajectory(messages=[
            Message(role="user", content="What is 5+3*2?")
        ]),
        endpoint=Endpoint(provider="anthropic", model="claude-sonnet-4"),
    ),
    environment=CalculatorEnvironment(),
)

run_config = RunConfig(
    on_chunk=stdout_handler,
    handle_stop=handle_stop_max_turns(10),
)

states = await run_agent(state, run_config)
print(f"Completed in {states[-1].turn_idx} turns")
"""


def _program(example: str, header: str = "") -> str:
    return f"import trio\n{header}\n\nasync def main():\n{textwrap.indent(example, '    ')}\n\ntrio.run(main)\n"


def _model(request: RecordedRequest) -> ScriptedReply:
    """Claude as the examples need it: arithmetic answers, and the calculator in three steps."""
    messages = request.json["messages"]
    question = messages[0]["content"][0]["text"]
    answers = {"2+2?": "4", "3+3?": "6"}
    if question in answers:
        return ScriptedReply(answers[question])
    steps = [("add", {"value": 3}), ("multiply", {"value": 2}), ("add", {"value": 5})]
    done = sum(1 for m in messages if m["role"] == "assistant")
    if done < len(steps):
        name, args = steps[done]
        return ScriptedReply(f"Step {done + 1}.", tool_calls=(ScriptedToolCall(name, args),))
    return ScriptedReply("5+3*2 = 11.", tool_calls=(ScriptedToolCall("complete_task", {"final_result": "11"}),))


async def _run(tmp: Path, program: str, url: str) -> tuple[int, str, str]:
    script = tmp / "example.py"
    script.write_text(program)
    env = cli_env(tmp, ANTHROPIC_API_KEY=FAKE_KEYS["ANTHROPIC_API_KEY"], ANTHROPIC_BASE_URL=url)
    proc = await trio.run_process(
        [sys.executable, str(script)], cwd=tmp, env=env, capture_stdout=True, capture_stderr=True, check=False
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_the_seed_evaluate_example_runs_as_written(tmp_path: Path) -> None:
    assert SEED_EVALUATE.count(", ...]") == 1
    example = SEED_EVALUATE.replace(", ...]", ', {"question": "3+3?", "ground_truth": "6"}]')
    async with open_fake_server(_model) as srv:
        code, out, err = await _run(tmp_path, _program(example), srv.url)
        requests = srv.scripted_requests
    assert code == 0, err
    assert out.splitlines()[-1] == "Mean reward: 1.000"
    assert sorted(r.json["messages"][0]["content"][0]["text"] for r in requests) == ["2+2?", "3+3?"]
    assert {r.json["model"] for r in requests} == {"claude-sonnet-4"}


async def test_the_seed_agent_example_runs_as_written(tmp_path: Path) -> None:
    header = "from rollouts.agents import handle_stop_max_turns, stdout_handler"
    async with open_fake_server(_model) as srv:
        code, out, err = await _run(tmp_path, _program(SEED_AGENT, header), srv.url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[-1] == "Completed in 4 turns"
    assert "-> multiply(value=2)" in lines and "<- add: Added 5 to 6. Current value: 11" in lines, out
    assert "5+3*2 = 11." in lines


def test_the_seed_import_paths_name_the_library_s_own_objects() -> None:
    import rollouts
    import rollouts.agents
    import rollouts.config
    import rollouts.config.base
    import rollouts.dtypes
    import rollouts.evaluation
    import rollouts.handlers
    import rollouts.training.types

    for name in ("EvalConfig", "RunConfig", "Metric", "Score", "Endpoint", "Message", "AgentState", "StopReason"):
        assert getattr(rollouts.dtypes, name) is getattr(rollouts, name), name
    assert rollouts.evaluation.evaluate is rollouts.evaluate
    assert rollouts.training.types.Sample is rollouts.Sample
    assert rollouts.config.base.BaseModelConfig is rollouts.config.BaseModelConfig
    assert rollouts.agents.handle_stop_max_turns is rollouts.handlers.handle_stop_max_turns
    cfg = rollouts.config.base.BaseModelConfig("anthropic/claude-sonnet-4")
    assert cfg.infer_provider() == "anthropic"
    summary = rollouts.evaluation.compute_summary_metrics(
        [
            rollouts.Sample("a", score=rollouts.Score((rollouts.Metric("correct", 1.0, 1.0),)), status="completed"),
            rollouts.Sample("b", score=rollouts.Score((rollouts.Metric("correct", 0.0, 1.0),)), status="completed"),
        ]
    )
    assert (summary["mean_reward"], summary["correct_mean"], summary["n_completed"]) == (0.5, 0.5, 2)


# ---- Endpoint.oauth_token -------------------------------------------------------------------

TOKEN = "sk-ant-oat01-FAKEOAUTH-0123456789abcdef"


def test_endpoint_oauth_token_is_never_printed_or_serialized_and_from_dict_takes_it() -> None:
    ep = Endpoint("anthropic", "claude-sonnet-4", oauth_token=TOKEN)
    assert TOKEN not in repr(ep) and TOKEN not in str(ep)
    d = ep.to_dict()
    assert "oauth_token" not in d and "api_key" not in d and TOKEN not in json.dumps(d)
    assert ep.to_dict(exclude_secrets=False)["oauth_token"] == TOKEN
    back = Endpoint.from_dict(d, api_key="sk-ant-FAKE-api-0123456789", oauth_token=TOKEN)
    assert (back.oauth_token, back.api_key, back.model) == (TOKEN, "sk-ant-FAKE-api-0123456789", "claude-sonnet-4")
    assert Endpoint.from_dict(ep.to_dict(exclude_secrets=False)) == ep
    assert known_secrets().redact(f"the token is {TOKEN}.") == f"the token is {MASK}."


async def test_the_anthropic_provider_sends_the_oauth_token_as_a_bearer_token_not_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEYS["ANTHROPIC_API_KEY"])
    async with open_fake_server([ScriptedReply("Hello.")]) as srv:
        ep = Endpoint("anthropic", "claude-sonnet-4", api_base=srv.url, oauth_token=TOKEN)
        actor, _ = await call(Actor(Trajectory((Message("user", "Hi"),)), ep))
        headers = srv.last_request.headers
    assert actor.trajectory.messages[-1].text == "Hello."
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert OAUTH_BETA in headers.get("anthropic-beta", "")
    assert FAKE_KEYS["ANTHROPIC_API_KEY"] not in json.dumps(dict(headers)) and "x-api-key" not in headers


async def test_an_oauth_token_the_model_repeats_is_masked_in_every_file_evaluate_writes(tmp_path: Path) -> None:
    def echo(request: RecordedRequest) -> ScriptedReply:
        token = request.headers["authorization"].removeprefix("Bearer ")
        return ScriptedReply(f"My token is {token}.", thinking=f"I was sent {token}")

    async with open_fake_server(echo, chunk_size=3) as srv:
        ep = Endpoint("anthropic", "claude-sonnet-4", api_base=srv.url, oauth_token=TOKEN)
        config = EvalConfig(endpoint=ep, output_dir=tmp_path / "out", show_progress=False, metadata={"e": ep.to_dict()})
        report = await evaluate([{"question": "Who are you?"}], config)
    assert report.summary["counts"]["completed"] == 1
    written = [p.read_text() for p in (tmp_path / "out").iterdir()]
    assert any("My token is ***." in text for text in written)
    assert not any(TOKEN in text for text in written)
