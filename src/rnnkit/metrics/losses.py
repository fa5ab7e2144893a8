"""Masked sequence losses in nats (docs/math.md, "Losses")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rnnkit.bptt.tracing import tracing
from rnnkit.deferred import Deferred, active_for, count_of, figure_of

__all__ = ["REDUCTIONS", "sequence_cross_entropy", "training_loss"]

REDUCTIONS = ("token", "sequence", "sum")


def sequence_cross_entropy(
    logits: Tensor, targets: Tensor, mask: Tensor | None = None, reduction: str = "token"
) -> Tensor:
    """Cross-entropy ``ℓ_it = −ln softmax(z_it)[y_it]`` over valid steps, in nats.

    Args:
        logits: ``(B, T, V)``.
        targets: ``(B, T)`` integer class ids (anything at padded steps).
        mask: ``(B, T)`` bool, True where a step has a target; None = all valid.
        reduction: ``"token"`` (default) ``Σ m ℓ / Σ m`` — every valid step weighs the
            same; ``"sequence"`` the mean within each sequence, then over sequences with
            at least one valid step; ``"sum"`` ``Σ m ℓ``.

    Raises:
        ValueError: on shape mismatches, an unknown reduction, or no valid position
            (the mean would be undefined: never a silent NaN).

    >>> logits = torch.zeros(1, 4, 2)            # four steps at probability 0.5
    >>> round(sequence_cross_entropy(logits, torch.zeros(1, 4, dtype=torch.long),
    ...                              reduction="sum").item(), 3)
    2.773
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape (B, T, V), got {tuple(logits.shape)}")
    B, T, V = logits.shape
    if tuple(targets.shape) != (B, T):
        raise ValueError(f"targets must have shape (B, T) = {(B, T)}, got {tuple(targets.shape)}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets must hold integer class ids, got dtype {targets.dtype}")
    if mask is not None and tuple(mask.shape) != (B, T):
        raise ValueError(f"mask must have shape (B, T) = {(B, T)}, got {tuple(mask.shape)}")
    deferred = active_for(logits)
    if deferred is not None and not tracing():
        if mask is not None:
            mask = mask.to(device=logits.device, dtype=torch.bool)
        return _deferred_cross_entropy(logits, targets, mask, reduction, deferred)
    if mask is None:
        mask = torch.ones(B, T, dtype=torch.bool, device=logits.device)
    mask = mask.to(device=logits.device, dtype=torch.bool)
    if not bool(mask.any()):
        raise ValueError(_NO_POSITION)
    valid_targets = targets[mask]
    if bool(((valid_targets < 0) | (valid_targets >= V)).any()):
        raise ValueError(_target_range(V))
    # Select the valid positions first: padding never becomes a target and never yields
    # NaN × 0 in the sum.
    per_token = F.cross_entropy(logits[mask], valid_targets, reduction="none")  # (N,)
    if reduction == "sum":
        return per_token.sum()
    if reduction == "token":
        return per_token.mean()
    counts = mask.sum(1)  # (B,)
    row = torch.arange(B, device=logits.device)[:, None].expand(B, T)[mask]
    sums = torch.zeros(B, dtype=per_token.dtype, device=logits.device).index_add(0, row, per_token)
    has = counts > 0
    return (sums[has] / counts[has]).mean()


_NO_POSITION = "sequence_cross_entropy: the mask has no valid position (mean undefined)"


def _target_range(V: int) -> str:
    return f"targets at valid positions must lie in [0, {V}), the number of classes"


def _deferred_cross_entropy(
    logits: Tensor, targets: Tensor, mask: Tensor | None, reduction: str, deferred: Deferred
) -> Tensor:
    """:func:`sequence_cross_entropy` without a host read (see :mod:`rnnkit.deferred`):
    every position is computed and the padded ones zeroed, the checks left as flags.

    The padded positions' logits are replaced by zeros BEFORE the cross-entropy: a NaN
    there (padding of real-valued inputs) would otherwise reach the gradient as NaN × 0.
    An out-of-range target is clamped for the computation (a GPU kernel would stop the
    process on it) and refused when the step's figures are read. Without a mask (every
    position real, as in stream segments) nothing is replaced or zeroed."""
    B, T, V = logits.shape
    bad = (targets < 0) | (targets >= V)
    deferred.check(
        (bad if mask is None else bad & mask).any(), lambda: ValueError(_target_range(V))
    )
    safe_targets = targets.clamp(0, V - 1).reshape(B * T)
    if mask is None:
        if B * T == 0:
            raise ValueError(_NO_POSITION)
        per_token = F.cross_entropy(logits.reshape(B * T, V), safe_targets, reduction="none")
        if reduction == "sum":
            return per_token.sum()
        return per_token.mean()  # every row has T ≥ 1 real steps: the sequence mean too
    deferred.check(~mask.any(), lambda: ValueError(_NO_POSITION))
    safe = torch.where(mask.unsqueeze(-1), logits, logits.new_zeros(()))
    per_token = F.cross_entropy(safe.reshape(B * T, V), safe_targets, reduction="none").view(B, T)
    per_token = torch.where(mask, per_token, per_token.new_zeros(()))
    if reduction == "sum":
        return per_token.sum()
    if reduction == "token":
        return per_token.sum() / mask.sum()
    counts = mask.sum(1)  # (B,)
    has = counts > 0
    means = per_token.sum(1) / counts.clamp(min=1)
    return torch.where(has, means, means.new_zeros(())).sum() / has.sum()


def training_loss(
    logits: Tensor, targets: Tensor, mask: Tensor | None, reduction: str = "token"
) -> tuple[Tensor, float | Tensor, int | Tensor]:
    """``(loss, nats, tokens)``: the loss to backpropagate under ``reduction`` (``"token"``
    or ``"sequence"``, see :func:`sequence_cross_entropy`), and the detached sum of the
    per-token losses with their count, so that figures over batches stay exact per token
    whatever the reduction. Numbers, or 0-dim tensors inside
    :func:`rnnkit.deferred.deferring` (read with the step's other figures)."""
    loss = sequence_cross_entropy(logits, targets, mask, reduction=reduction)
    # every position real: the count is the shape's, known on the host
    tokens = targets.numel() if mask is None else count_of(mask.sum())
    if reduction == "token":
        return loss, figure_of(loss.detach().double() * tokens), tokens
    total = sequence_cross_entropy(logits.detach(), targets, mask, reduction="sum")
    return loss, figure_of(total), tokens
