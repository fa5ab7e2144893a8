"""The bound on gradient flow through time: ``‖∂h_t/∂h_k‖₂ ≤ (γλ)^{t−k}``.

``∂h_t/∂h_k = Π_{j=k+1..t} diag(φ'(a_j)) W_h``, so for the simple cell

    ‖∂h_t/∂h_k‖₂ ≤ (γλ)^{t−k},   λ = ‖W_h‖₂ (largest singular value),
    γ = sup φ' = 1 for tanh (and relu), ¼ for the logistic.

Masked steps hold the state (their Jacobian is the identity), so in a padded batch the
exponent is the number of real steps between ``h_k`` and ``h_t`` (``real_steps``). Also
here: the size of ``∂⁺s_k/∂W``, the reason a step's contribution is stored as an outer
product. The measured norms the bound is compared with are in ``rnnkit.diagnostics.jacobian``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rnnkit.cells.base import CellBase
from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.masking import flip_sequences, resolve_mask
from rnnkit.layers.recurrent import Recurrent

__all__ = [
    "DerivativeSize",
    "activation_gain",
    "jacobian_bound",
    "real_steps",
    "rnn_jacobian_bound",
    "spectral_norm",
    "weight_derivative_size",
]

GAINS = {"tanh": 1.0, "relu": 1.0, "logistic": 0.25, "sigmoid": 0.25}


def activation_gain(activation: str) -> float:
    """``γ``, the bound on ``φ'``: 1 for tanh and relu, ¼ for the logistic (sigmoid).

    >>> activation_gain("tanh"), activation_gain("logistic")
    (1.0, 0.25)
    """
    if activation not in GAINS:
        raise ValueError(f"activation must be one of {sorted(GAINS)}, got {activation!r}")
    return GAINS[activation]


def spectral_norm(matrix: Tensor) -> float:
    """``‖W‖₂``, the largest singular value of a 2-D tensor.

    >>> spectral_norm(torch.diag(torch.tensor([0.5, -0.8])))
    0.800000011920929
    """
    if matrix.dim() != 2:
        raise ValueError(f"matrix must be 2-D, got shape {tuple(matrix.shape)}")
    return float(torch.linalg.matrix_norm(matrix.detach(), ord=2))


def jacobian_bound(
    norm: float, steps: int | Sequence[int] | Tensor, activation: str = "tanh"
) -> Tensor:
    """The bound ``(γλ)^{t−k}`` on ``‖∂h_t/∂h_k‖₂``, float64.

    Args:
        norm: ``λ ≥ ‖W_h‖₂`` (see ``spectral_norm``).
        steps: ``t − k``, one or many.
        activation: ``"tanh"`` / ``"relu"`` (γ = 1) or ``"logistic"`` (γ = ¼).

    ``‖W‖ = 0.8`` over 20 steps:

    >>> round(float(jacobian_bound(0.8, 20)), 4)
    0.0115
    >>> f"{float(jacobian_bound(0.8, 20, 'logistic')):.1e}"
    '1.0e-14'
    """
    gamma = activation_gain(activation)
    k = torch.as_tensor(steps, dtype=torch.float64)
    return torch.tensor(gamma * float(norm), dtype=torch.float64) ** k


def rnn_jacobian_bound(cell: RNNCell, steps: int | Sequence[int] | Tensor) -> Tensor:
    """``(γλ)^{steps}`` for a simple cell: ``λ = ‖weight_hh‖₂``, γ of its nonlinearity.

    >>> cell = RNNCell(2, 3)
    >>> with torch.no_grad():
    ...     _ = cell.weight_hh.copy_(0.8 * torch.eye(3))
    >>> round(float(rnn_jacobian_bound(cell, 20)), 4)
    0.0115
    """
    if not isinstance(cell, RNNCell):
        raise TypeError(
            f"the (γλ)^(t−k) bound holds for the simple RNNCell only, got {type(cell).__name__}"
        )
    return jacobian_bound(spectral_norm(cell.weight_hh), steps, cell.nonlinearity)


class DerivativeSize(NamedTuple):
    """Entries of the tensor ``∂⁺s_k/∂W`` (``d × d × d``) and how many can be non-zero."""

    entries: int
    nonzero: int


def weight_derivative_size(d: int) -> DerivativeSize:
    """``∂⁺s_k/∂W`` has ``d³`` entries, at most ``d²`` non-zero (``p = q``).

    That is why the contribution of step ``k`` is stored as the ``d × d`` outer product
    ``(δ ⊙ σ'(a_k)) s_{k−1}ᵀ`` (``step_contributions``), never as the ``d³`` tensor.

    >>> weight_derivative_size(50)
    DerivativeSize(entries=125000, nonzero=2500)
    """
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    return DerivativeSize(d**3, d**2)


def real_steps(
    source: CellBase | Recurrent,
    x: Tensor,
    *,
    start: int = 0,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    batch_first: bool = True,
) -> Tensor:
    """Real steps between ``h_start`` and ``h_{start+j}``, ``(B, T + 1 − start)`` (int64).

    The exponent of the bound for masked batches: ``rnn_jacobian_bound(cell, counts)``.
    In reading order for a reverse direction.

    >>> from rnnkit import RNNCell
    >>> real_steps(RNNCell(2, 3), torch.zeros(1, 4, 2), mask=torch.tensor([[1, 0, 1, 1]]))
    tensor([[0, 1, 1, 2, 3]])
    """
    reverse = isinstance(source, Recurrent) and source.reverse
    mask_bt = resolve_mask(x, lengths, mask, batch_first=batch_first)
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    if mask_bt is None:
        mask_bt = torch.ones(B, T, dtype=torch.bool, device=x.device)
    if reverse:
        mask_bt = flip_sequences(mask_bt.T, mask_bt.T)[0].T  # reading order
    counts = mask_bt[:, start:].long().cumsum(dim=1)
    return torch.cat([counts.new_zeros(B, 1), counts], dim=1)
