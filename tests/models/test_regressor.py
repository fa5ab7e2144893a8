"""The regressor's losses against hand-written formulas, masking, and its two targets."""

from __future__ import annotations

import math

import pytest
import torch

from rnnkit import GRU, LSTM
from rnnkit.models.regressor import LOG_VAR_MAX, Regressor

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


def test_a_gaussian_log_variance_beyond_float32_is_clamped():
    """A head whose ln σ² is 100 somewhere: exp overflowed float32 (a variance of inf, the
    likelihood inf). It is clamped to LOG_VAR_MAX, whose exp float32 holds; the loss is
    the full likelihood at that variance, and its gradient at the clamped entries is 0."""
    torch.manual_seed(0)
    m = Regressor(GRU(2, 5), 2, "next", "gaussian")  # float32, as trained
    with torch.no_grad():
        m.head.bias[2] = 100.0  # the first dimension's ln σ²
    x, y = torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    out = m(x)
    assert (out.log_var[..., 0] == LOG_VAR_MAX).all() and (out.log_var[..., 1] < 10).all()
    assert torch.isfinite(out.log_var.exp()).all()
    assert math.exp(LOG_VAR_MAX) < torch.finfo(torch.float32).max < math.exp(LOG_VAR_MAX + 1)
    lv, mu = out.log_var.double(), out.mean.double()
    want = 0.5 * (math.log(2 * math.pi) + lv + (y.double() - mu) ** 2 / lv.exp())
    loss = m.loss(x, y).loss
    torch.testing.assert_close(loss.double(), want.mean(), rtol=1e-5, atol=1e-6)
    loss.backward()
    assert torch.isfinite(m.head.bias.grad).all() and m.head.bias.grad[2] == 0


@pytest.mark.parametrize("loss", ["mse", "gaussian"])
@pytest.mark.parametrize("target", ["next", "value"])
def test_the_loss_inside_a_training_step_equals_the_loss_read_at_once(loss, target, monkeypatch):
    """Inside ``deferring`` (the Trainer's step) the loss is computed over every element
    with the padded ones neutralised, and its figures stay on the device: the same loss,
    gradients, summed error and count; NaN targets at padded steps reach neither."""
    from rnnkit import deferred as deferred_module
    from rnnkit.deferred import deferring

    monkeypatch.setattr(deferred_module, "waits", lambda tensor: True)  # as on a GPU
    m = make(target, loss)
    x = torch.randn(3, 4, 2, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    y = torch.randn(3, 4, 2, dtype=DT) if target == "next" else torch.randn(3, 3, dtype=DT)
    if target == "next":
        y[~mask] = float("nan")
    eager = m.loss(x, y, mask)
    grads = torch.autograd.grad(eager.loss, list(m.parameters()))
    with deferring() as deferred:
        late = m.loss(x, y, mask)
        nats, tokens = deferred.read(late.nats, late.tokens)
    torch.testing.assert_close(late.loss, eager.loss, rtol=1e-12, atol=1e-14)
    assert nats == pytest.approx(eager.nats, rel=1e-12) and tokens == eager.tokens
    for g, want in zip(torch.autograd.grad(late.loss, list(m.parameters())), grads, strict=True):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("target", "loss"), [("next", "mse"), ("value", "gaussian")])
def test_loss_of_an_output_equals_the_loss(target, loss):
    """``loss_of`` scores an output already computed as ``loss`` scores the inputs."""
    m = make(target, loss)
    x = torch.randn(3, 4, 2, dtype=DT)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    y = torch.randn(3, 4, 2, dtype=DT) if target == "next" else torch.randn(3, 3, dtype=DT)
    got, want = m.loss_of(m(x, mask), y, mask), m.loss(x, y, mask)
    torch.testing.assert_close(got.loss, want.loss, rtol=0, atol=0)
    assert (got.nats, got.tokens) == (want.nats, want.tokens)
