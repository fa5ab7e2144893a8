"""Batches for training: length-bucketed, padded batches of separate sequences, and (from
``rnnkit.data.streams``, importable here as well) parallel streams cut into segments for
truncated BPTT over a long text.

Both batchers are deterministic and resumable: ``state_dict()`` records the epoch and the
number of batches already handed out, and the order of an epoch is a pure function of
``(seed, epoch)``, so a batcher restored from a state dict continues with exactly the
batches an uninterrupted run would have produced (``rnnkit.data.batch_resume``).

Iteration contract (both batchers): ``for batch in batcher`` runs to the end of the current
epoch, starting from the saved position; when the loop finishes the batcher moves on to the
next epoch. Breaking out of the loop keeps the position, so the next ``iter`` resumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from rnnkit.data.batch_resume import _as_ids, _positive, _Resumable
from rnnkit.data.streams import StreamBatch, StreamBatcher
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "SequenceBatch",
    "SequenceBatcher",
    "StreamBatch",
    "StreamBatcher",
    "lm_pairs",
    "pad_sequences",
    "to_device",
]


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """A batch's tensor on ``device``. To a GPU it goes from pinned memory without
    waiting: a plain ``tensor.to("cuda")`` from the host copies synchronously, i.e. waits
    for every kernel queued before it (PyTorch's allocator keeps the pinned copy until
    the transfer is done). Elsewhere, ``tensor.to(device)``.

    >>> t = torch.zeros(2)
    >>> to_device(t, "cpu") is t
    True
    """
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def lm_pairs(seq_ids: Any, bos: int, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forcing pair of one sequence: inputs ``[bos] + w``, targets ``w + [eos]``.

    Args:
        seq_ids: ``(n,)`` token ids ``w`` (no specials).
        bos: start symbol id (``<s>`` = 2 in a :class:`~rnnkit.data.vocab.Vocabulary`).
        eos: end symbol id (``</s>`` = 3).

    Returns:
        ``(inputs, targets)``, each ``(n + 1,)`` int64.

    >>> x, y = lm_pairs([7, 8], bos=2, eos=3)
    >>> x.tolist(), y.tolist()
    ([2, 7, 8], [7, 8, 3])
    """
    w = _as_ids(seq_ids, "the sequence").astype(np.int64)
    return np.concatenate([[bos], w]).astype(np.int64), np.concatenate([w, [eos]]).astype(np.int64)


def pad_sequences(sequences: Sequence[np.ndarray], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad 1-D id arrays into one batch.

    Args:
        sequences: ``B`` arrays of lengths ``L_i``.
        pad_id: the filler id (``<pad>`` = 0).

    Returns:
        ``(ids, mask)``: ``(B, T)`` int64 and ``(B, T)`` bool, ``T = max L_i``.

    >>> ids, mask = pad_sequences([np.array([5, 6]), np.array([7])])
    >>> ids.tolist(), mask.tolist()
    ([[5, 6], [7, 0]], [[True, True], [True, False]])
    """
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    T = int(lengths.max(initial=0))
    ids = np.full((len(sequences), T), pad_id, dtype=np.int64)  # (B, T)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = seq
    mask = np.arange(T)[None, :] < lengths[:, None]  # (B, T)
    return torch.from_numpy(ids), torch.from_numpy(mask)


class SequenceBatch(NamedTuple):
    """A padded batch of separate sequences.

    Attributes:
        inputs: ``(B, T)`` int64 ids, padded with ``pad_id`` after each sequence's end.
        targets: ``(B, T)`` int64 ids aligned with ``inputs`` (padded likewise), or None
            when the batcher was built without targets.
        mask: ``(B, T)`` bool, true at real positions.
        lengths: ``(B,)`` int64 real lengths.
        indices: ``(B,)`` int64 positions of these examples in the batcher's input list
            (to fetch per-example labels).
    """

    inputs: Tensor
    targets: Tensor | None
    mask: Tensor
    lengths: Tensor
    indices: Tensor


class SequenceBatcher(_Resumable):
    """Padded batches of separate sequences, grouped by length to waste little padding.

    Each epoch: shuffle the examples (if ``shuffle``), cut the order into chunks of
    ``chunk_size`` examples, sort each chunk by length (if ``bucket``), cut into batches of
    ``batch_size``, and shuffle the order of the batches (if ``shuffle``). The chunk size is
    a multiple of ``batch_size``, so only the very last batch of an epoch can be smaller,
    and every example appears exactly once per epoch (unless ``drop_last``). The order of
    epoch ``e`` depends only on ``(seed, e)``.

    Args:
        inputs: ``n`` 1-D integer arrays, one per example (non-empty).
        targets: optional ``n`` arrays of the same lengths as ``inputs`` (next tokens for a
            language model, tags for a tagger); see :func:`lm_pairs`.
        batch_size: examples per batch.
        shuffle: random order per epoch (else the given order, bucketed within chunks).
        seed: seed of the per-epoch order.
        bucket: sort by length within chunks.
        chunk_size: examples per sorting chunk; default ``50 * batch_size``. Larger chunks
            pad less but make batches less random.
        drop_last: drop the smaller last batch.
        pad_id: filler id for ``inputs`` and ``targets`` (``<pad>`` = 0).

    >>> seqs = [np.arange(n) for n in (3, 1, 4, 1, 5, 2)]
    >>> batcher = SequenceBatcher(seqs, batch_size=2, seed=0)
    >>> len(batcher), sorted(i for b in batcher for i in b.indices.tolist())
    (3, [0, 1, 2, 3, 4, 5])
    >>> round(batcher.padding_efficiency(epoch=0), 3)  # lengths paired (1,1) (2,3) (4,5)
    0.889
    """

    def __init__(
        self,
        inputs: Sequence[Any],
        targets: Sequence[Any] | None = None,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket: bool = True,
        chunk_size: int | None = None,
        drop_last: bool = False,
        pad_id: int = 0,
    ) -> None:
        self.batch_size = _positive("batch_size", batch_size)
        if chunk_size is None:
            chunk_size = 50 * self.batch_size
        chunk_size = _positive("chunk_size", chunk_size)
        # Round up to whole batches: only the epoch's last batch may then be partial.
        self.chunk_size = -(-chunk_size // self.batch_size) * self.batch_size
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed) % 2**64  # numpy's generators take 0 … 2^64 - 1; -1 as torch reads it
        self.shuffle, self.bucket, self.drop_last = bool(shuffle), bool(bucket), bool(drop_last)
        self.pad_id = int(pad_id)

        if len(inputs) == 0:
            raise DataError("no sequences to batch")
        self._inputs = [_as_ids(s, f"sequence {i}") for i, s in enumerate(inputs)]
        self.lengths = np.array([len(s) for s in self._inputs], dtype=np.int64)
        empty = np.flatnonzero(self.lengths == 0)
        if empty.size:
            raise DataError(f"sequence {int(empty[0])} is empty")
        self._targets: list[np.ndarray] | None = None
        if targets is not None:
            if len(targets) != len(inputs):
                raise DataError(f"{len(targets)} target sequences for {len(inputs)} inputs")
            self._targets = [_as_ids(t, f"target sequence {i}") for i, t in enumerate(targets)]
            for i, (x, y) in enumerate(zip(self._inputs, self._targets, strict=True)):
                if len(x) != len(y):
                    raise DataError(
                        f"sequence {i}: {len(y)} targets for {len(x)} inputs (must be equal)"
                    )
        n = len(self._inputs)
        self._num_batches = n // self.batch_size if drop_last else -(-n // self.batch_size)
        if self._num_batches == 0:
            raise DataError(f"{n} sequences cannot fill one batch of {self.batch_size}")
        self.epoch = 0
        self.position = 0
        self._plan_epoch: int | None = None
        self._plan: list[np.ndarray] = []

    def __len__(self) -> int:
        return self._num_batches

    def plan(self, epoch: int) -> list[np.ndarray]:
        """The batches of ``epoch`` as arrays of example indices (a pure function of
        ``(seed, epoch)``).

        >>> SequenceBatcher([[1], [1, 2], [1]], batch_size=2, shuffle=False).plan(0)
        [array([0, 2]), array([1])]
        """
        if self._plan_epoch == epoch:
            return self._plan
        n = len(self._inputs)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        if self.bucket:
            chunks = [order[i : i + self.chunk_size] for i in range(0, n, self.chunk_size)]
            # Stable sort: equal lengths keep the (shuffled) chunk order.
            order = np.concatenate([c[np.argsort(self.lengths[c], kind="stable")] for c in chunks])
        batches = [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]
        batches = batches[: self._num_batches]  # drop_last drops the partial tail
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._plan_epoch, self._plan = epoch, batches
        return batches

    def padding_efficiency(self, epoch: int | None = None) -> float:
        """Real tokens / padded tokens over the batches of ``epoch`` (default: the current one);
        1.0 means no padding at all.

        >>> seqs = [np.ones(n, dtype=int) for n in (1, 9, 1, 9)]
        >>> b = SequenceBatcher(seqs, batch_size=2, bucket=False, shuffle=False)
        >>> round(b.padding_efficiency(), 3)  # 20 real tokens in 2 batches of 2 x 9
        0.556
        """
        batches = self.plan(self.epoch if epoch is None else epoch)
        real = sum(int(self.lengths[b].sum()) for b in batches)
        padded = sum(len(b) * int(self.lengths[b].max()) for b in batches)
        return real / padded

    def _start_epoch(self) -> None:
        self.plan(self.epoch)

    def _batch(self, index: int) -> SequenceBatch:
        idx = self.plan(self.epoch)[index]
        inputs, mask = pad_sequences([self._inputs[i] for i in idx], self.pad_id)
        targets = None
        if self._targets is not None:
            targets, _ = pad_sequences([self._targets[i] for i in idx], self.pad_id)
        return SequenceBatch(
            inputs=inputs,
            targets=targets,
            mask=mask,
            lengths=torch.from_numpy(self.lengths[idx].copy()),
            indices=torch.from_numpy(idx.astype(np.int64)),
        )

    def state_dict(self) -> dict[str, Any]:
        """Epoch, position and the settings that fix the order (plain ints: JSON-safe). The RNG
        needs no saving: each epoch's generator is rebuilt from ``(seed, epoch)``.

        >>> b = SequenceBatcher([[1], [2], [3]], batch_size=2, seed=7)
        >>> b.state_dict()["seed"], b.state_dict()["position"]
        (7, 0)
        """
        return {"epoch": self.epoch, "position": self.position, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a state from a batcher with other settings or data size
        is a ``CheckpointError`` (it would not reproduce the same order)."""
        self._check_state(state, self._settings())

    def _settings(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "num_sequences": len(self._inputs),
            "batch_size": self.batch_size,
            "chunk_size": self.chunk_size,
            "shuffle": self.shuffle,
            "bucket": self.bucket,
            "drop_last": self.drop_last,
        }
