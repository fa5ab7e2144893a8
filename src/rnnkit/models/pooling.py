"""Pooling: the per-step states of an encoder become one vector per sequence.

* ``last``: the state after the last real step. For a bidirectional encoder it is
  ``[h^f_{L_i}; h^b_1]``: the forward direction's final state (at the sequence's own last
  real step) and the backward direction's final state (it ends at step 1, having read the
  sequence from its end). Both are exactly the top layer's final ``state`` of an rnnkit
  layer, so that is what is used when the state is given.
* ``mean``: ``Σ_t m_t h_t / Σ_t m_t`` over the valid steps.
* ``max``: the entrywise maximum over the valid steps.

Padding never takes part: the pooled values are selected with ``torch.where`` (never by
multiplying with the mask, since ``0 × inf`` and ``0 × NaN`` are NaN), so whatever the
padded positions hold — huge values, ``inf``, ``NaN`` — cannot change the result or its
gradient. A sequence without any valid step has no pooled value: a ``ValueError`` (inside
a training step, read with the step's figures: :mod:`rnnkit.deferred`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rnnkit.bptt.tracing import tracing
from rnnkit.deferred import active_for
from rnnkit.types import LSTMState, State

__all__ = [
    "POOLINGS",
    "Pooling",
    "directions_side_by_side",
    "last_pool",
    "max_pool",
    "mean_pool",
    "state_pool",
]

POOLINGS: tuple[str, ...] = ("last", "mean", "max")


def _check(outputs: Tensor, mask: Tensor) -> Tensor:
    if outputs.dim() != 3:
        raise ValueError(f"outputs must have shape (B, T, F), got {tuple(outputs.shape)}")
    B, T, _ = outputs.shape
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must have shape (B, T) = {(B, T)}, got {tuple(mask.shape)}")
    mask = mask.to(device=outputs.device, dtype=torch.bool)
    empty = ~mask.any(1)
    deferred = active_for(mask)
    if deferred is not None:  # read with the training step's figures
        deferred.check(empty.any(), lambda: _empty_error(empty))
    elif not tracing() and bool(empty.any()):  # a traced graph holds no data-dependent check
        raise _empty_error(empty)
    return mask


def _empty_error(empty: Tensor) -> ValueError:
    row = int(torch.nonzero(empty)[0, 0])
    return ValueError(f"sequence {row} has no valid step: nothing to pool")


def mean_pool(outputs: Tensor, mask: Tensor) -> Tensor:
    """Masked mean over time: ``Σ_t m_t h_t / Σ_t m_t``.

    Args:
        outputs: ``(B, T, F)`` per-step states.
        mask: ``(B, T)`` bool, True at valid steps (at least one per row).

    Returns:
        ``(B, F)``.

    >>> h = torch.tensor([[[1.0], [3.0], [float("nan")]]])
    >>> mean_pool(h, torch.tensor([[True, True, False]]))
    tensor([[2.]])
    """
    mask = _check(outputs, mask)
    m = mask.unsqueeze(-1)  # (B, T, 1)
    total = torch.where(m, outputs, 0.0).sum(1)  # (B, F)
    return total / mask.sum(1, keepdim=True).to(outputs.dtype)


def max_pool(outputs: Tensor, mask: Tensor) -> Tensor:
    """Masked maximum over time: padded steps are ``-inf`` before the max, so they never win.

    Args:
        outputs: ``(B, T, F)`` per-step states.
        mask: ``(B, T)`` bool, True at valid steps (at least one per row).

    Returns:
        ``(B, F)``; the gradient flows only to the winning valid steps.

    >>> h = torch.tensor([[[-1.0], [-2.0], [1e30]]])
    >>> max_pool(h, torch.tensor([[True, True, False]]))
    tensor([[-1.]])
    """
    mask = _check(outputs, mask)
    masked = torch.where(mask.unsqueeze(-1), outputs, float("-inf"))  # (B, T, F)
    return masked.amax(1)


def last_pool(outputs: Tensor, mask: Tensor, num_directions: int = 1) -> Tensor:
    """The final states read off the per-step outputs of a (bi)directional layer.

    The forward half is taken at each row's last valid step, the backward half (the
    second ``F / 2`` features when ``num_directions == 2``) at step 0, where the backward
    direction ends. With rnnkit's hold-state masking this equals the layer's final
    ``state`` even when the mask has holes.

    Args:
        outputs: ``(B, T, D·H)``.
        mask: ``(B, T)`` bool.
        num_directions: ``D``, 1 or 2.

    Returns:
        ``(B, D·H)``.

    >>> h = torch.arange(6.0).view(1, 3, 2)  # D = 2, H = 1: [f, b] per step
    >>> last_pool(h, torch.tensor([[True, True, False]]), num_directions=2)
    tensor([[2., 1.]])
    """
    mask = _check(outputs, mask)
    if num_directions not in (1, 2):
        raise ValueError(f"num_directions must be 1 or 2, got {num_directions}")
    B, T, F = outputs.shape
    steps = torch.arange(T, device=outputs.device).expand(B, T)
    last = torch.where(mask, steps, -1).amax(1)  # (B,) index of the last valid step
    rows = torch.arange(B, device=outputs.device)
    forward = outputs[rows, last]  # (B, F)
    if num_directions == 1:
        return forward
    H = F // 2
    return torch.cat([forward[:, :H], outputs[:, 0, H:]], dim=-1)


def state_pool(state: State) -> Tensor:
    """``[h^f_L; h^b_1]`` of the top layer from a final state ``(L, D, B, H)``.

    Args:
        state: the ``state`` of a ``RecurrentOutput`` (an ``LSTMState`` uses its ``h``).

    Returns:
        ``(B, D·H)``: the directions of the top layer side by side.

    >>> s = torch.arange(4.0).view(1, 2, 1, 2)  # L = 1, D = 2, B = 1, H = 2
    >>> state_pool(s)
    tensor([[0., 1., 2., 3.]])
    """
    h = state.h if isinstance(state, LSTMState) else state
    return directions_side_by_side(h[-1])


def directions_side_by_side(top: Tensor) -> Tensor:
    """``(D, B, H)`` → ``(B, D·H)``: ``[h^f; h^b]`` of each row.

    The width is given, not inferred: ``reshape(B, -1)`` of an empty batch (``B = 0``)
    is ambiguous and fails, while the result is simply ``(0, D·H)``.

    >>> directions_side_by_side(torch.zeros(2, 0, 3)).shape
    torch.Size([0, 6])
    """
    D, B, H = top.shape
    return top.permute(1, 0, 2).reshape(B, D * H)


class Pooling(nn.Module):
    """``Pooling(method)`` with ``method`` in ``last``, ``mean``, ``max`` (see module doc).

    >>> from rnnkit import GRU
    >>> enc = GRU(3, 4, bidirectional=True)
    >>> x, mask = torch.randn(2, 5, 3), torch.tensor([[1, 1, 1, 0, 0], [1] * 5]).bool()
    >>> out = enc(x, mask=mask)
    >>> Pooling("last")(out.outputs, mask, out.state).shape
    torch.Size([2, 8])
    """

    def __init__(self, method: str = "last", num_directions: int = 1) -> None:
        super().__init__()
        if method not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {method!r}")
        self.method = method
        self.num_directions = num_directions

    def extra_repr(self) -> str:
        return f"{self.method!r}, num_directions={self.num_directions}"

    def forward(self, outputs: Tensor, mask: Tensor, state: State | None = None) -> Tensor:
        """``outputs (B, T, D·H)``, ``mask (B, T)``, optional final ``state`` → ``(B, D·H)``."""
        if self.method == "mean":
            return mean_pool(outputs, mask)
        if self.method == "max":
            return max_pool(outputs, mask)
        if state is not None:
            _check(outputs, mask)
            return state_pool(state)
        return last_pool(outputs, mask, self.num_directions)
