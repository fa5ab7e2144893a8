"""The diagnostics of a layer built with zoneout, as it runs at evaluation (every real
step keeps ``p`` of the previous state): each figure against autograd through the layer
itself in ``eval()`` mode (float64)."""

from __future__ import annotations

import pytest
import torch

from rnnkit import GRU, LSTM, RNN
from rnnkit.diagnostics import (
    jacobian_norms,
    lag_contributions,
    state_gradients,
    step_contributions,
    step_jacobians,
)
from rnnkit.types import LSTMState

P = 0.3
CLASSES = [LSTM, GRU, RNN]
MASK = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)


def _layer(cls):
    torch.manual_seed(0)
    return cls(3, 4, zoneout=P).double().eval()


def _x():
    return torch.randn(2, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _state(cls, h: torch.Tensor):
    """``h (B, H)`` as the stack's initial state ``(L, D, B, H)``."""
    if cls is LSTM:
        return LSTMState(h[None, None], torch.zeros_like(h)[None, None])
    return h[None, None]


def _loss(h: torch.Tensor) -> torch.Tensor:
    return (h**2).sum()


@pytest.mark.parametrize("cls", CLASSES)
def test_weight_gradient_contributions_sum_to_the_layers_gradient(cls):
    layer, x = _layer(cls), _x()
    first = layer.layers[0]
    out = layer(x, mask=MASK).outputs
    want = torch.autograd.grad(_loss(out), first.cell.weight_hh)[0]
    steps = step_contributions(first, x, loss_fn=_loss, mask=MASK, zoneout=P)
    lags = lag_contributions(first, x, loss_fn=_loss, mask=MASK, zoneout=P)
    torch.testing.assert_close(steps.weight_hh.sum(0), want, atol=1e-13, rtol=1e-11)
    torch.testing.assert_close(lags.weight_hh.sum(0), want, atol=1e-13, rtol=1e-11)
    plain = step_contributions(first, x, loss_fn=_loss, mask=MASK)  # the cell's own steps
    assert not torch.allclose(plain.weight_hh.sum(0), want, atol=1e-6)


@pytest.mark.parametrize("cls", CLASSES)
def test_state_gradient_is_autograds(cls):
    layer, x = _layer(cls), _x()
    h0 = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    out = layer(x, mask=MASK, state=_state(cls, h0)).outputs
    want = torch.autograd.grad(_loss(out), h0)[0]
    got = state_gradients(layer.layers[0], x, loss_fn=_loss, mask=MASK, zoneout=P)[0][:, 0]
    torch.testing.assert_close(got, want, atol=1e-13, rtol=1e-11)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("method", ["exact", "power"])
def test_jacobian_norm_is_that_of_the_zoned_steps(cls, method):
    layer, x = _layer(cls), _x()[:, :3]

    def last(h: torch.Tensor) -> torch.Tensor:
        return layer(x, state=_state(cls, h)).outputs[:, -1]

    J = torch.autograd.functional.jacobian(last, torch.zeros(2, 4, dtype=torch.float64))
    want = torch.linalg.matrix_norm(torch.stack([J[b, :, b] for b in range(2)]), ord=2)
    got = jacobian_norms(layer.layers[0], x, zoneout=P, method=method)[:, -1]
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8)
    plain = jacobian_norms(layer.layers[0], x, method=method)[:, -1]
    assert not torch.allclose(plain, want, atol=1e-4)


def test_step_jacobian_is_p_identity_plus_the_rest_and_identity_when_masked():
    layer, x = _layer(RNN), _x()
    cell = layer.layers[0].cell
    J = step_jacobians(layer.layers[0], x, mask=MASK, zoneout=P)
    torch.testing.assert_close(J[2, 0], torch.eye(4, dtype=torch.float64))  # a hole
    # the first step from h_0 = 0: J = diag(φ′(a)) W_h, φ = tanh
    a = x[:, 0] @ cell.weight_ih.T + cell.weights().bias
    plain = (1 - torch.tanh(a) ** 2)[:, :, None] * cell.weight_hh
    want = P * torch.eye(4, dtype=torch.float64) + (1 - P) * plain
    torch.testing.assert_close(J[0], want, atol=1e-13, rtol=1e-11)


def test_zoneout_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="zoneout must be in"):
        jacobian_norms(_layer(RNN).layers[0], _x(), zoneout=1.0)
