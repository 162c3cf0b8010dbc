"""A small deterministic GEPA task for the tests: "tags".

Each row has a `topic`. The task model answers "OK <topic>" when the instructions it sees contain
the tag [T:<topic>], else "NO". The score is 1.0 for "OK <topic>", and the feedback names the
missing tag and the component that should hold it. The reflection model takes the current text
from the first fenced block of its prompt and appends the first tag the feedback asks for that
belongs to the component being rewritten (with `max_tags`, it keeps only the newest ones, which
makes candidates trade off against each other).

Two components: topics starting with "b" belong to the `hint` component, which is put into the
user message through the `{{hint}}` placeholder; the others to `system_prompt`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from rollouts import EvalConfig, Message, Metric, Sample, Score, ScriptedModel
from rollouts.providers.scripted import ScriptedRequest

TAG = re.compile(r"\[T:([a-z0-9]+)\]")


def rows(topics: str, prefix: str = "") -> list[dict[str, Any]]:
    """One row per character of `topics` (e.g. "aabc")."""
    return [{"id": f"{prefix}{i}", "topic": t} for i, t in enumerate(topics)]


def component_of(topic: str) -> str:
    return "hint" if topic.startswith("b") else "system_prompt"


class Kill(BaseException):
    """Stands for the process being killed: nothing catches it."""


class TagTask:
    """The task and reflection models (scripted) plus the score function, with call counters.

    kill_at: raise Kill at this task call (1-based), to interrupt a run at that point."""

    def __init__(
        self,
        *,
        two_components: bool = False,
        max_tags: int | None = None,
        latency_s: float = 0.0,
        reflect_latency_s: float = 0.0,
        kill_at: int | None = None,
        reflection: Callable[[str], str] | None = None,
    ) -> None:
        # The same model names for every TagTask: a resumed run is "the same task" only with the
        # same endpoint (rollouts are reused by fingerprint). Runs of one test are sequential,
        # so the latest TagTask's models are the ones registered under these names.
        n = "shared"
        self.two_components = two_components
        self.max_tags = max_tags
        self.kill_at = kill_at
        self.task_calls = 0
        self.reflect_calls = 0
        self.prompts: list[str] = []
        self.task = ScriptedModel(self._task, name=f"tags-task-{n}", latency_s=latency_s, chunk_size=64)
        self.reflector = ScriptedModel(
            reflection or self._reflect, name=f"tags-reflect-{n}", latency_s=reflect_latency_s, chunk_size=64
        )

    # ---- models -------------------------------------------------------------------------------

    def _task(self, req: ScriptedRequest) -> str:
        self.task_calls += 1
        if self.kill_at is not None and self.task_calls == self.kill_at:
            raise Kill(f"killed at task call {self.task_calls}")
        topic = req.last_user_text.split("topic:")[-1].split()[0]
        seen = req.system + "\n" + req.last_user_text
        return f"OK {topic}" if f"[T:{topic}]" in seen else "NO"

    def _reflect(self, req: ScriptedRequest) -> str:
        self.reflect_calls += 1
        prompt = req.last_user_text
        self.prompts.append(prompt)
        parts = prompt.split("```")
        current = parts[1].strip("\n") if len(parts) > 1 else ""
        component = re.search(r"instructions \(([a-z_]+)\)", prompt)
        name = component.group(1) if component else "system_prompt"
        after = "```".join(parts[2:])
        for tag in re.findall(r"needs \[T:([a-z0-9]+)\] in ([a-z_]+)", after):
            topic, owner = tag
            if owner == name and f"[T:{topic}]" not in current:
                lines = current.split("\n")
                if self.max_tags is not None:
                    tagged = [i for i, ln in enumerate(lines) if TAG.search(ln)]
                    if len(tagged) >= self.max_tags:
                        del lines[tagged[0]]
                new = "\n".join([*lines, f"Topic [T:{topic}] is handled."])
                return f"Here you go:\n```\n{new}\n```"
        return f"```\n{current}\n```"

    # ---- the evaluation config ----------------------------------------------------------------

    def prepare(self, row: Mapping[str, Any]) -> list[Message]:
        text = f"topic: {row['topic']}"
        if self.two_components:
            text = "{{hint}}\n" + text
        return [Message("user", text)]

    def score(self, sample: Sample) -> Score:
        topic = sample.input["topic"]
        ok = sample.response == f"OK {topic}"
        owner = component_of(topic) if self.two_components else "system_prompt"
        feedback = "Correct." if ok else f"Wrong: the instructions needs [T:{topic}] in {owner}."
        return Score((Metric("correct", float(ok), 1.0, {"feedback": feedback}),))

    def config(self, **kw: Any) -> EvalConfig:
        return EvalConfig(
            endpoint=self.task.endpoint,
            score_fn=self.score,
            prepare_messages=self.prepare,
            max_concurrent=32,
            show_progress=False,
            **kw,
        )

    def seed(self) -> dict[str, str]:
        if self.two_components:
            return {"system_prompt": "Answer about topics.", "hint": "Hints:"}
        return {"system_prompt": "Answer about topics."}
