"""``backward_sweep`` and ``windowed_sweep`` are gradient computations: called where
autograd records (weights that require grad, as every module's do, outside
``torch.no_grad``) they compute what they compute under ``no_grad`` and build no graph."""

from __future__ import annotations

import pytest
import torch

import rnnkit
from rnnkit.bptt import WindowUnit, backward_sweep, forward_pass, windowed_sweep


@pytest.mark.parametrize("window", [None, 1, 2])
@pytest.mark.parametrize("make", [rnnkit.LSTMCell, rnnkit.GRUCell, rnnkit.RNNCell])
def test_a_sweep_outside_no_grad_equals_the_sweep_under_it(make, window):
    torch.manual_seed(0)
    cell = make(3, 4).double()
    T, B = 6, 2
    x = torch.randn(T, B, 3, dtype=torch.float64)
    h0 = tuple(torch.zeros(B, 4, dtype=torch.float64) for _ in range(cell.kernel.num_states))
    mask = torch.ones(T, B, 1, dtype=torch.bool)
    mask[2, 0] = False  # a hole
    w = cell.weights()
    assert w.weight_hh.requires_grad
    record = forward_pass(cell.kernel, x, w, h0, mask, True)
    d_out = torch.randn(T, B, 4, dtype=torch.float64)
    d_finals = (None,) * len(h0)
    with torch.no_grad():
        expected = backward_sweep(cell.kernel, record, w, mask, d_out, d_finals, window)
    got = backward_sweep(cell.kernel, record, w, mask, d_out, d_finals, window)
    assert not got.d_xp.requires_grad
    torch.testing.assert_close(got.d_xp, expected.d_xp, rtol=0, atol=0)
    for a, b in zip(got.d_states0, expected.d_states0, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if window is not None:
        unit = WindowUnit(cell.kernel, record, w, mask)
        direct = windowed_sweep([[unit]], d_out, [[d_finals]], window)[0][0]
        torch.testing.assert_close(direct.d_xp, expected.d_xp, rtol=0, atol=0)
