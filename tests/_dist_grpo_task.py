"""A GRPO run on the tiny model, for tests/test_training_distributed.py: run it plainly (one
process) or under torchrun / with torchrun's environment (N processes); the same code either way.

    python tests/_dist_grpo_task.py OUT --steps 3 [--parallel fsdp] [--fail-rank R --fail-step S --how raise|kill]
        [--checkpoint-every N] [--max-policy-lag N]

By default every step writes a checkpoint, which is a drain point of the overlapped rollouts
(`rollouts.training.overlap`): the run alternates strictly. `--checkpoint-every` above the step
count with `--max-policy-lag 1` makes each step's rollouts be generated while the one before trains.

Rank 0 writes OUT/weights.pt (the final state dict) when the run ends; every rank writes
OUT/rankR.json after its first step: the type and number of the parameters its optimizer updates.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)
import trio  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _training_helpers import PROMPTS  # noqa: E402

from rollouts.eval.sample import Metric, Score  # noqa: E402
from rollouts.training import GRPOConfig, grpo_train, local_policy  # noqa: E402
from rollouts.training.distributed import current_world  # noqa: E402
from rollouts.training.tiny import tiny_chat_model  # noqa: E402


def digits(sample: Any) -> Score:
    """Reward: the share of the reply's characters that are digits (about one in six at the
    start, so every group has different rewards and every step trains)."""
    reply = sample.response
    return Score((Metric("digits", sum(c.isdigit() for c in reply) / max(len(reply), 1), weight=1.0),))


def tied_model() -> tuple[Any, Any]:
    """The tiny model with its output layer tied to its input embeddings (as SmolLM2's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rollouts.training.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).float().eval(), tokenizer


def config(
    out: Path, steps: int, parallel: str, lora_r: int = 0, checkpoint_every: int = 1, max_policy_lag: int = 1
) -> GRPOConfig:
    return GRPOConfig(
        output_dir=out,
        num_steps=steps,
        batch_size=2,
        n_samples_per_prompt=4,
        max_tokens=6,
        lr=1e-2,
        lr_schedule="constant",
        checkpoint_every=checkpoint_every,
        max_policy_lag=max_policy_lag,
        seed=3,
        parallel=parallel,  # type: ignore[arg-type]
        lora_r=lora_r,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parallel", default="ddp")
    parser.add_argument("--lora-r", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--max-policy-lag", type=int, default=1)
    parser.add_argument("--tied", action="store_true", help="tie the output layer to the embeddings")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-step", type=int, default=0)
    parser.add_argument("--how", default="raise", choices=("raise", "kill", "kill-in-training"))
    args = parser.parse_args()

    held: dict[str, Any] = {}

    def on_step(result: Any) -> None:
        world = current_world()
        if not (args.out / f"rank{world.rank}.json").exists():  # what this rank's optimizer updates
            params = held["backend"].optimizer.param_groups[0]["params"]
            local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params)
            record = {"world_size": world.size, "param_type": type(params[0]).__name__, "local_numel": local}
            (args.out / f"rank{world.rank}.json").write_text(json.dumps(record))
        held["steps_done"] = result.step + 1
        if args.how == "kill-in-training":
            return
        if world.rank == args.fail_rank and result.step == args.fail_step:
            if args.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure after step {result.step}")

    async def run() -> None:
        model, tokenizer = tied_model() if args.tied else tiny_chat_model(seed=0)
        cfg = config(args.out, args.steps, args.parallel, args.lora_r, args.checkpoint_every, args.max_policy_lag)
        backend, policy = local_policy(model, tokenizer, cfg, name="tiny-dist")
        held["backend"] = backend
        if args.how == "kill-in-training" and current_world().rank == args.fail_rank:
            forward = backend._minibatch_terms

            def dying(*a: Any, **k: Any) -> Any:  # in the middle of step fail-step's training
                if held.get("steps_done", 0) == args.fail_step:
                    os.kill(os.getpid(), signal.SIGKILL)
                return forward(*a, **k)

            backend._minibatch_terms = dying  # type: ignore[method-assign]
        await grpo_train(cfg, PROMPTS, digits, backend=backend, inference=policy, on_step=on_step)
        if current_world().is_main:
            torch.save(backend.model.state_dict(), args.out / "weights.pt")

    trio.run(run)


if __name__ == "__main__":
    main()
