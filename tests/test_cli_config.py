"""rollouts.config: model specs, provider inference, keys from the environment, TOML files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollouts.config import (
    BaseModelConfig,
    MissingAPIKeyError,
    RolloutsConfig,
    infer_provider_from_model,
    load_config,
    parse_model_spec,
    resolve_model,
)
from rollouts.errors import ConfigurationError, UnknownProviderError


@pytest.mark.parametrize(
    ("model", "provider"),
    [
        ("claude-sonnet-4-5", "anthropic"),
        ("claude-3-5-haiku-latest", "anthropic"),
        ("gpt-4.1", "openai"),
        ("gpt-4o-mini", "openai"),
        ("o3", "openai"),
        ("o4-mini", "openai"),
        ("gemini-2.5-flash", "google"),
        ("qwen2.5-coder-0.5b", "local"),
        ("llama3", None),
        ("mistral-large", None),
        ("omni-model", None),
    ],
)
def test_infer_provider_from_model(model: str, provider: str | None) -> None:
    assert infer_provider_from_model(model) == provider


def test_parse_model_spec() -> None:
    assert parse_model_spec("scripted/echo") == ("scripted", "echo")
    # a bare name the provider cannot be told from needs an api_base (then it is openai-compatible)
    assert parse_model_spec("my-model", api_base="http://127.0.0.1:1/v1") == ("openai-compatible", "my-model")
    with pytest.raises(ConfigurationError, match="provider/model"):
        parse_model_spec("my-model")
    with pytest.raises(UnknownProviderError, match=r"known providers: .*scripted"):
        parse_model_spec("nosuch/my-model")
    with pytest.raises(ConfigurationError, match="no model name"):
        parse_model_spec("scripted/")


def test_key_comes_from_the_named_variable_only() -> None:
    cfg = BaseModelConfig("scripted/echo", api_key_env="TEAM_KEY")
    ep = cfg.to_endpoint({"TEAM_KEY": "secret-value-1"})
    assert ep.api_key == "secret-value-1"
    assert "secret-value-1" not in repr(ep) and "secret-value-1" not in str(ep.to_dict())
    with pytest.raises(MissingAPIKeyError) as info:
        cfg.to_endpoint({})
    assert info.value.variable == "TEAM_KEY"
    assert "TEAM_KEY is not set" in str(info.value)
    # a provider with no key variable needs none
    assert BaseModelConfig("scripted/echo").to_endpoint({}).api_key == ""


def test_api_key_env_must_be_a_name() -> None:
    with pytest.raises(ConfigurationError, match="NAME of an environment variable") as info:
        BaseModelConfig("scripted/echo", api_key_env="sk-abc-123")
    assert "sk-abc" not in str(info.value)


def test_config_is_frozen_and_round_trips() -> None:
    cfg = BaseModelConfig("scripted/echo", max_tokens=123, temperature=0.5)
    with pytest.raises(AttributeError):
        cfg.max_tokens = 1  # type: ignore[misc]
    assert BaseModelConfig.from_dict(cfg.to_dict()) == cfg
    ep = cfg.to_endpoint({})
    assert (ep.provider, ep.model, ep.max_tokens, ep.temperature) == ("scripted", "echo", 123, 0.5)


def test_toml_files_merge_project_over_user(tmp_path: Path) -> None:
    user = tmp_path / "xdg" / "rollouts" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text(
        '[defaults]\nmodel = "a"\nmax_turns = 5\n\n[endpoints.a]\nmodel = "scripted/echo"\n\n'
        '[endpoints.b]\nmodel = "scripted/calculator"\n'
    )
    project = tmp_path / "proj"
    (project / "sub").mkdir(parents=True)
    (project / "rollouts.toml").write_text('[defaults]\nmodel = "b"\n\n[endpoints.a]\nmodel = "scripted/slow"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path)}
    config = load_config(cwd=project / "sub", environ=env)  # found in a parent directory
    assert config.sources == (user, project / "rollouts.toml")
    assert config.defaults == {"model": "b", "max_turns": 5}
    assert config.endpoints["a"].model == "scripted/slow"
    chosen = resolve_model(None, config)
    assert chosen.model == "scripted/calculator"
    assert resolve_model("a", config, max_tokens=7).max_tokens == 7
    assert resolve_model("scripted/echo", config).spec == "scripted/echo"


def test_toml_errors_are_clear(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none"), "HOME": str(tmp_path)}
    (tmp_path / "rollouts.toml").write_text("[defaults\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_config(cwd=tmp_path, environ=env)
    (tmp_path / "rollouts.toml").write_text('[endpoints.x]\nmodel = "scripted/echo"\ncolour = "blue"\n')
    with pytest.raises(ConfigurationError, match="unknown setting"):
        load_config(cwd=tmp_path, environ=env)
    (tmp_path / "rollouts.toml").write_text('[endpoints.x]\nmodel = "scripted/echo"\napi_key = "sk-1"\n')
    with pytest.raises(ConfigurationError, match="api_key_env"):
        load_config(cwd=tmp_path, environ=env)
    with pytest.raises(ConfigurationError, match="ROLLOUTS_CONFIG"):
        load_config(cwd=tmp_path, environ={**env, "ROLLOUTS_CONFIG": str(tmp_path / "missing.toml")})


def test_no_model_anywhere_says_what_to_pass() -> None:
    with pytest.raises(ConfigurationError, match="--model provider/model"):
        resolve_model(None, RolloutsConfig())
