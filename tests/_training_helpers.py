"""Helpers shared by the training tests: the tiny GRPO task (PROMPTS, the `sevens` reward) and
the kill-and-resume check, whose killed run is this file run as a script:

    python tests/_training_helpers.py OUT KILL_AFTER MODULE:FUNCTION CHANGES_JSON

builds its config with `FUNCTION(OUT, **CHANGES)` (a test module's `_config`, imported from the
tests directory), trains the tiny model (seed 0) on PROMPTS with `sevens`, and SIGKILLs itself
from `on_step` right after step KILL_AFTER is logged.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import trio

from rollouts.eval.sample import Metric, Score
from rollouts.training import GRPOConfig, GRPOResult, StepResult, grpo_train, local_policy
from rollouts.training.tiny import tiny_chat_model

PROMPTS = [{"prompt": "say seven"}, {"prompt": "a number?"}, {"prompt": "digits"}]
_TESTS = Path(__file__).resolve().parent
_KILLED_RUN_TIMEOUT_S = 600


def sevens(sample: Any) -> Score:
    """Reward: the share of the reply's characters that are '7'."""
    reply = sample.response
    return Score((Metric("sevens", reply.count("7") / max(len(reply), 1), weight=1.0),))


async def _train(config: GRPOConfig, name: str, on_step: Callable[[StepResult], None] | None = None) -> Any:
    """Train the tiny model (seed 0) with `config`; the model after it."""
    model, tokenizer = tiny_chat_model(seed=0)
    backend, policy = local_policy(model, tokenizer, config, name=name)
    result = await grpo_train(config, PROMPTS, sevens, backend=backend, inference=policy, on_step=on_step)
    return model, result


def _log(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@dataclass(frozen=True)
class KillAndResume:
    """The uninterrupted run and the killed-then-resumed one: their results (`resumed` is the
    resuming call's: its `resumed_from` and the steps it ran) and log lines."""

    straight: GRPOResult
    resumed: GRPOResult
    straight_log: list[dict[str, Any]]
    resumed_log: list[dict[str, Any]]


async def kill_and_resume(
    tmp_path: Path, config: Callable[..., GRPOConfig], changes: Mapping[str, Any], *, kill_after: int
) -> KillAndResume:
    """Train `config(out, **changes)` (a module-level function of a test module) on the tiny
    model three ways: uninterrupted, here (tmp_path/straight); in a subprocess SIGKILLed right
    after step `kill_after` is logged (tmp_path/killed); then resumed here in tmp_path/killed
    from a fresh copy of the same starting model (another one is refused: see
    test_defect6_resume_refuses_another_model). Checks what any exact resume gives: the kill
    came after steps 0..kill_after were logged, and the resumed run ends with the uninterrupted
    run's weights bit for bit and logs the same reward means; the caller checks the rest."""
    straight_model, straight = await _train(config(tmp_path / "straight", **changes), "tiny-straight")
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    ref = f"{config.__module__}:{config.__qualname__}"
    command = [sys.executable, __file__, str(out), str(kill_after), ref, json.dumps(dict(changes))]
    with trio.fail_after(_KILLED_RUN_TIMEOUT_S):
        proc = await trio.run_process(command, env=env, capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:].decode(errors="replace")
    assert [e["step"] for e in _log(out)] == list(range(kill_after + 1))

    resumed_model, resumed = await _train(config(out, **changes), "tiny-resumed")
    expected, got = straight_model.state_dict(), resumed_model.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    straight_log, resumed_log = _log(tmp_path / "straight"), _log(out)
    assert [e["reward_mean"] for e in resumed_log] == [e["reward_mean"] for e in straight_log]
    return KillAndResume(straight, resumed, straight_log, resumed_log)


def _killed_run(out: Path, kill_after: int, ref: str, changes: Mapping[str, Any]) -> None:
    torch.set_num_threads(1)
    module, _, function = ref.partition(":")
    config = getattr(importlib.import_module(module), function)(out, **changes)

    def on_step(result: StepResult) -> None:
        if result.step == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    trio.run(_train, config, "tiny", on_step)


if __name__ == "__main__":
    # through the module's own name: the run's fingerprint names the score function, and
    # `__main__.sevens` would not resume as `_training_helpers.sevens`
    from _training_helpers import _killed_run

    _killed_run(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
