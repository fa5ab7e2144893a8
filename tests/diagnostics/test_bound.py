"""The bound (γλ)^(t−k) on ‖∂h_t/∂h_k‖₂: its worked numbers and its arguments."""

from __future__ import annotations

import pytest
import torch

from rnnkit import LSTMCell
from rnnkit.diagnostics import (
    DerivativeSize,
    activation_gain,
    jacobian_bound,
    rnn_jacobian_bound,
    spectral_norm,
    weight_derivative_size,
)


# ---- the bound and its worked numbers ---------------------------------------------------
def test_spec_numbers() -> None:
    assert float(jacobian_bound(0.8, 20)) == pytest.approx(0.0115, abs=5e-5)
    assert float(jacobian_bound(0.8, 20)) == pytest.approx(0.8**20, rel=1e-12)
    assert float(jacobian_bound(0.8, 20, "logistic")) == pytest.approx(1.0e-14, rel=0.05)
    assert float(jacobian_bound(0.8, 20, "logistic")) == pytest.approx(0.2**20, rel=1e-12)
    assert weight_derivative_size(50) == DerivativeSize(125_000, 2_500)
    assert (activation_gain("tanh"), activation_gain("relu")) == (1.0, 1.0)
    assert activation_gain("sigmoid") == activation_gain("logistic") == 0.25
    assert jacobian_bound(2.0, [0, 1, 3]).tolist() == [1.0, 2.0, 8.0]
    # Worked numbers: 0.9^20 ≈ 0.12, 0.9^50 ≈ 0.005, 1.1^50 ≈ 117.
    assert float(jacobian_bound(0.9, 20)) == pytest.approx(0.12, abs=0.005)
    assert float(jacobian_bound(1.1, 50)) == pytest.approx(117, abs=1)


def test_bound_arguments() -> None:
    with pytest.raises(ValueError, match="activation"):
        jacobian_bound(1.0, 3, "softsign")
    with pytest.raises(ValueError, match="positive integer"):
        weight_derivative_size(0)
    with pytest.raises(TypeError, match="simple RNNCell"):
        rnn_jacobian_bound(LSTMCell(2, 3), 4)
    with pytest.raises(ValueError, match="2-D"):
        spectral_norm(torch.ones(3))
    W = torch.tensor([[3.0, 0.0], [4.0, 0.0]])  # rank one, σ = 5
    assert spectral_norm(W) == pytest.approx(5.0)
