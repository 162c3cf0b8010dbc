"""Overlapped rollouts with bounded staleness (`GRPOConfig.max_policy_lag`).

With `max_policy_lag = 0` generation and training strictly alternate: the rollouts of step k
are generated (inline, by the training loop) after step k - 1 has trained, by the policy that
step produced. With `max_policy_lag >= 1`, as soon as step k's rollouts are in, the rollouts of
step k + 1 start in a trio task and are generated while step k trains — by the policy of before
step k's update, one step old. The clipped ratio exp(log π - log π_rollout) uses the sampler's
own log-probs (kept in every `TrainingSample`), so the update is the correct off-policy one.

When generation starts at all is a function of the configuration, never of timing, so a run is
reproducible (`policy_version` of each step is fixed):

* the rollouts of step k + 1 are generated during step k's training unless step k is the last,
  writes a checkpoint, or is followed by a held-out evaluation (`grpo_train(heldout=...)`, which
  must see step k's weights with nothing else generating); a checkpoint is a drain point — the
  next step's rollouts are generated afterwards, by the checkpointed weights — so a run resumed
  from it generates exactly what the uninterrupted run did;
* one step ahead at most: a larger `max_policy_lag` is accepted as a bound but this scheduler
  never exceeds a lag of 1 (one prefetched step already keeps the trainer busy).

The inference backend is brought up to date (`InferenceBackend.sync`) just before a generation
starts with weights it does not have yet; never while one runs. An in-process policy must then
generate from its own copy of the weights (`InProcessPolicy(snapshot=True)`, what `local_policy`
builds when `max_policy_lag > 0`): sharing the trainer's module would sample from weights
changing under the sampler.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import trio

from rollouts._exception_groups import single_error

T = TypeVar("T")


@dataclass
class _Generation(Generic[T]):
    step: int
    version: int
    done: trio.Event = field(default_factory=trio.Event)
    result: T | None = None
    error: Exception | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Generated(Generic[T]):
    """A step's rollouts, the policy version (training steps applied) that generated them, and
    how long generating them took."""

    step: int
    result: T
    version: int
    seconds: float


class RolloutScheduler(Generic[T]):
    """Runs `generate(step)` inline or ahead in a task of its nursery (see the module docstring);
    at most one generation is ahead at a time."""

    def __init__(self, nursery: trio.Nursery, generate: Callable[[int], Awaitable[T]]) -> None:
        self._nursery = nursery
        self._generate = generate
        self._ahead: _Generation[T] | None = None

    def start_ahead(self, step: int, version: int) -> None:
        """Start generating `step`'s rollouts in the background with policy `version`."""
        assert self._ahead is None, f"step {self._ahead.step}'s rollouts are already being generated ahead"
        self._ahead = _Generation(step, version)
        self._nursery.start_soon(self._run, self._ahead, name=f"rollouts of step {step}")

    async def take(self, step: int, version: int) -> Generated[T]:
        """`step`'s rollouts: those generated ahead, else generated now with policy `version`."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            t0 = time.perf_counter()
            result = await self._generate(step)
            return Generated(step, result, version, time.perf_counter() - t0)
        assert ahead.step == step, f"rollouts of step {ahead.step} were generated ahead, step {step} asked for"
        await ahead.done.wait()
        if ahead.error is not None:
            raise ahead.error
        assert ahead.result is not None
        return Generated(step, ahead.result, ahead.version, ahead.seconds)

    async def _run(self, generation: _Generation[T]) -> None:
        t0 = time.perf_counter()
        try:
            generation.result = await self._generate(generation.step)
        except Exception as e:  # handed to the training loop by take(), raised there
            generation.error = e
        finally:
            generation.seconds = time.perf_counter() - t0
            generation.done.set()


@asynccontextmanager
async def open_rollout_scheduler(generate: Callable[[int], Awaitable[T]]) -> AsyncIterator[RolloutScheduler[T]]:
    """A RolloutScheduler whose background generation is cancelled when the block exits; an
    error of the block (a TrainingError, ...) comes out as itself, not wrapped in a group."""
    try:
        async with trio.open_nursery() as nursery:
            yield RolloutScheduler(nursery, generate)
    except BaseExceptionGroup as group:
        single = single_error(group)
        if single is group:
            raise
        raise single from None


def overlaps_after(
    step: int, *, num_steps: int, checkpoint_every: int, max_policy_lag: int, heldout_every: int | None = None
) -> bool:
    """Whether step `step + 1`'s rollouts are generated while `step` trains: with a lag allowed,
    unless `step` is the last, writes a checkpoint (a drain point, so resumes are exact) or is
    followed by a held-out evaluation (which must see this step's weights, with nothing else
    generating)."""
    if max_policy_lag < 1 or step + 1 >= num_steps:
        return False
    if heldout_every is not None and (step + 1) % heldout_every == 0:
        return False
    return (step + 1) % checkpoint_every != 0
