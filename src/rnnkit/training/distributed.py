"""Data-parallel training on ``torch.distributed`` (gloo on CPU, NCCL on GPU).

Launch with torchrun, e.g. ``torchrun --nproc-per-node 2 -m rnnkit train …``; the usual
torchrun flags (``--nnodes``, ``--rdzv-endpoint``) take it to several machines.

* ``--batch-size`` is the GLOBAL batch: each of the W processes takes its own B/W rows of
  every batch (for streams: its own streams). So a run gives the same weights whatever W
  is (up to float32 reduction order), and ``--resume`` works with another number of
  processes — the data position is that of the global batch.
* Gradients are averaged by ``DistributedDataParallel``; each process scales its token-mean
  loss by its share of the global tokens first, so the averaged gradient is the gradient of
  the global token mean even when processes hold different numbers of tokens.
* Only rank 0 writes checkpoints, logs and reports; every rank validates on the whole
  validation set, so early stopping and learning-rate decisions agree without messages.
* A process that dies (killed, out of memory) breaks the others' next collective: gloo
  and NCCL raise a bare ``RuntimeError`` there, which :func:`peer_lost` turns into one
  line (:class:`PeerLost`); the run keeps its latest snapshot, resumable with any number
  of processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rnnkit.errors import ConfigError, RnnkitError

__all__ = [
    "DistContext",
    "PeerLost",
    "ShardedBatches",
    "StepModule",
    "init_distributed",
    "launched_processes",
    "peer_lost",
    "peer_lost_said",
    "shutdown_distributed",
]


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in the group (a single process by default)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # where the collectives' own tensors live: NCCL reduces CUDA tensors only
    device: str = "cpu"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, t: Tensor, dim: int = 0) -> Tensor:
        """This process's contiguous share of ``t`` along ``dim`` (the global batch)."""
        if not self.enabled:
            return t
        if t.shape[dim] % self.world_size:
            raise ConfigError(
                f"{t.shape[dim]} rows cannot be split evenly over {self.world_size} processes"
            )
        per = t.shape[dim] // self.world_size
        return t.narrow(dim, self.rank * per, per)

    def gather_rows(self, t: Tensor, dim: int = 0) -> Tensor:
        """Concatenate every process's ``t`` along ``dim`` in rank order (all ranks)."""
        if not self.enabled:
            return t
        parts = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts, dim=dim)

    def all_sum(self, *values: float) -> list[float]:
        """Sum numbers over all processes (identity for one process)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()


class PeerLost(RnnkitError):
    """Another process of a distributed run is gone; this one stops (exit status 1).

    ``after_peer``: the error is the consequence of another process's failure, which that
    process says itself (the command line leaves it the time to: ``rnnkit.app.cli.ranks``).
    """

    exit_code = 1
    after_peer = True


def launched_processes() -> int:
    """How many processes the launcher (torchrun: ``WORLD_SIZE``) started; 1 without one."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        raise ConfigError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} in the environment is not a number"
        ) from None


# What gloo and NCCL say when the other end of a collective has gone away. Not any NCCL
# error: "unhandled system error" (/dev/shm too small in a container) or "invalid usage"
# fail in EVERY process alike, and each would blame another process for it.
_BACKEND_WORDS = (
    "gloo",
    "connection reset",
    "connection closed",
    "broken pipe",
    "remote process exited",  # ncclRemoteError
    "watchdog caught collective operation timeout",  # ProcessGroupNCCL's watchdog
)


def peer_lost(exc: BaseException, ctx: DistContext) -> PeerLost | None:
    """The one-line error for ``exc`` when it is a collective failing in a distributed
    run (another process died); None for anything else, which stays the error it is."""
    if not ctx.enabled or not isinstance(exc, RuntimeError):
        return None
    text = str(exc).strip()
    if not any(word in text.lower() for word in _BACKEND_WORDS):
        return None
    # gloo's text starts with its source position and ends in advice: keep the reason
    reason = text.splitlines()[0].split("] ", 1)[-1].split(". ", 1)[0][:160]
    return PeerLost(
        f"process {ctx.rank} of {ctx.world_size}: another process of this distributed run "
        f"is gone ({reason}); see torchrun's report for which and why. The run keeps its "
        "latest snapshot: continue it with --resume (any number of processes)"
    )


@contextmanager
def peer_lost_said(ctx: DistContext) -> Iterator[None]:
    """Within it, a collective broken by a process gone is :class:`PeerLost` (one line)
    instead of the backend's ``RuntimeError``; any other error stays what it is.

    >>> with peer_lost_said(DistContext(0, 2)):
    ...     raise RuntimeError("Connection closed by peer [127.0.0.1]:38789")
    Traceback (most recent call last):
    ...
    rnnkit.training.distributed.PeerLost: process 0 of 2: another process of this \
distributed run is gone (Connection closed by peer [127.0.0.1]:38789); see torchrun's \
report for which and why. The run keeps its latest snapshot: continue it with --resume \
(any number of processes)
    """
    try:
        yield
    except RuntimeError as exc:
        lost = peer_lost(exc, ctx)
        if lost is None:
            raise
        raise lost from None


def init_distributed(device_type: str = "cpu") -> DistContext:
    """Join the process group torchrun describes in the environment (``WORLD_SIZE``, …).

    One process (no ``WORLD_SIZE`` or 1) needs no group and gets the default context.
    """
    world = launched_processes()
    if world <= 1:
        return DistContext()
    if not dist.is_available():
        raise ConfigError("torch.distributed is not available in this torch build")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = "cpu"
    if device_type == "cuda":
        # each process its own GPU (LOCAL_RANK): --device cuda then means this one, and
        # NCCL refuses two ranks on one device
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK={local_rank} but this machine shows "
                f"{torch.cuda.device_count()} GPU(s) to the process: start at most one "
                "process per GPU (--nproc-per-node), or --device cpu"
            )
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, device)


def shutdown_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _shard(value: Any, ctx: DistContext, option: str | None = None) -> Any:
    if isinstance(value, Tensor) and value.dim() >= 1:
        if value.shape[0] % ctx.world_size:
            # a Python caller made the batches: there is no option to name
            remedy = f"choose {option}" if option else "give batches of a number of rows"
            raise ConfigError(
                f"a batch of {value.shape[0]} rows cannot be split evenly over "
                f"{ctx.world_size} processes; {remedy} divisible by their number"
            )
        return ctx.rows(value, dim=0)
    return value


class ShardedBatches:
    """This process's rows of every batch of a resumable batcher (position is global).

    ``option``: the command line's option that sets the rows (``--batch-size``), for a
    batch that cannot be split evenly; None (from Python): the batches are named.
    """

    def __init__(self, batches: Any, ctx: DistContext, option: str | None = None) -> None:
        self.inner = batches
        self.ctx = ctx
        self.option = option

    def __iter__(self):
        for batch in self.inner:
            fields = {k: _shard(v, self.ctx, self.option) for k, v in batch._asdict().items()}
            yield type(batch)(**fields)

    def __len__(self) -> int:
        return len(self.inner)

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @property
    def position(self) -> int:
        return self.inner.position

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)


class StepModule(nn.Module):
    """``forward(batch, carry)`` runs a task's step function, so DDP sees one forward."""

    def __init__(self, model: nn.Module, step_fn: Any) -> None:
        super().__init__()
        self.model = model
        self.step_fn = step_fn

    def forward(self, batch: Any, carry: Any) -> NamedTuple:
        return self.step_fn(self.model, batch, carry)
