"""Issue 29 item 3 for GRPO: the concurrent samples of a group each get their own copy of the
starting workspace, and the copies are removed afterwards.

`grpo_train` runs a group's samples concurrently through `evaluate()`; with
`environment_factory=lambda: CodingEnvironment.from_template(dir)` each sample must work in a
private copy of `dir` (its sandboxed `bash` sees no other sample's files) that is deleted when
the sample ends. The policy is a vLLM stand-in (`ServedTinyModel` of test_training_served: the
token-exact `/v1/completions` path with a weight-reload route) whose replies are scripted tool
calls, tokenized by the tiny model's tokenizer, so the run trains on real token ids: each
sample writes a file named after its own sampling seed with bash (in bubblewrap), waits until
every sample of the step has written its file, then lists its workspace with bash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import trio
from test_training_served import ServedTinyModel

from rollouts.environments import CodingEnvironment
from rollouts.eval.sample import Metric, Sample, Score
from rollouts.providers.scripted import ScriptedReply
from rollouts.testing import RecordedRequest, open_fake_server
from rollouts.testing.fake_server import RenderContext, sse
from rollouts.training import GRPOConfig, ServedPolicy, TorchBackend, grpo_train
from rollouts.training.tiny import tiny_chat_model

torch.set_num_threads(1)
GROUP = 4
STEPS = 2


class ScriptedTokens(ServedTinyModel):
    """Streams the scripted reply's text as the tiny tokenizer's token ids (log-prob -0.5 each)."""

    def stream_events(self, reply: Any, request: RecordedRequest, ctx: RenderContext) -> list[bytes]:
        ids = [*self.tokenizer.encode(reply.text, add_special_tokens=False), self.tokenizer.eos_token_id]
        assert len(ids) <= request.json["max_tokens"], "the scripted reply is longer than max_tokens"
        events = []
        for n, token in enumerate(ids):
            last = n + 1 == len(ids)
            choice = {
                "index": 0,
                "text": "" if last else self.tokenizer.decode([token]),
                "logprobs": {"tokens": [f"token_id:{token}"], "token_logprobs": [-0.5]},
                "finish_reason": "stop" if last else None,
            }
            events.append(sse({"id": "cmpl-1", "object": "text_completion", "choices": [choice]}))
        return [*events, b"data: [DONE]\n\n"]


def _bash(command: str) -> str:
    return json.dumps({"name": "bash", "arguments": {"command": command}})


class Script:
    """The policy's replies: 1) write `s<seed>.txt`, 2) once every sample of the step has
    written its file, `ls`, 3) a final text. The turn is read from the prompt (tool results in it)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.arrived = 0  # samples past their write; steps run one after the other
        self.group_written: dict[int, trio.Event] = {}

    async def __call__(self, request: RecordedRequest) -> ScriptedReply:
        body = request.json
        prompt = self.tokenizer.decode(body["prompt"], skip_special_tokens=False)
        seed = int(body["seed"])
        results = prompt.count("<|im_start|>tool")
        if results == 0:
            return ScriptedReply(_bash(f"echo {seed} > s{seed}.txt"))
        if results == 1:
            event = self.group_written.setdefault(self.arrived // GROUP, trio.Event())
            self.arrived += 1
            if self.arrived % GROUP == 0:
                event.set()
            with trio.fail_after(60):
                await event.wait()  # every sample of the group has written its file
            return ScriptedReply(_bash("ls"))
        return ScriptedReply("done")


async def test_grpo_group_samples_each_get_their_own_sandboxed_workspace_copy_removed_afterwards(
    tmp_path: Path,
) -> None:
    template = tmp_path / "template"
    template.mkdir()
    (template / "start.txt").write_text("the starting workspace\n")
    workspaces = tmp_path / "workspaces"
    workspaces.mkdir()
    seen: list[Sample] = []

    def score(sample: Sample) -> Score:
        seen.append(sample)
        return Score((Metric("ok", 1.0, weight=1.0),))

    async def factory() -> CodingEnvironment:
        return await CodingEnvironment.from_template(template, workspaces_dir=workspaces, sandbox="auto")

    model, tokenizer = tiny_chat_model(seed=0)
    served, _ = tiny_chat_model(seed=0)
    server = ScriptedTokens(served, tokenizer)
    config = GRPOConfig(
        output_dir=tmp_path / "run",
        num_steps=STEPS,
        batch_size=1,
        n_samples_per_prompt=GROUP,
        max_tokens=120,
        max_turns=4,
        lr=1e-3,
    )
    async with open_fake_server(Script(tokenizer), formats=[server]) as srv:
        policy = ServedPolicy(srv.base_url, "policy", weights_dir=tmp_path / "weights", reload_route="/reload_weights")
        result = await grpo_train(
            config, [{"prompt": "make a file"}], score, factory, backend=TorchBackend(model), inference=policy
        )
    assert [s.failed for s in result.steps] == [0] * STEPS
    assert len(seen) == STEPS * GROUP
    roots = set()
    for sample in seen:
        assert sample.trajectory is not None and sample.environment_state is not None
        tool_results = [m.text for m in sample.trajectory.messages if m.role == "tool"]
        assert len(tool_results) == 2, tool_results
        own = next(c.arguments["command"] for m in sample.trajectory.messages for c in m.get_tool_calls())
        mine = own.split("> ")[1]
        # its sandboxed bash saw the starting files and its own file, none of the others'
        listing = tool_results[1].removesuffix("[exit code 0]").split()
        assert listing == sorted(["start.txt", mine]), tool_results[1]
        roots.add(sample.environment_state["root"])
    assert len(roots) == STEPS * GROUP  # one copy per sample
    assert all(Path(r).parent == workspaces.resolve() for r in roots)
    assert list(workspaces.iterdir()) == []  # every copy removed when its sample ended
    assert sorted(p.name for p in template.iterdir()) == ["start.txt"]  # the template untouched
