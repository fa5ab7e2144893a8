"""Masks and lengths: validation, conversion, and reversal within each sequence.

A mask is ``(B, T)`` bool, True at real steps. ``lengths`` is ``(B,)`` integers; it means
the mask ``m_it = t < L_i``. A mask need not be a prefix of ones: a hole holds the state.
"""

from __future__ import annotations

from typing import overload

import torch
from torch import Tensor

from rnnkit.bptt.mask_facts import derive
from rnnkit.bptt.tracing import tracing

__all__ = ["flip_sequences", "lengths_to_mask", "resolve_mask"]


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``(B,)`` lengths → ``(B, T)`` bool mask ``m_it = t < L_i``.

    >>> lengths_to_mask(torch.tensor([2, 0, 3]), 3).int().tolist()
    [[1, 1, 0], [0, 0, 0], [1, 1, 1]]
    """
    steps = torch.arange(max_len, device=lengths.device)
    return steps[None, :] < lengths[:, None]


def resolve_mask(
    x: Tensor, lengths: Tensor | None, mask: Tensor | None, batch_first: bool = True
) -> Tensor | None:
    """Check ``lengths``/``mask`` against ``x`` and return a ``(B, T)`` bool mask or None.

    Every problem is a ``ValueError``/``TypeError`` naming the argument, what was expected
    and what was received.
    """
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    if lengths is not None and mask is not None:
        raise ValueError("pass either lengths or mask, not both")
    if lengths is not None:
        if not isinstance(lengths, Tensor):
            try:  # a list, a numpy array; not a state given where lengths go
                lengths = torch.as_tensor(lengths)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    "lengths must be (B,) integers (a tensor, list or array), got "
                    f"{type(lengths).__name__}"
                ) from None
        if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.is_complex():
            raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
        if lengths.dim() != 1 or lengths.shape[0] != B:
            raise ValueError(f"lengths must have shape (B,) = ({B},), got {tuple(lengths.shape)}")
        lengths = lengths.to(x.device)
        if tracing():  # a graph cannot check values: lengths_to_mask clips them
            return lengths_to_mask(lengths, T)
        if B and int(lengths.min()) < 0:
            bad = int(torch.nonzero(lengths < 0)[0, 0])
            raise ValueError(f"lengths[{bad}] = {int(lengths[bad])} is negative")
        if B and int(lengths.max()) > T:
            bad = int(torch.nonzero(lengths > T)[0, 0])
            raise ValueError(
                f"lengths[{bad}] = {int(lengths[bad])} exceeds the number of time steps T = {T}"
            )
        return lengths_to_mask(lengths, T)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
        expected = (B, T) if batch_first else (T, B)
        if tuple(mask.shape) != expected:
            raise ValueError(
                f"mask must have shape {'(B, T)' if batch_first else '(T, B)'} = {expected}, "
                f"got {tuple(mask.shape)}"
            )
        if mask.dtype != torch.bool:
            if mask.dtype.is_floating_point or mask.is_complex():
                raise TypeError(f"mask must be bool (or 0/1 integers), got dtype {mask.dtype}")
            if not tracing() and bool(((mask != 0) & (mask != 1)).any()):
                raise ValueError("mask must hold only 0 and 1")
            mask = mask != 0
        mask = mask.to(x.device)
        return mask if batch_first else mask.T
    return None


def _flip_index(mask: Tensor) -> Tensor:
    """``(T, B)`` the step each step of the flipped sequences reads."""
    T = mask.shape[0]
    steps = torch.arange(T, device=mask.device)
    extent = torch.where(mask, steps[:, None] + 1, 0).amax(0)  # (B,) last real step + 1
    return torch.where(
        steps[:, None] < extent[None, :], extent[None, :] - 1 - steps[:, None], steps[:, None]
    )


def _flip_mask(mask: Tensor) -> Tensor:
    return mask.gather(0, _flip_index(mask))


@overload
def flip_sequences(x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]: ...
@overload
def flip_sequences(x: Tensor, mask: None) -> tuple[Tensor, None]: ...
@overload
def flip_sequences(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]: ...
def flip_sequences(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Reverse each sequence within its own extent (Flax's ``flip_sequences``).

    ``x`` is time-major ``(T, B, ...)``, ``mask`` ``(T, B)`` bool. Sequence ``b`` spans
    ``[0, L_b)`` with ``L_b`` = its last real step + 1; that span is reversed, the padding
    after it stays in place. Applying it twice gives the input back.

    >>> x = torch.arange(4.).view(4, 1)
    >>> m = torch.tensor([[True], [True], [True], [False]])
    >>> flip_sequences(x, m)[0].view(-1).tolist()
    [2.0, 1.0, 0.0, 3.0]
    """
    T = x.shape[0]
    if mask is None or T == 0:  # no step: nothing to reverse (and no last real step)
        return x.flip(0), mask
    idx = _flip_index(mask)  # (T, B)
    flipped_mask = mask.gather(0, idx)
    if not tracing():  # its answers (prefix? lengths?) from the mask's one host copy
        derive(flipped_mask, mask, _flip_mask)
    gather_idx = idx.view(T, -1, *([1] * (x.dim() - 2))).expand_as(x)
    return x.gather(0, gather_idx), flipped_mask
