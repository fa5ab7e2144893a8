"""What the time loop keeps and hands on: the forward record, the packing of finished
rows, the backward sweep's pre-activation gradients and the weight gradients.

All time-major: ``T`` steps, ``B`` rows, ``H`` hidden units, ``G`` gates. A reset mask
(``reset (T, B, 1)``, True where a new document starts) replaces the state entering step
t of those rows by zeros; the record keeps it (``ForwardRecord.reset``) so that every
reader of the states sees the same incoming states (:func:`incoming_states`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "ForwardRecord",
    "Grads",
    "Packing",
    "Sweep",
    "incoming_states",
    "make_packing",
    "unpack_record",
]


class ForwardRecord(NamedTuple):
    """What the forward pass keeps for the explicit backward (all time-major).

    With a ``Packing``, ``x`` and the cache hold only the rows each step computes, in
    packed order (``(N, ·)``, like ``PackedSequence.data``); the states stay padded.
    """

    # (T·B, I) input, padding replaced by 0 — or (N, I) packed, or (T, B, I) as it lay
    # where the compiled loop read it in place (forward_pass(..., in_place=True))
    x: Tensor
    states: tuple[Tensor, ...]  # each (T + 1, B, H); index 0 = initial state
    cache: tuple[Tensor, ...]  # the kernel's per-step cache, each (T, B, ·) — or (N, ·)
    reset: Tensor | None = None  # (T, B, 1) bool: state entering step t zeroed, or None
    # the outputs (T, B, H) where the compiled loop also wrote them in the input's layout
    # (a view of a batch-first buffer); None: they are states[0][1:]
    outputs: Tensor | None = None


def recurrent_grad_width(kernel: object, H: int) -> int | None:
    """How wide a sweep's gradients of the recurrent pre-activations are, where they
    differ from the input side's (``d_hp`` a buffer of its own), else None (``d_hp`` is
    ``d_xp``): a GRU with ``reset="after"``, the n block only (``H``; its r, z blocks equal
    ``d_xp``'s); a kernel that says it (``recurrent_grad_width``: the layer-normalised
    cells)."""
    width_of = getattr(kernel, "recurrent_grad_width", None)
    if width_of is not None:
        return int(width_of(H))
    return H if getattr(kernel, "reset", None) == "after" else None


def incoming_states(record: ForwardRecord) -> tuple[Tensor, ...]:
    """The state each step starts from, ``(T, B, H)`` each: ``states[:-1]``, with zeros
    where the record resets a row (what the step actually read)."""
    prev = tuple(s[:-1] for s in record.states)
    if record.reset is None:
        return prev
    return tuple(torch.where(record.reset, 0.0, p) for p in prev)


class Packing(NamedTuple):
    """Which rows each step computes, for the compiled loop's packed buffers.

    Step t computes rows ``0 .. act_t − 1`` (rows sorted by their last real step, so the
    finished ones are at the end); its rows sit at ``offsets[t] .. offsets[t+1] − 1`` of
    the packed buffers, and ``rows`` maps packed rows to ``t·B + b``. Holes inside the
    computed rows still hold the state through the mask. Input projections and weight
    gradients then cost only the computed rows, not the padding.
    """

    offsets: Tensor  # (T + 1,) int64
    rows: Tensor  # (N,) int64: packed row -> t·B + b


def unpack_record(record: ForwardRecord, packing: Packing) -> ForwardRecord:
    """The padded ``(T·B, ·)`` / ``(T, B, ·)`` record of a packed one (rows never computed
    hold zeros: they are all past their row's last real step, so masked)."""
    T, B = record.states[0].shape[0] - 1, record.states[0].shape[1]

    def pad(t: Tensor) -> Tensor:
        return t.new_zeros(T * B, t.shape[-1]).index_copy_(0, packing.rows, t)

    cache = tuple(pad(c).view(T, B, c.shape[-1]) for c in record.cache)
    return ForwardRecord(pad(record.x), record.states, cache)


def make_packing(mask: Tensor) -> Packing | None:
    """The packing of a ``(T, B)`` mask, or None when every step computes every row.

    >>> make_packing(torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)).offsets
    tensor([0, 2, 3, 3])
    """
    T, B = mask.shape
    if mask.numel() == 0:
        return None
    steps = torch.arange(T, device=mask.device)
    rows = torch.arange(1, B + 1, device=mask.device)
    last = torch.where(mask, steps[:, None], -1).amax(0)  # (B,) last real step, −1 if none
    computed = last[None, :] >= steps[:, None]  # (T, B): row still has a real step ahead
    act = (computed * rows).amax(1)  # (T,) 1 + the last such row
    if bool((act == B).all()):
        return None
    offsets = torch.zeros(T + 1, dtype=torch.long, device=mask.device)
    torch.cumsum(act, 0, out=offsets[1:])
    flat = torch.arange(T * B, device=mask.device).view(T, B)
    return Packing(offsets, flat[rows[None, :] <= act[:, None]])


class Sweep(NamedTuple):
    """The result of the backward sweep: gradients of every step's pre-activations.

    ``d_xp[t]`` is ∂L/∂(input pre-activation of step t), ``(T, B, G·H)``; ``d_hp`` the
    same for the recurrent pre-activation (the same tensor unless the cell is a GRU with
    ``reset="after"``); ``d_states0`` the gradients of the initial state. Summing the
    per-step outer products of these gives the weight gradients (``weight_grads``).
    """

    d_xp: Tensor
    d_hp: Tensor
    d_states0: tuple[Tensor, ...]
    d_x: Tensor | None = None  # ∂L/∂x (N, I) where the compiled loop computed it
    d_bias: Tensor | None = None  # ∂L/∂bias (G·H,) where the compiled loop summed it
    # ∂L/∂bias_hn where the compiled loop summed it (a layer-normalised cell's gains); d_hp
    # is then ∂L/∂(W_h h_{t-1}) alone, (N, G·H)
    d_bias_hn: Tensor | None = None


class Grads(NamedTuple):
    """Gradients of one direction of one layer (None where not asked for)."""

    x: Tensor | None  # (T, B, I)
    weight_ih: Tensor | None
    weight_hh: Tensor | None
    bias: Tensor | None
    bias_hn: Tensor | None
