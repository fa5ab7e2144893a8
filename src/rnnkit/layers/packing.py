"""``PackedSequence`` to padded and back with indexing alone, for the torch.nn drop-ins.

torch's ``pad_packed_sequence`` and ``pack_padded_sequence`` read the data's memory
directly, which ``torch.func.grad`` (and ``jacrev``, ``vmap(grad(...))``) refuses: "Cannot
access data pointer of Tensor that doesn't have storage". The same layouts made with
``index_select`` work under every transform and give the same values.

A packed sequence's ``data (N, *)`` holds, step after step, the steps of the sequences
still running, longest first: with ``batch_sizes (T,)`` (``b_t`` sequences at step
``t``), element ``(t, b)``, ``b < b_t``, of the sorted batch is row ``Σ_{s<t} b_s + b``.
``sorted_indices[i]`` is the original index of the ``i``-th sorted sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence

# Internal to the drop-ins (rnnkit.layers.torch_nn): not re-exported by rnnkit.layers.
__all__: list[str] = []


def lengths_of(packed: PackedSequence) -> Tensor:
    """Each sequence's length ``(B,)`` (int64, CPU), in the original batch order."""
    sizes = packed.batch_sizes  # (T,), how many sequences are still running at each step
    B = int(sizes[0])
    sorted_lengths = (sizes.unsqueeze(0) > torch.arange(B).unsqueeze(1)).sum(1)  # (B,)
    if packed.unsorted_indices is None:
        return sorted_lengths
    return sorted_lengths[packed.unsorted_indices.cpu()]


def _rows(batch_sizes: Tensor) -> Tensor:
    """``(N,)`` the time-major positions ``t·B + b`` of the packed rows, in their order."""
    T, B = len(batch_sizes), int(batch_sizes[0])
    grid = torch.arange(B).unsqueeze(0) < batch_sizes.unsqueeze(1)  # (T, B): (t, b) real
    return torch.arange(T * B)[grid.reshape(-1)]


def unpack(packed: PackedSequence, batch_first: bool = False) -> tuple[Tensor, Tensor]:
    """``(padded, lengths)`` as ``pad_packed_sequence`` gives them: ``(T, B, *)`` (or
    ``(B, T, *)``) in the original batch order, zeros after each sequence's end.

    >>> from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence
    >>> p = pack_sequence([torch.ones(2, 1), torch.arange(3.0).view(3, 1)], False)
    >>> padded, lengths = unpack(p)
    >>> torch.equal(padded, pad_packed_sequence(p)[0]), lengths.tolist()
    (True, [2, 3])
    """
    data, sizes = packed.data, packed.batch_sizes
    T, B = len(sizes), int(sizes[0])
    rows = _rows(sizes).to(data.device)
    # every (t, b) reads a packed row, or the zero row appended at index N
    source = torch.full((T * B,), data.shape[0], dtype=torch.long, device=data.device)
    source[rows] = torch.arange(data.shape[0], device=data.device)
    padded = torch.cat([data, data.new_zeros(1, *data.shape[1:])]).index_select(0, source)
    padded = padded.reshape(T, B, *data.shape[1:])
    if packed.unsorted_indices is not None:
        padded = padded.index_select(1, packed.unsorted_indices.to(data.device))
    return (padded.transpose(0, 1) if batch_first else padded), lengths_of(packed)


def pack_like(outputs: Tensor, like: PackedSequence, batch_first: bool = False) -> PackedSequence:
    """Padded ``outputs`` (the original batch order) as a PackedSequence laid out exactly
    like ``like``: the same ``batch_sizes`` and indices.

    >>> from torch.nn.utils.rnn import pack_sequence
    >>> p = pack_sequence([torch.ones(2, 1), torch.arange(3.0).view(3, 1)], False)
    >>> torch.equal(pack_like(unpack(p)[0], p).data, p.data)
    True
    """
    x = outputs.transpose(0, 1) if batch_first else outputs  # (T', B, *), T' ≥ T
    if like.sorted_indices is not None:
        x = x.index_select(1, like.sorted_indices.to(x.device))
    T = len(like.batch_sizes)
    x = x[:T].reshape(-1, *x.shape[2:])
    data = x.index_select(0, _rows(like.batch_sizes).to(x.device))
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)
