"""The GEPA adapter for agents run by `evaluate()`.

    adapter = RolloutsAdapter(EvalConfig(endpoint=task_model, score_fn=score, max_concurrent=32))
    batch = await adapter.evaluate(rows, {"system_prompt": "You are ..."}, capture_traces=True)

A candidate is applied to the EvalConfig (see `rollouts.gepa.apply`: the system prompt, `{{name}}`
placeholders in messages, `tool:NAME` descriptions, or your own `apply(config, candidate)`), the
batch runs through `evaluate()` with all instances concurrent under the config's limits, and each
instance's score is the sample's reward. Feedback comes from the Score's metric metadata
(`Score.feedback`), or the error of a sample that failed.

With a rollout log (`RolloutsAdapter(..., log_path=run_dir / "rollouts.jsonl")`, which
`optimize(run_dir=...)` sets up) every finished sample is appended with its trajectory, and a
resumed run that repeats an evaluation (same `eval_id`, candidate and rows) takes the finished
samples from the log instead of calling the model again.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio

from rollouts.dtypes import Message, TextContent, ThinkingContent, ToolCallContent
from rollouts.errors import ConfigurationError
from rollouts.eval.config import EvalConfig, Row
from rollouts.eval.fingerprint import Fingerprint, describe_parts
from rollouts.eval.io import row_json
from rollouts.eval.run import evaluate, sample_id_for
from rollouts.eval.sample import Sample
from rollouts.gepa.adapter import Candidate, EvaluationBatch, ReflectiveDataset
from rollouts.gepa.apply import candidate_environment_factory, candidate_prepare, split_components
from rollouts.gepa.checkpoint import JsonlLog
from rollouts.run_config import RunConfig

__all__ = ["RolloutsAdapter", "candidate_hash", "render_trajectory"]

ApplyFn = Callable[[EvalConfig, Candidate], EvalConfig]


def candidate_hash(candidate: Mapping[str, str]) -> str:
    """A short stable hash of a candidate's texts."""
    return hashlib.sha256(json.dumps(dict(candidate), sort_keys=True).encode()).hexdigest()[:16]


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters left out ...]\n{text[-half:]}"


def _render_message(m: Message, limit: int) -> str:
    if m.role == "tool":
        name = m.tool_name or "tool"
        error = " (error)" if m.is_error else ""
        return f"[tool result: {name}{error}]\n{_clip(m.text, limit)}"
    parts = []
    for b in m.blocks:
        if isinstance(b, TextContent) and b.text.strip():
            parts.append(_clip(b.text, limit))
        elif isinstance(b, ThinkingContent) and b.thinking.strip():
            parts.append(f"(thinking) {_clip(b.thinking, limit)}")
        elif isinstance(b, ToolCallContent):
            args = b.raw_arguments if b.parse_error else json.dumps(dict(b.arguments), ensure_ascii=False)
            parts.append(f"[calls tool {b.name}({_clip(args or '', limit)})]")
    return f"[{m.role}]\n" + ("\n".join(parts) if parts else "(empty)")


def render_trajectory(messages: Sequence[Message], *, per_message_chars: int = 2000, total_chars: int = 12000) -> str:
    """Messages as readable text: each role, its text, the tool calls with their arguments and
    the tool results. System messages are left out (they are the candidate being improved)."""
    text = "\n\n".join(_render_message(m, per_message_chars) for m in messages if m.role != "system")
    return _clip(text, total_chars)


def _inputs(sample: Sample) -> str:
    """The messages before the agent's first reply (the task as given), without the system prompt."""
    if sample.trajectory is None:
        return json.dumps(dict(sample.input), ensure_ascii=False, default=str)
    out = []
    for m in sample.trajectory.messages:
        if m.role == "assistant":
            break
        if m.role != "system":
            out.append(m.text if m.role == "user" else _render_message(m, 4000))
    return "\n\n".join(out)


def _agent_part(sample: Sample) -> list[Message]:
    if sample.trajectory is None:
        return []
    msgs = list(sample.trajectory.messages)
    for i, m in enumerate(msgs):
        if m.role == "assistant":
            return msgs[i:]
    return []


def _feedback(sample: Sample) -> str:
    if sample.status != "completed":
        return f"The run did not complete ({sample.status}): {sample.error or 'no error recorded'}"
    if sample.score is None:
        return "(no score: the EvalConfig has no score_fn)"
    return sample.score.feedback or "(the score function gave no feedback)"


class _RolloutLog:
    """Finished samples per (eval_id, position), appended to a JSONL file and read back on resume."""

    def __init__(self, path: Path) -> None:
        self._log = JsonlLog(path)
        self._done: dict[tuple[str, int, str], dict[str, Any]] = {}
        for rec in self._log:
            if rec.get("sample", {}).get("status") == "completed":
                self._done[(rec["eval"], rec["pos"], rec["candidate"])] = rec

    def reusable(self, eval_id: str, pos: int, cand: str, row: Row) -> Sample | None:
        rec = self._done.get((eval_id, pos, cand))
        if rec is None:
            return None
        sample = Sample.from_dict(rec["sample"])
        # compared as the log stores a row (NaN as null, lone surrogates kept), so what was
        # written is what is compared; the reused sample keeps the row as given
        return replace(sample, input=row) if row_json(row) == sample.input else None

    @property
    def path(self) -> Path:
        return self._log.path

    def write(self, eval_id: str, pos: int, cand: str, sample: Sample) -> None:
        data = sample.to_dict()
        data["input"] = row_json(sample.input)  # as samples.jsonl stores it (and `reusable` compares it)
        self._log.append({"eval": eval_id, "pos": pos, "candidate": cand, "sample": data})

    def close(self) -> None:
        self._log.close()


class RolloutsAdapter:
    """Evaluates candidates by running an EvalConfig's agent through `evaluate()`.

    config: the task (endpoint, prepare_messages, environment_factory, score_fn, limits). Its
        output_dir and progress bar are not used (the GEPA run keeps rollouts itself).
    system_component: the candidate component that is the system prompt.
    apply: `(config, candidate) -> config` to apply candidates yourself (then the built-in
        system prompt / placeholder / tool description rules are not used).
    log_path: a JSONL file to append every rollout to and to reuse finished ones from.
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        system_component: str = "system_prompt",
        apply: ApplyFn | None = None,
        log_path: str | Path | None = None,
    ) -> None:
        if not isinstance(config, EvalConfig):
            raise ConfigurationError(f"RolloutsAdapter needs an EvalConfig, got {type(config).__name__}")
        if config.score_fn is None:
            raise ConfigurationError("GEPA needs scores: give the EvalConfig a score_fn (Sample -> Score)")
        self.config = config
        self.system_component = system_component
        self.apply = apply
        self._log = _RolloutLog(Path(log_path)) if log_path is not None else None
        self._limiters: tuple[trio.CapacityLimiter, trio.CapacityLimiter] | None = None

    def with_log(self, log_path: str | Path) -> RolloutsAdapter:
        """The same adapter, logging rollouts to `log_path` (and reusing finished ones from it)."""
        return RolloutsAdapter(self.config, system_component=self.system_component, apply=self.apply, log_path=log_path)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def config_for(self, candidate: Candidate) -> EvalConfig:
        """The EvalConfig that runs `candidate`."""
        cfg = self.config
        if self.apply is not None:
            cfg = self.apply(cfg, candidate)
            if not isinstance(cfg, EvalConfig):
                raise ConfigurationError(f"the apply function must return an EvalConfig, got {type(cfg).__name__}")
            return cfg
        system, texts, tools = split_components(candidate, self.system_component)
        cfg = replace(cfg, prepare_messages=candidate_prepare(cfg.prepare_messages, system, texts))
        if tools:
            if cfg.environment_factory is None:
                raise ConfigurationError(
                    f"candidate components {sorted(tools)} describe tools, but the EvalConfig has no environment_factory"
                )
            cfg = replace(cfg, environment_factory=candidate_environment_factory(cfg.environment_factory, tools))
        return cfg

    async def check_candidate(self, candidate: Candidate, row: Row) -> None:
        """Raise ConfigurationError now if `candidate` cannot be applied to `row` (a component
        no message uses, a tool the environment lacks), instead of failing every sample later."""
        cfg = self.config_for(candidate)
        out = cfg.prepare_messages(row)
        if hasattr(out, "__await__"):
            await out
        if self.apply is None and split_components(candidate, self.system_component)[2]:
            assert cfg.environment_factory is not None
            made = cfg.environment_factory(row)  # (candidate_environment_factory takes the row)
            env = await made if inspect.isawaitable(made) else made
            close = getattr(env, "aclose", None)
            if close is not None:
                with trio.CancelScope(shield=True):
                    await close()

    def _shared_limiters(self) -> tuple[trio.CapacityLimiter, trio.CapacityLimiter]:
        # Shared by every evaluation of the run (several may be in flight), so the config's
        # model-call and tool limits hold for the run as a whole.
        if self._limiters is None:
            self._limiters = self.config.limiters()
        return self._limiters

    async def evaluate(
        self,
        batch: Sequence[Mapping[str, Any]],
        candidate: Candidate,
        capture_traces: bool = False,
        *,
        eval_id: str | None = None,
    ) -> EvaluationBatch:
        """Run `candidate` on `batch` through `evaluate()`; see the module docstring."""
        cand = candidate_hash(candidate)
        samples: list[Sample | None] = [None] * len(batch)
        log = self._log if eval_id is not None else None
        if log is not None:
            assert eval_id is not None
            cfg_now: EvalConfig | None = None
            for pos, row in enumerate(batch):
                recorded = log.reusable(eval_id, pos, cand, row)
                if recorded is not None:
                    cfg_now = cfg_now or self.config_for(candidate)
                    await _check_fingerprint(recorded, cfg_now, row, log.path)
                samples[pos] = recorded
        todo = [pos for pos, s in enumerate(samples) if s is None]
        if todo:
            rows = [batch[pos] for pos in todo]
            cfg = self.config_for(candidate)
            model_limiter, tool_limiter = self._shared_limiters()
            rc = replace(cfg.run_config or RunConfig(), model_limiter=model_limiter, tool_limiter=tool_limiter)
            cfg = replace(
                cfg,
                run_config=rc,
                # (pinned before run_config is set: a bare RunConfig's 100 turns must not
                # replace the task's own bound, 10 by default)
                max_turns=cfg.effective_max_turns,
                output_dir=None,
                show_progress=False,
                max_samples=None,
                epochs=1,  # (one rollout per instance: a task's epochs are for evaluate() itself)
                pass_at=None,
                eval_name=f"gepa-{eval_id or 'eval'}",
            )
            if log is not None:
                assert eval_id is not None
                position = {sample_id_for(row, k): pos for k, (pos, row) in enumerate(zip(todo, rows, strict=True))}
                cfg = replace(cfg, on_sample_end=_logging_hook(cfg.on_sample_end, log, eval_id, cand, position))
            report = await evaluate(rows, cfg)
            assert len(report.samples) == len(rows), "evaluate() returned fewer samples than rows without raising"
            for pos, sample in zip(todo, report.samples, strict=True):
                samples[pos] = sample
        done = [s for s in samples if s is not None]
        assert len(done) == len(batch)
        return EvaluationBatch(
            outputs=[s.response for s in done],
            scores=[s.reward for s in done],
            trajectories=done,  # (always: the evaluation cache keeps them for later reflection)
            objective_scores=[{m.name: m.value for m in s.score.metrics} if s.score else {} for s in done],
            feedback=[_feedback(s) for s in done],
        )

    def encode_trajectory(self, trajectory: Any) -> dict[str, Any]:
        """A sample as JSON (the evaluation cache stores it)."""
        assert isinstance(trajectory, Sample)
        return trajectory.to_dict()

    def decode_trajectory(self, data: Any) -> Sample:
        """The sample `encode_trajectory` stored."""
        return Sample.from_dict(data)

    def make_reflective_dataset(
        self, candidate: Candidate, eval_batch: EvaluationBatch, components_to_update: Sequence[str]
    ) -> ReflectiveDataset:
        """For every component, one record per instance: the inputs, the agent's trajectory
        (replies, tool calls and results), the score and the feedback."""
        assert eval_batch.trajectories is not None, "make_reflective_dataset needs an evaluation with traces"
        records = []
        for sample, score in zip(eval_batch.trajectories, eval_batch.scores, strict=True):
            assert isinstance(sample, Sample)
            records.append(
                {
                    "Inputs": _inputs(sample),
                    "Agent trajectory": render_trajectory(_agent_part(sample)) or "(no reply)",
                    "Score": f"{score:.4g}",
                    "Feedback": _feedback(sample),
                }
            )
        return {name: records for name in components_to_update}


async def _check_fingerprint(recorded: Sample, cfg: EvalConfig, row: Row, log_path: Path) -> None:
    """Refuse to reuse a logged rollout made under other settings than `cfg`'s (the same rule
    as evaluate()'s resume: endpoint, environment, max_turns, score function, messages)."""
    if recorded.fingerprint is None:
        raise ConfigurationError(
            f"{log_path} holds rollouts recorded without a fingerprint (by an older version): whether they "
            "match the current task cannot be told; use another run_dir"
        )
    out = cfg.prepare_messages(row)
    if inspect.isawaitable(out):
        out = await out
    current = cfg.fingerprint.with_messages(tuple(out))
    parts = current.differences(Fingerprint.from_dict(recorded.fingerprint))
    if parts:
        raise ConfigurationError(
            f"{log_path} holds rollouts made with different {describe_parts(parts)}: reusing them would mix "
            "two tasks in one GEPA run; resume with the same task, or use another run_dir"
        )


def _logging_hook(
    user_hook: Callable[[Sample], Any] | None, log: _RolloutLog, eval_id: str, cand: str, position: dict[str, int]
) -> Callable[[Sample], Any]:
    async def on_sample_end(sample: Sample) -> None:
        if user_hook is not None:
            out = user_hook(sample)
            if hasattr(out, "__await__"):
                await out
        log.write(eval_id, position[sample.id], cand, sample)

    return on_sample_end
