"""`ddp2_sec_per_step` of benchmarks/grpo.py: its single-turn run, in 2 DDP processes.

The same configuration as `run_ours` in benchmarks/grpo.py (model, prompts, reward, steps,
prompts per step, group size, tokens, learning rate, threads per process), launched with
`python -m torch.distributed.run --standalone --nproc-per-node 2` (gloo on CPU): each process
rolls out half of each step's prompt groups and the gradients are all-reduced. The held-out
measurements of the single-process run are left out (they are not training). Rank 0 writes the
figures to the file given by --result.

    python benchmarks/grpo.py --only-ddp2        # this part alone (what grpo.py runs by default too)

Keys: ddp2_sec_per_step, ddp2_rollout_sec_per_step, ddp2_train_sec_per_step, ddp2_reward_curve
(the same rollouts as the single-process run: equal to its reward_curve), ddp2_processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROCESSES = 2
TIMEOUT_S = 3600.0


def _worker(argv: list[str]) -> None:
    """One rank (under torchrun): the single-turn run of benchmarks/grpo.py."""
    import grpo as bench
    import torch
    import trio

    from rollouts.training import grpo_train, load_causal_lm, local_policy
    from rollouts.training.distributed import current_world
    from rollouts.training.tiny import tiny_chat_model

    at = argv.index("--result")
    result_path = Path(argv[at + 1])
    args = bench.parse_args(argv[:at] + argv[at + 2 :])
    torch.set_num_threads(args.threads)
    model, tokenizer = tiny_chat_model(seed=0) if args.model == "tiny" else load_causal_lm(args.model)
    rows, _ = bench.arithmetic_split(args.max_operand, args.heldout, seed=args.seed, example=bench.EXAMPLE_PAIR)

    async def run() -> dict[str, Any] | None:
        with tempfile.TemporaryDirectory() as tmp:
            config = bench.single_turn_config(args, Path(tmp), parallel="ddp")
            backend, policy = local_policy(model, tokenizer, config, name="bench-ddp2")

            def show(r: Any) -> None:
                if current_world().is_main:
                    print(f"ddp2: step {r.step} reward {r.reward_mean:.3f} {r.seconds:.1f}s", file=sys.stderr)

            result = await grpo_train(config, rows, bench.shaped_sum, backend=backend, inference=policy, on_step=show)
            if not current_world().is_main:
                return None
            n = len(result.steps)
            figures = {
                "ddp2_processes": current_world().size,
                "ddp2_sec_per_step": sum(s.seconds for s in result.steps) / n,
                "ddp2_rollout_sec_per_step": sum(s.rollout_seconds for s in result.steps) / n,
                "ddp2_train_sec_per_step": sum(s.train_seconds for s in result.steps) / n,
                "ddp2_reward_curve": [round(s.reward_mean, 4) for s in result.steps],
            }
            return figures

    figures = trio.run(run)
    if figures is not None:
        result_path.write_text(json.dumps(figures))


def run_ddp2(argv: list[str]) -> dict[str, Any]:
    """Run the 2-process part with benchmarks/grpo.py's arguments `argv`; its figures."""
    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ddp2.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={PROCESSES}"]
        command += [str(Path(__file__).resolve()), *argv, "--result", str(out)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]),
        }
        proc = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=TIMEOUT_S)
        finally:
            try:  # torchrun and its workers, whatever happened
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        if code != 0 or not out.exists():
            raise RuntimeError(f"the 2-process DDP run failed (torchrun exit code {code}); its output is above")
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


if __name__ == "__main__":
    _worker(sys.argv[1:])
