"""Parallel streams cut into segments: one long token stream as ``B`` contiguous rows, handed
out ``K`` steps at a time (truncated BPTT over a long text, char-rnn batching).

The order is fixed, so the batcher needs no seed; it resumes exactly from a state dict
(``rnnkit.data.batch_resume``). Document boundaries inside the stream mark where the
recurrent state must start again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from rnnkit.data.batch_resume import _as_ids, _positive, _Resumable
from rnnkit.errors import DataError

__all__ = ["StreamBatch", "StreamBatcher"]


class StreamBatch(NamedTuple):
    """One segment of ``B`` parallel streams.

    Attributes:
        inputs: ``(B, T)`` int64 token ids, ``T <= segment_len`` (only the last segment of an
            epoch is shorter).
        targets: ``(B, T)`` int64, the next token of the stream at every position.
        mask: ``(B, T)`` bool, all true (streams have no padding; kept so that loss code is
            the same as for padded batches).
        starts: ``(B, T)`` bool, true where the recurrent state entering that step must be
            the initial (zero) state: at the first position of an epoch, and wherever the
            input is the document boundary token.
        reset: ``(B,)`` bool, ``starts[:, 0]``: rows whose carried state must be zeroed before
            this segment (all true for the first segment of an epoch).
    """

    inputs: Tensor
    targets: Tensor
    mask: Tensor
    starts: Tensor
    reset: Tensor


class StreamBatcher(_Resumable):
    """Cut one token stream into ``B`` contiguous parallel streams and hand out consecutive
    segments of ``K`` steps (char-rnn / truncated-BPTT batching).

    With ``N`` tokens each row holds ``L = (N - 1) // B`` inputs: row ``b`` reads
    ``ids[b*L : (b+1)*L]`` and predicts ``ids[b*L+1 : (b+1)*L+1]``, so every target is the
    true next token; the ``N - 1 - B*L`` tokens left over are dropped. Segment ``s`` covers
    columns ``[s*K, min((s+1)*K, L))``: the last one is shorter rather than padded (no
    compute is spent on padding; ``mask`` is therefore all true). The state carried from one
    segment to the next is the caller's; the order is fixed, so no seed is needed.

    Documents: with ``boundary_id`` set (e.g. ``</s>`` or a separator), a position whose
    input is that token starts a new document. The boundary token then plays the start
    symbol: the state entering it is reset, and it predicts the next document's first
    token. ``starts`` marks these positions (plus the first position of an epoch), so a
    loop can reset the state inside a segment.

    Args:
        ids: ``(N,)`` integer token ids.
        batch_size: ``B``, the number of parallel streams.
        segment_len: ``K``, the number of steps per segment (the truncation length).
        boundary_id: token id that separates documents, or None for one document.

    >>> batcher = StreamBatcher(np.arange(10), batch_size=2, segment_len=3)
    >>> len(batcher)
    2
    >>> [b.inputs.tolist() for b in batcher]
    [[[0, 1, 2], [4, 5, 6]], [[3], [7]]]
    """

    def __init__(
        self,
        ids: Any,
        batch_size: int,
        segment_len: int,
        boundary_id: int | None = None,
    ) -> None:
        ids = _as_ids(ids, "the token stream")
        self.batch_size = _positive("batch_size", batch_size)
        self.segment_len = _positive("segment_len", segment_len)
        self.boundary_id = boundary_id
        B = self.batch_size
        L = (len(ids) - 1) // B
        if L < 1:
            raise DataError(
                f"token stream too short: {len(ids)} tokens cannot fill {B} streams "
                f"(needs at least {B + 1})"
            )
        self.row_len = L
        self._inputs = ids[: B * L].reshape(B, L)  # views, no copy
        self._targets = ids[1 : B * L + 1].reshape(B, L)
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        return -(-self.row_len // self.segment_len)

    def _batch(self, index: int) -> StreamBatch:
        lo = index * self.segment_len
        hi = min(lo + self.segment_len, self.row_len)
        inputs = np.ascontiguousarray(self._inputs[:, lo:hi], dtype=np.int64)  # (B, T)
        targets = np.ascontiguousarray(self._targets[:, lo:hi], dtype=np.int64)
        if self.boundary_id is None:
            starts = np.zeros(inputs.shape, dtype=bool)
        else:
            starts = inputs == self.boundary_id
        if lo == 0:
            starts[:, 0] = True
        starts_t = torch.from_numpy(starts)
        return StreamBatch(
            inputs=torch.from_numpy(inputs),
            targets=torch.from_numpy(targets),
            mask=torch.ones(inputs.shape, dtype=torch.bool),
            starts=starts_t,
            reset=starts_t[:, 0].clone(),
        )

    def state_dict(self) -> dict[str, Any]:
        """Position for exact resume (plain ints: JSON-safe).

        >>> b = StreamBatcher(np.arange(20), 2, 3)
        >>> _ = next(iter(b))
        >>> b.state_dict()
        {'epoch': 0, 'position': 1, 'batch_size': 2, 'segment_len': 3, 'row_len': 9}
        """
        return {"epoch": self.epoch, "position": self.position, **self._shape()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a state from a differently shaped batcher is a
        ``CheckpointError``."""
        self._check_state(state, self._shape())

    def _shape(self) -> dict[str, int]:
        return {
            "batch_size": self.batch_size,
            "segment_len": self.segment_len,
            "row_len": self.row_len,
        }
