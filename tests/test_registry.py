"""The provider registry: built-in names, custom providers and per-model resolvers, lazy SDK imports."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from rollouts import (
    Actor,
    AgentState,
    Message,
    RunConfig,
    StopReason,
    Trajectory,
    register_provider,
    rollout,
    run_agent,
)
from rollouts.dtypes import Endpoint
from rollouts.errors import UnknownProviderError
from rollouts.events import OnChunk
from rollouts.providers import _REGISTERED, _RESOLVERS, get_provider_function, known_providers
from rollouts.providers.scripted import ScriptedModel, stream_scripted

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def _clean_registry():  # type: ignore[no-untyped-def]
    before, resolvers = dict(_REGISTERED), set(_RESOLVERS)
    yield
    _REGISTERED.clear()
    _REGISTERED.update(before)
    _RESOLVERS.clear()
    _RESOLVERS.update(resolvers)


def test_every_builtin_provider_is_known() -> None:
    names = set(known_providers())
    expected = {"anthropic", "openai", "openai-responses", "google", "openai-compatible", "vllm", "sglang"}
    assert expected | {"llamacpp", "scripted", "local"} <= names
    with pytest.raises(UnknownProviderError, match="unknown provider 'nope'; known providers: anthropic"):
        get_provider_function("nope", "m")


@pytest.mark.usefixtures("_clean_registry")
async def test_a_registered_provider_and_a_per_model_resolver_are_routed_to() -> None:
    seen: list[str] = []
    model = ScriptedModel(["from the custom provider"])

    async def custom(actor: Actor, on_chunk: OnChunk) -> Actor:
        seen.append(actor.endpoint.model)
        scripted = replace(actor, endpoint=replace(actor.endpoint, provider="scripted", model=model.name))
        out = await stream_scripted(scripted, on_chunk)
        return replace(out, endpoint=actor.endpoint)

    register_provider("my-lab", custom)
    assert "my-lab" in known_providers()
    state = AgentState(Actor(Trajectory((Message("user", "hi"),)), Endpoint("my-lab", "m1")))
    states = await run_agent(state, RunConfig())
    assert states[-1].stop == StopReason.NO_TOOL_CALLED
    assert states[-1].messages[-1].text == "from the custom provider" and seen == ["m1"]

    # A resolver picks the function from the model name.
    async def fails(actor: Actor, on_chunk: OnChunk) -> Actor:
        raise AssertionError("the resolver should not have chosen this")

    register_provider("my-lab", lambda m: custom if m.startswith("good") else fails, resolver=True)
    model2 = ScriptedModel(["resolved"])
    model = model2
    actor = Actor(Trajectory((Message("user", "hi"),)), Endpoint("my-lab", "good-1"))
    assert (await rollout(actor, RunConfig().on_chunk)).trajectory.messages[-1].text == "resolved"
    assert seen == ["m1", "good-1"]


def test_using_one_provider_never_imports_the_other_sdks() -> None:
    code = (
        "import sys, trio\n"
        "from rollouts import *\n"
        "from rollouts.providers import get_provider_function\n"
        "m = ScriptedModel(['hi'])\n"
        "trio.run(run_agent, AgentState(Actor(Trajectory((Message('user', 'q'),)), m.endpoint)), RunConfig())\n"
        "get_provider_function('openai', 'gpt-4o')\n"
        "print(sorted(k for k in ('anthropic', 'openai', 'google.genai') if k in sys.modules))\n"
        "from rollouts.providers.openai_chat import _make_sdk_client\n"
        "_make_sdk_client(Endpoint('openai', 'gpt-4o'), 'k')\n"
        "print(sorted(k for k in ('anthropic', 'openai', 'google.genai') if k in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
    ).stdout  # fmt: skip
    # the openai SDK is imported when its first client is made (the lean HTTP path never needs it)
    assert out.split() == ["[]", "['openai']"]
