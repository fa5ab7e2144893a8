"""The regressor's losses against hand-written formulas, masking, and its two targets."""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit import GRU, LSTM
from rnnkit.models.regressor import Regressor

DT = torch.float64


def make(target="next", loss="mse", bidirectional=False):
    torch.manual_seed(0)
    enc = GRU(2, 5, bidirectional=bidirectional).to(DT)
    return Regressor(enc, 2 if target == "next" else 3, target, loss).to(DT)


def test_mse_is_the_mean_squared_error_over_real_steps():
    m = make()
    x = torch.randn(3, 4, 2, dtype=DT)
    y = torch.randn(3, 4, 2, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    out = m.loss(x, y, mask)
    mean = m(x, mask).mean
    want = sum(
        ((mean[b, t] - y[b, t]) ** 2).sum() for b in range(3) for t in range(4) if mask[b, t]
    )
    assert out.tokens == 7 * 2
    torch.testing.assert_close(out.loss, want / 14, rtol=1e-12, atol=1e-14)
    # padding never counts: garbage there changes nothing
    x2, y2 = x.clone(), y.clone()
    x2[~mask], y2[~mask] = 1e6, -1e6
    torch.testing.assert_close(m.loss(x2, y2, mask).loss, out.loss, rtol=1e-12, atol=1e-14)


def test_gaussian_loss_is_the_full_negative_log_likelihood():
    m = make(loss="gaussian")
    x, y = torch.randn(2, 3, 2, dtype=DT), torch.randn(2, 3, 2, dtype=DT)
    out = m(x)
    var = out.log_var.exp()
    nll = 0.5 * (math.log(2 * math.pi) + out.log_var + (y - out.mean) ** 2 / var)
    torch.testing.assert_close(m.loss(x, y).loss, nll.mean(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_value_target_reads_the_state_after_the_last_real_step(bidirectional):
    m = make("value", bidirectional=bidirectional)
    x = torch.randn(2, 5, 2, dtype=DT)
    mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0]], dtype=torch.bool)
    got = m(x, mask).mean
    short = m(x[1:, :2]).mean  # the second row alone, without its padding
    torch.testing.assert_close(got[1:], short, rtol=1e-12, atol=1e-12)
    assert got.shape == (2, 3)


def test_next_value_prediction_refuses_a_bidirectional_encoder():
    with pytest.raises(ValueError, match="causal"):
        Regressor(LSTM(2, 4, bidirectional=True), 2, "next")
