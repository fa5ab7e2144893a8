"""What both batchers share: an exact resume and the checks of their arguments.

A batcher is deterministic: the order of an epoch is a pure function of the batcher's
settings and the epoch number, so ``state_dict()`` needs to record only the epoch and the
number of batches already handed out, and a batcher restored from a state dict continues
with exactly the batches an uninterrupted run would have produced.

Iteration contract: ``for batch in batcher`` runs to the end of the current epoch,
starting from the saved position; when the loop finishes the batcher moves on to the next
epoch. Breaking out of the loop keeps the position, so the next ``iter`` resumes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rnnkit.errors import CheckpointError, ConfigError, DataError

__all__ = ["IterableBatches", "resumable_batches"]


def _as_ids(ids: Any, what: str) -> np.ndarray:
    """A 1-D integer numpy array, or a ``DataError`` saying what is wrong with ``what``."""
    if isinstance(ids, Tensor):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise DataError(f"{what} must be a 1-D array of token ids, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise DataError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise DataError(f"{what} holds a negative token id ({int(arr.min())})")
    return arr


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class _Resumable:
    """Epoch / position bookkeeping shared by the batchers (see the module docstring)."""

    epoch: int
    position: int

    def __len__(self) -> int:
        raise NotImplementedError

    def _batch(self, index: int) -> Any:
        raise NotImplementedError

    def _start_epoch(self) -> None:
        """Hook: prepare the order of ``self.epoch``."""

    def __iter__(self) -> Iterator[Any]:
        if self.position >= len(self):  # state saved right after an epoch's last batch
            self.epoch += 1
            self.position = 0
        self._start_epoch()
        while self.position < len(self):
            index = self.position
            # Count the batch as consumed before handing it out: a state dict saved while
            # the caller works on batch i resumes at batch i + 1.
            self.position += 1
            yield self._batch(index)
        self.epoch += 1
        self.position = 0

    def _check_state(self, state: dict[str, Any], expected: dict[str, Any]) -> None:
        for key, value in expected.items():
            if key not in state:
                raise CheckpointError(f"batcher state lacks {key!r}")
            if state[key] != value:
                raise CheckpointError(
                    f"batcher state has {key}={state[key]!r} but this batcher has {value!r}"
                )
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or epoch < 0:
            raise CheckpointError(f"batcher state has an invalid epoch {epoch!r}")
        if not isinstance(position, int) or not 0 <= position <= len(self):
            raise CheckpointError(f"batcher state has an invalid position {position!r}")
        self.epoch, self.position = epoch, position


class IterableBatches(_Resumable):
    """Any re-iterable with a length (a ``torch.utils.data.DataLoader``, a list of
    batches) as a resumable batcher: one pass of it is an epoch.

    ``state_dict()`` records the epoch, the batches handed out and the CPU random state at
    the epoch's start. A restored one replays that epoch from the same random state (a
    shuffling ``DataLoader`` draws the same order) and skips the batches already trained
    on, so the resume is exact wherever the batches are a function of that state: not
    where loading a batch draws random numbers of this process (augmentation at
    ``num_workers=0``), draws from a ``generator`` of the loader's own, or with
    ``persistent_workers=True`` (whose later epochs draw their order from another point of
    that state). A sampler with ``set_epoch`` (``DistributedSampler``) is given the epoch
    before each pass. The batches skipped on a resume are loaded and dropped.

    >>> b = IterableBatches([[1], [2], [3]])
    >>> it = iter(b); next(it), next(it)
    ([1], [2])
    >>> again = IterableBatches([[1], [2], [3]]); again.load_state_dict(b.state_dict())
    >>> list(again), again.epoch
    ([[3]], 1)
    """

    def __init__(self, batches: Any) -> None:
        try:
            size = len(batches)
        except TypeError:
            raise ConfigError(
                f"batches ({type(batches).__name__}) has no length: the Trainer needs the "
                "batches of an epoch (len()); an IterableDataset's DataLoader has none, "
                "a map-style Dataset's has"
            ) from None
        if size < 1:
            raise ConfigError(f"batches ({type(batches).__name__}) is empty")
        self.batches = batches
        self.epoch = 0
        self.position = 0
        self._epoch_rng: Tensor | None = None  # the CPU generator's state at the epoch's start

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        if self.position >= len(self):  # state saved right after an epoch's last batch
            self.epoch += 1
            self.position = 0
        skip = self.position
        now = torch.get_rng_state()
        if skip and self._epoch_rng is not None:
            torch.set_rng_state(self._epoch_rng)  # the epoch's draws (its order) again
        else:
            self._epoch_rng = now
        set_epoch = getattr(getattr(self.batches, "sampler", None), "set_epoch", None)
        if callable(set_epoch):  # a DistributedSampler's order of this epoch
            set_epoch(self.epoch)
        # A DataLoader draws its workers' seed when made and its order at the first batch.
        it = iter(self.batches)
        first = next(it, _END)
        if skip:
            torch.set_rng_state(now)
        pending = [] if first is _END else [first]
        for index, batch in enumerate(itertools.chain(pending, it)):
            if index < skip:
                continue
            if index >= len(self):
                raise DataError(
                    f"batches ({type(self.batches).__name__}) gave more than its length, "
                    f"{len(self)}, in one pass"
                )
            self.position = index + 1  # consumed before it is handed out (module docstring)
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        rng = None if self._epoch_rng is None else self._epoch_rng.tolist()
        return {
            "kind": "iterable",
            "batches": len(self),
            "epoch": self.epoch,
            "position": self.position,
            "epoch_rng": rng,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_state(state, {"kind": "iterable", "batches": len(self)})
        rng = state.get("epoch_rng")
        if rng is not None and not (
            isinstance(rng, list) and all(isinstance(v, int) and 0 <= v < 256 for v in rng)
        ):
            raise CheckpointError("batcher state has an invalid epoch_rng")
        self._epoch_rng = None if rng is None else torch.tensor(rng, dtype=torch.uint8)


_END = object()


def resumable_batches(batches: Any) -> Any:
    """``batches`` itself where it is a resumable batcher (``__iter__``, ``__len__``,
    ``epoch``, ``position``, ``state_dict``, ``load_state_dict``: rnnkit's batchers),
    else :class:`IterableBatches` over it."""
    protocol = ("__len__", "epoch", "position", "state_dict", "load_state_dict")
    if all(hasattr(batches, name) for name in protocol):
        return batches
    return IterableBatches(batches)
