"""Real-valued sequence models: next-value prediction and sequence-to-value regression.

    h_t = RNN(x_1 … x_t)                 x_t ∈ R^D, a recurrent stack (any cell)
    next:   μ_t = W h_t + b ≈ x_{t+1}     one prediction per step (causal)
    value:  μ = W h_T + b ≈ y             from the state after the last real step

Two losses, the Gaussian case of the same maximum-likelihood framework as the softmax:

* ``"mse"``: the mean squared error ``mean (μ − y)²`` over real steps and dimensions
  (the negative log-likelihood of a unit-variance Gaussian, up to constants);
* ``"gaussian"``: the head also outputs ``log σ²`` per dimension and the loss is the full
  Gaussian negative log-likelihood ``½ (ln 2π + ln σ² + (y − μ)² / σ²)`` per element
  (``torch.nn.functional.gaussian_nll_loss`` with ``full=True``). The head's ``ln σ²``
  is clamped to at most ``LOG_VAR_MAX`` = 88: ``exp`` of more overflows float32
  (``ln 3.4e38`` ≈ 88.7), and a trained model could reach it on inputs unlike its
  training data (a variance of ``inf``, written as ``null`` by ``predict``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.deferred import active_for, count_of, figure_of
from rnnkit.layers.stacked import StackedRecurrent
from rnnkit.models.language_model import LossOutput
from rnnkit.models.pooling import directions_side_by_side

__all__ = ["LOG_VAR_MAX", "LOSSES", "TARGETS", "Regressor", "RegressorOutput"]

LOSSES = ("mse", "gaussian")
TARGETS = ("next", "value")
#: The largest ``ln σ²`` of a ``"gaussian"`` head: ``exp(88)`` ≈ 1.7e38 is float32's; one
#: more and the variance (and the likelihood's ``ln σ²``) would be ``inf``.
LOG_VAR_MAX = 88.0


class RegressorOutput(NamedTuple):
    mean: Tensor  # (B, T, K) for "next", (B, K) for "value"
    log_var: Tensor | None  # the same shape, "gaussian" only


class Regressor(nn.Module):
    """``Regressor(encoder, output_size, target, loss)``.

    Args:
        encoder: a recurrent stack over ``D``-wide inputs (batch-first).
        output_size: ``K`` (``D`` for next-value prediction).
        target: ``"next"`` or ``"value"``.  loss: ``"mse"`` or ``"gaussian"``.
        dropout: before the head.

    >>> from rnnkit import GRU
    >>> m = Regressor(GRU(2, 4), 2, "next", "gaussian")
    >>> out = m(torch.zeros(3, 5, 2))
    >>> out.mean.shape, out.log_var.shape
    (torch.Size([3, 5, 2]), torch.Size([3, 5, 2]))
    """

    def __init__(
        self,
        encoder: StackedRecurrent,
        output_size: int,
        target: str = "next",
        loss: str = "mse",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if target == "next" and encoder.bidirectional:
            raise ValueError("next-value prediction must be causal: no bidirectional encoder")
        self.encoder = encoder
        self.target = target
        self.loss_kind = loss
        self.output_size = output_size
        width = encoder.hidden_size * encoder.num_directions
        self.head = nn.Linear(width, output_size * (2 if loss == "gaussian" else 1))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> RegressorOutput:
        """``x (B, T, D)``, ``mask (B, T)`` bool (True at real steps; every row needs one)."""
        out = self.encoder(x, mask=mask)
        if self.target == "next":
            features = out.outputs  # (B, T, H·D)
        else:
            h = out.state.h if hasattr(out.state, "h") else out.state  # (L, D, B, H)
            top = h[-1]  # (dirs, B, H): forward = after the last real step, backward = first
            features = directions_side_by_side(top)  # (B, dirs·H)
        z = self.head(self.drop(features))
        if self.loss_kind == "gaussian":
            mean, log_var = z.split(self.output_size, dim=-1)
            # beyond LOG_VAR_MAX, exp overflows float32: a saturation, whose gradient is 0
            return RegressorOutput(mean, log_var.clamp(max=LOG_VAR_MAX))
        return RegressorOutput(z, None)

    def loss(self, x: Tensor, y: Tensor, mask: Tensor | None = None) -> LossOutput:
        """Mean loss per predicted element; ``nats`` its sum (for ``mse`` the summed squared
        error) and ``tokens`` the number of elements, so that means over batches are exact.

        Args:
            x: ``(B, T, D)``.  y: ``(B, T, K)`` (next: ``x`` shifted by one) or ``(B, K)``.
            mask: ``(B, T)`` bool: the steps that are real (and, for next, have a target).
        """
        return self.loss_of(self(x, mask), y, mask)

    def loss_of(self, out: RegressorOutput, y: Tensor, mask: Tensor | None = None) -> LossOutput:
        """:meth:`loss` of an output this model already computed for ``x`` and ``mask``
        (an evaluation that needs the predictions too runs the model once, not twice)."""
        if self.target == "next" and mask is not None:
            keep = mask.unsqueeze(-1).expand_as(y)
        else:
            keep = torch.ones_like(y, dtype=torch.bool)
        if active_for(out.mean) is not None:  # a training step on a GPU: no host read
            return self._deferred_loss(out, y, keep)
        mean, target = out.mean[keep], y[keep]
        if self.loss_kind == "gaussian":
            assert out.log_var is not None
            var = out.log_var[keep].exp()
            total = F.gaussian_nll_loss(mean, target, var, full=True, reduction="sum")
        else:
            total = F.mse_loss(mean, target, reduction="sum")
        count = int(keep.sum())
        return LossOutput(total / max(count, 1), float(total.detach()), count, None)

    def _deferred_loss(self, out: RegressorOutput, y: Tensor, keep: Tensor) -> LossOutput:
        """:meth:`loss` over every element, those not kept replaced by neutral values
        before the loss (a NaN target of a padded step must not reach the sum or its
        gradient) and zeroed after it; the count left on the device."""
        mean = torch.where(keep, out.mean, 0.0)
        target = torch.where(keep, y, 0.0)
        if self.loss_kind == "gaussian":
            assert out.log_var is not None
            var = torch.where(keep, out.log_var, 0.0).exp()
            each = F.gaussian_nll_loss(mean, target, var, full=True, reduction="none")
        else:
            each = F.mse_loss(mean, target, reduction="none")
        total = torch.where(keep, each, 0.0).sum()
        count = keep.sum()
        return LossOutput(total / count.clamp(min=1), figure_of(total), count_of(count), None)
