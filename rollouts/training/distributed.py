"""Data-parallel GRPO over `torch.distributed`: one process per device, launched by `torchrun`.

Nothing here is a protocol of our own: the process group is torch's (gloo on CPU, NCCL on CUDA),
initialised from the environment `torchrun` sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT); gradients are all-reduced by `DistributedDataParallel` or parameters, gradients and
optimizer state sharded by FSDP2 (`torch.distributed.fsdp.fully_shard`); the small per-step
exchanges (rewards, token counts, metrics, the resume decision) are `all_reduce`,
`all_gather_object` and `broadcast_object_list`.

* `World`: this process's rank and the number of processes (rank 0 of 1 without torchrun).
  `World.groups(n)` is the block of a step's n prompt groups this rank rolls out: contiguous,
  the same split on every rank, a group never straddling two ranks.
* `init_from_env()`: joins the group torchrun describes (idempotent; a no-op in one process),
  with a bounded timeout, so a rank that stops answering ends the run with an error instead of
  a hang. A rank whose run raises posts its error to the rendezvous store (`report_failure`), and
  the others' collective then fails with `DistributedError` naming that rank and its error.
  The group it joined is destroyed when the process exits (`_leave_at_exit`): a gloo group left
  to the interpreter's finalisation aborts the process about half the time ("terminate called
  without an active exception", exit -6) after a run that succeeded.
* `prepare_training(model, parallel)`: the module a `TorchBackend` runs its training forward
  through (DDP over the model itself; FSDP2 over a sharded copy, the model staying a full replica
  for generation), after broadcasting rank 0's starting weights.
"""

from __future__ import annotations

import atexit
import copy
import os
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, TypeVar

from rollouts.errors import ConfigurationError, RolloutsError

Parallel = Literal["ddp", "fsdp"]
PARALLEL_CHOICES: tuple[str, ...] = ("ddp", "fsdp")
DEFAULT_TIMEOUT_S = 1800.0
"""How long a rank waits for the others at a collective before the run fails. It must cover the
slowest rank's rollouts of a step (the others wait for it), so it is long; set
`ROLLOUTS_DIST_TIMEOUT_S` to change it. A rank that dies closes its connections, and the others
fail at once rather than after the timeout."""
TIMEOUT_ENV = "ROLLOUTS_DIST_TIMEOUT_S"
_FAILED_KEY = "rollouts/failed/{rank}"
_PROCESS_KEY = "rollouts/process/{rank}"
_store: Any = None  # the rendezvous store, when this module initialised the group
_failed = False  # this process reported an error or saw a collective fail: no orderly exit

T = TypeVar("T")


class DistributedError(RolloutsError):
    """Another rank failed or stopped answering: the run cannot go on (the message names the rank
    when it reported its error)."""


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank `rank` of `size` (0 of 1 in one process)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the log, checkpoints and final weights."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def groups(self, num_groups: int) -> range:
        """The indices of the groups (of `num_groups` in the step) this rank rolls out: a
        contiguous block, sizes differing by at most one, the same split on every rank."""
        return range(num_groups * self.rank // self.size, num_groups * (self.rank + 1) // self.size)


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def env_world() -> World | None:
    """The World torchrun describes in the environment, or None when not launched by it."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    try:
        size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ConfigurationError(
            f"RANK={os.environ['RANK']!r} / WORLD_SIZE={os.environ['WORLD_SIZE']!r} are not integers; launch with "
            "torchrun (or unset them to train in one process)"
        ) from None
    return World(rank, size, local)


def current_world() -> World:
    """This process's World: from the initialised process group, else rank 0 of 1."""
    if "torch.distributed" not in sys.modules:
        return World()
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigurationError(f"{TIMEOUT_ENV}={raw!r}: give the collective timeout in seconds, > 0")
    return value


def init_from_env() -> World:
    """Join the process group torchrun describes (gloo on CPU, NCCL when CUDA is available; on
    CUDA this process uses device LOCAL_RANK) with a bounded timeout (`timeout_s()`). A no-op
    when the group is already initialised or there is no torchrun environment / one process."""
    global _store
    world = env_world()
    if world is None or world.size < 2:
        return current_world()
    import torch

    dist = _dist()
    if dist.is_initialized():
        return current_world()
    timeout = timedelta(seconds=timeout_s())
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(world.local_rank)
    # the store torchrun's agent hosts (it outlives a worker that dies), kept to report failures
    store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank, world_size=size, timeout=timeout)
    _store = store
    atexit.register(_leave_at_exit)
    store.set(_PROCESS_KEY.format(rank=rank), f"{socket.gethostname()}:{os.getpid()}")
    return World(rank, size, world.local_rank)


def _leave_at_exit() -> None:
    """Destroy the group `init_from_env` joined while the interpreter is still whole (an `atexit`
    hook): gloo's worker threads otherwise still hold tensors when finalisation starts, and the
    process aborts. Skipped after a failure (`_failed`): destroying a group whose peers are gone
    or mid-collective can block (NCCL), and that process exits with an error anyway."""
    dist = _dist()
    if _failed or not dist.is_initialized():
        return
    dist.destroy_process_group()


def device(world: World) -> Any:
    """The device this rank trains on: cuda:LOCAL_RANK when CUDA is available, else the CPU."""
    import torch

    return torch.device(f"cuda:{world.local_rank}") if torch.cuda.is_available() else torch.device("cpu")


# -- failures ---------------------------------------------------------------------------------


def report_failure(world: World, error: BaseException) -> None:
    """Post this rank's error to the rendezvous store (best effort) so the ranks waiting for it
    can name it."""
    global _failed
    if _store is None or not world.distributed:
        return
    _failed = True
    try:
        _store.set(_FAILED_KEY.format(rank=world.rank), f"{type(error).__name__}: {error}"[:2000])
    except Exception:
        pass


def _process_gone(host_pid: str) -> bool:
    """Whether the process `host:pid` (posted at start) has exited — known only on this host."""
    host, _, pid = host_pid.rpartition(":")
    if host != socket.gethostname() or not os.path.isdir("/proc"):
        return False
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not yet reaped
    except (OSError, ValueError, IndexError):
        return True


def _reported_failures(world: World) -> list[str]:
    """What the other ranks posted (their errors), else which of them (on this host) exited."""
    found = []
    for rank in range(world.size):
        key = _FAILED_KEY.format(rank=rank)
        if rank != world.rank and _store.check([key]):
            found.append(f"rank {rank} failed: {_store.get(key).decode(errors='replace')}")
    if found:
        return found
    for rank in range(world.size):
        key = _PROCESS_KEY.format(rank=rank)
        if rank != world.rank and _store.check([key]):
            process = _store.get(key).decode(errors="replace")
            if _process_gone(process):
                found.append(
                    f"rank {rank} (process {process}) exited without reporting an error (killed? out of memory?)"
                )
    return found


def _failed_ranks(world: World) -> list[str]:
    """`_reported_failures`, waiting up to 5 s for it to say something: a connection closes while
    the dead peer is still exiting, and a raising peer posts its error before it exits."""
    if _store is None:
        return []
    deadline = time.monotonic() + 5.0
    while True:
        try:
            found = _reported_failures(world)
        except Exception:  # the store is unreachable (its host died): fall back to the generic message
            return []
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@contextmanager
def collective(world: World, what: str, *, only_if_a_peer_failed: bool = False) -> Iterator[None]:
    """Run a collective; a failure (a rank that died, raised or timed out) is a DistributedError
    naming the rank(s) that reported an error, else saying none did (killed, out of memory).
    `only_if_a_peer_failed`: for work that is not only communication (a training step, whose
    RuntimeError may be this rank's own, out of memory say), the error is left as it is unless
    another rank is known to have failed."""
    global _failed
    try:
        yield
    except RuntimeError as e:
        if not world.distributed:
            raise
        _failed = True
        reported = _failed_ranks(world)
        if only_if_a_peer_failed and not reported:
            raise
        cause = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        if reported:
            who = "; ".join(reported)
        else:
            who = (
                "no rank reported an error, so one died without one (killed, out of memory) or did not answer "
                f"within the {timeout_s():.0f} s timeout ({TIMEOUT_ENV}); torchrun's summary names the rank that "
                "exited"
            )
        raise DistributedError(
            f"rank {world.rank} of {world.size}: {what} with the other ranks failed ({cause}): {who}"
        ) from None


def all_gather(world: World, value: T, what: str) -> list[T]:
    """Every rank's `value`, in rank order (`[value]` in one process)."""
    if not world.distributed:
        return [value]
    out: list[Any] = [None] * world.size
    with collective(world, what):
        _dist().all_gather_object(out, value)
    return out


def broadcast(world: World, value: T, what: str) -> T:
    """Rank 0's `value` on every rank."""
    if not world.distributed:
        return value
    box = [value if world.is_main else None]
    with collective(world, what):
        _dist().broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def all_reduce_sums(world: World, values: Sequence[float], what: str) -> list[float]:
    """The element-wise sum of `values` over the ranks (float64; `values` itself in one process)."""
    if not world.distributed:
        return list(values)
    import torch

    tensor = torch.tensor(list(values), dtype=torch.float64, device=device(world))
    with collective(world, what):
        _dist().all_reduce(tensor)
    return [float(v) for v in tensor.cpu().tolist()]


def barrier(world: World, what: str) -> None:
    if world.distributed:
        with collective(world, what):
            _dist().barrier()


# -- the training module ----------------------------------------------------------------------


MIN_SHARED_COLUMNS = 16
"""A training batch whose rows share at least this many first tokens runs them once."""


def shared_columns(ids: Any, attn: Any) -> int:
    """How many first columns every row of the right-padded batch `ids` has equal and unpadded,
    leaving each row at least one column of its own."""
    import torch

    same = (ids == ids[:1]).all(dim=0) & (attn > 0).all(dim=0)
    if bool(same.all()):
        return int(ids.shape[1]) - 1
    return min(int(torch.argmin(same.to(torch.int8))), int(ids.shape[1]) - 1)


def selected_logits_module(model: Any, *, share_prefix: bool = False) -> Any:
    """A module whose forward(ids, attention_mask, rows, cols) gives the output layer's logits
    at positions (rows, cols) only — the training forward, as one module DDP / FSDP can wrap.

    With `share_prefix`, the columns all rows share (a GRPO group's prompt; a task's system prompt
    and worked examples) run once, for the first row, and the rest of every row attends to their
    keys and values, copied to each row: the same logits, to float rounding, and their gradient
    flows back through the copies into the one shared pass (`GRPOConfig.share_prefix`). Whole
    rows under gradient checkpointing (which drops the cache the rows attend to); never under
    FSDP (FSDP2 aborts when a sharded layer runs twice in one forward)."""
    import torch

    from rollouts.providers.kv_cache import cache_of, with_cache

    class SelectedLogits(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.model = inner

        def forward(self, ids: Any, attn: Any, rows: Any, cols: Any) -> Any:
            decoder = self.model.get_decoder()
            shared = shared_columns(ids, attn) if share_prefix and ids.shape[0] > 1 else 0
            if shared >= MIN_SHARED_COLUMNS and not _checkpointing(decoder):
                head = decoder(input_ids=ids[:1, :shared], use_cache=True)
                cache = cache_of(head)
                cache.batch_repeat_interleave(int(ids.shape[0]))
                rest = decoder(
                    input_ids=ids[:, shared:], attention_mask=attn, **with_cache(cache), use_cache=True
                ).last_hidden_state
                # the selected positions' hidden states, from the shared pass or the row's rest
                # (no copy of the shared part per row)
                in_head = (cols < shared)[:, None]
                first = head.last_hidden_state[0, cols.clamp(max=shared - 1)]
                picked = torch.where(in_head, first, rest[rows, (cols - shared).clamp(min=0)])
            else:
                hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
                picked = hidden[rows, cols]
            return self.model.get_output_embeddings()(picked).float()

    return SelectedLogits(model)


def _checkpointing(decoder: Any) -> bool:
    return any(getattr(layer, "gradient_checkpointing", False) for layer in getattr(decoder, "layers", ()))


@dataclass(frozen=True)
class Prepared:
    """What `prepare_training` built: `module` runs the training forward; `trained` holds the
    parameters the optimizer updates (the model itself under DDP, its sharded copy under FSDP)."""

    module: Any
    trained: Any
    parallel: str
    world: World


def _broadcast_start(model: Any, world: World) -> None:
    """Every rank starts from rank 0's weights (and buffers)."""
    import torch

    dist = _dist()
    with torch.no_grad(), collective(world, "broadcasting the starting weights"):
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def prepare_training(model: Any, parallel: str, world: World, *, share_prefix: bool = False) -> Prepared:
    """The training module over `model` (see `Prepared`). `parallel`: "ddp" all-reduces
    gradients (each rank holds the whole model and optimizer state), "fsdp" shards parameters,
    gradients and optimizer state over the ranks (`fully_shard` per decoder layer, then the rest)."""
    if parallel not in PARALLEL_CHOICES:
        raise ConfigurationError(f"parallel must be one of {', '.join(PARALLEL_CHOICES)}, got {parallel!r}")
    if not world.distributed:
        return Prepared(selected_logits_module(model, share_prefix=share_prefix), model, parallel, world)
    _broadcast_start(model, world)
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        dev = device(world)
        ids = [dev.index] if dev.type == "cuda" else None
        module = selected_logits_module(model, share_prefix=share_prefix)
        wrapped = DistributedDataParallel(module, device_ids=ids, gradient_as_bucket_view=True)
        return Prepared(wrapped, model, parallel, world)
    from torch.distributed.fsdp import fully_shard

    sharded = copy.deepcopy(model)
    for p in sharded.parameters():
        p.grad = None
    for layer in getattr(sharded.get_decoder(), "layers", ()):
        fully_shard(layer)
    root = selected_logits_module(sharded, share_prefix=False)
    fully_shard(root)
    return Prepared(root, sharded, parallel, world)


@contextmanager
def gradient_sync(prepared: Prepared, enabled: bool) -> Iterator[None]:
    """Within: backward passes accumulate locally (`enabled=False`) or reduce over the ranks."""
    if not prepared.world.distributed or enabled:
        if prepared.parallel == "fsdp" and prepared.world.distributed:
            prepared.module.set_requires_gradient_sync(True)
        yield
        return
    if prepared.parallel == "ddp":
        with prepared.module.no_sync():
            yield
        return
    prepared.module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        prepared.module.set_requires_gradient_sync(True)


def clip_grad_norm(prepared: Prepared, params: list[Any], max_norm: float) -> float:
    """Clip the gradient's global norm to `max_norm`; the norm before clipping (over every
    shard under FSDP)."""
    import torch

    if prepared.parallel != "fsdp" or not prepared.world.distributed:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params]
    with collective(prepared.world, "computing the gradient norm"):
        norm = torch.nn.utils.get_total_norm(grads)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)


def _full(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def copy_to_replica(prepared: Prepared, replica: Any) -> None:
    """FSDP: copy the sharded copy's updated parameters, gathered whole, into the full model
    that generation uses (every rank). A no-op otherwise (the model is the trained one)."""
    if prepared.trained is replica:
        return
    import torch

    served = dict(replica.named_parameters())
    with torch.no_grad(), collective(prepared.world, "gathering the updated weights"):
        for name, p in prepared.trained.named_parameters():
            served[name].copy_(_full(p.detach()))


def full_optimizer_state(prepared: Prepared, optimizer: Any) -> Any:
    """The optimizer's state_dict with every sharded tensor gathered whole: the format of a
    one-process run (so a checkpoint resumes at any world size). Collective under FSDP."""
    state = optimizer.state_dict()
    if prepared.trained is None or not prepared.world.distributed or prepared.parallel != "fsdp":
        return state
    with collective(prepared.world, "gathering the optimizer state"):
        state["state"] = {i: {k: _full(v) for k, v in s.items()} for i, s in state["state"].items()}
    return state


def load_full_state(prepared: Prepared, replica: Any, model_state: Any, optimizer: Any, optim_state: Any) -> None:
    """Load whole (one-process format) optimizer state, and under FSDP the weights (already
    loaded into `replica`) into this rank's shards of the sharded copy (collective)."""
    import torch

    if optim_state is None or prepared.trained is replica:
        if optim_state is not None:
            optimizer.load_state_dict(optim_state)
        return
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = list(prepared.trained.parameters())
    with torch.no_grad(), collective(prepared.world, "sharding the checkpoint"):
        for name, p in prepared.trained.named_parameters():
            if name in model_state:  # (frozen LoRA base weights are not in a checkpoint)
                p.copy_(distribute_tensor(model_state[name].to(p.device), p.device_mesh, p.placements))
        for index, entry in optim_state["state"].items():
            p = params[int(index)]
            for key, value in list(entry.items()):
                if isinstance(p, DTensor) and torch.is_tensor(value) and value.shape == p.shape and value.dim() > 0:
                    entry[key] = distribute_tensor(value.to(p.device), p.device_mesh, p.placements)
    optimizer.load_state_dict(optim_state)
