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

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch import Tensor

from rnnkit.errors import CheckpointError, ConfigError, DataError


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
