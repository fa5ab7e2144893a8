"""Gradient through time: ‖∂L/∂h_k‖, ‖∂h_t/∂h_k‖₂ against autograd, and the bound."""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor

from rnnkit import GRUCell, LSTMCell, RNNCell
from rnnkit.diagnostics import (
    DerivativeSize,
    activation_gain,
    gradient_flow,
    jacobian_bound,
    jacobian_norms,
    real_steps,
    rnn_jacobian_bound,
    spectral_norm,
    state_gradient_norms,
    state_gradients,
    step_jacobians,
    weight_derivative_size,
)
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState

DT = torch.float64
MASK = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 1, 0], [0, 1, 1, 0, 0, 0, 0]]).bool()
CELLS = {
    "rnn_tanh": lambda: RNNCell(3, 4),
    "rnn_relu": lambda: RNNCell(3, 4, nonlinearity="relu"),
    "lstm": lambda: LSTMCell(3, 4),
    "gru_candidate_before": lambda: GRUCell(3, 4),
    "gru_keep_after": lambda: GRUCell(3, 4, update="keep", reset="after"),
}


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cell = CELLS[name]().to(DT)
    gen = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(*MASK.shape, 3, generator=gen, dtype=DT)
    return cell, x


def flat_run(cell, x: Tensor, s0: Tensor, mask: Tensor, start: int = 0) -> list[Tensor]:
    """Oracle: states ``s_start … s_T`` (flat, ``[h; c]`` for LSTM) from ``s_start = s0``."""
    H = cell.hidden_size
    s, out = s0, [s0]
    for t in range(start, x.shape[1]):
        if cell.is_lstm:
            new = cell(x[:, t], LSTMState(s[:, :H], s[:, H:]))
            new = torch.cat([new.h, new.c], dim=1)
        else:
            new = cell(x[:, t], s)
        s = torch.where(mask[:, t : t + 1], new, s)
        out.append(s)
    return out


def zero_state(cell, B: int) -> Tensor:
    return torch.zeros(B, cell.hidden_size * (2 if cell.is_lstm else 1), dtype=DT)


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


@pytest.mark.parametrize(
    ("nonlinearity", "scale", "method"),
    [
        ("tanh", 0.5, "exact"),
        ("tanh", 1.0, "exact"),
        ("tanh", 3.0, "exact"),
        ("relu", 0.5, "exact"),
        ("relu", 3.0, "exact"),
        ("tanh", 0.5, "power"),
        ("tanh", 3.0, "power"),
    ],
)
def test_measured_norms_never_exceed_the_bound(nonlinearity, scale, method) -> None:
    torch.manual_seed(1)
    cell = RNNCell(3, 6, nonlinearity=nonlinearity).to(DT)
    with torch.no_grad():
        cell.weight_hh.mul_(scale * 2.0)
    x = torch.randn(3, 7, 3, dtype=DT)
    for start in (0, 3):
        norms = jacobian_norms(cell, x, start=start, mask=MASK, method=method)
        # Masked steps hold the state (Jacobian I): the exponent counts real steps only.
        counts = real_steps(cell, x, start=start, mask=MASK)
        if start == 0:
            assert counts[1].tolist() == [0, 1, 1, 2, 3, 3, 4, 4]  # row 1: 1010110 → cumsum
        bound = rnn_jacobian_bound(cell, counts)
        assert bool((norms <= bound * (1 + 1e-12)).all()), (norms, bound)
        full = jacobian_norms(cell, x, start=start, method=method)  # no mask: t − k
        assert bool((full <= rnn_jacobian_bound(cell, range(8 - start)) * (1 + 1e-12)).all())
        assert torch.equal(norms[:, 0], torch.ones(3, dtype=DT))


# ---- Jacobian norms against autograd of the whole chain ---------------------------------
@pytest.mark.parametrize("name", list(CELLS))
def test_exact_norms_equal_the_autograd_jacobian(name: str) -> None:
    cell, x = make(name)
    B, T = MASK.shape
    H = cell.hidden_size
    start = 2
    with torch.no_grad():
        s_start = flat_run(cell, x, zero_state(cell, B), MASK)[start]
    for full_state in (False, True) if cell.is_lstm else (False,):
        width = s_start.shape[1] if full_state else H
        got = jacobian_norms(cell, x, start=start, mask=MASK, full_state=full_state)
        power = jacobian_norms(
            cell, x, start=start, mask=MASK, full_state=full_state, method="power"
        )
        for j, t in enumerate(range(start, T + 1)):
            J = torch.autograd.functional.jacobian(
                lambda s, t=t: flat_run(cell, x, s, MASK, start)[t - start], s_start
            )  # (B, S, B, S)
            for b in range(B):
                want = torch.linalg.matrix_norm(J[b, :width, b, :width], ord=2)
                assert float(got[b, j]) == pytest.approx(float(want), rel=1e-10, abs=1e-14)
                assert float(power[b, j]) <= float(want) * (1 + 1e-10)  # ‖Pv‖ never exceeds
                assert float(power[b, j]) == pytest.approx(float(want), rel=1e-6, abs=1e-12)


def test_step_jacobians_hold_at_masked_steps() -> None:
    cell, x = make("gru_candidate_before")
    J = step_jacobians(cell, x, mask=MASK)
    assert J.shape == (7, 3, 4, 4)
    eye = torch.eye(4, dtype=DT)
    for t, b in torch.nonzero(~MASK.T).tolist():
        assert torch.equal(J[t, b], eye)
    norms = jacobian_norms(cell, x, mask=MASK)
    assert float(norms[2, 4]) == float(norms[2, 7])  # row 2 ends at position 2: held


def test_power_iteration_large_hidden() -> None:
    torch.manual_seed(0)
    cell = RNNCell(3, 24).to(DT)
    x = torch.randn(2, 4, 3, dtype=DT)
    exact = jacobian_norms(cell, x)
    power = jacobian_norms(cell, x, method="power")
    torch.testing.assert_close(power, exact, rtol=1e-6, atol=1e-12)
    with pytest.raises(ValueError, match="method"):
        jacobian_norms(cell, x, method="svd")
    with pytest.raises(ValueError, match="start"):
        jacobian_norms(cell, x, start=5)


# ---- ∂L/∂h_k --------------------------------------------------------------------------
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", ["rnn_tanh", "lstm", "gru_keep_after"])
def test_state_gradients_equal_autograd(name: str, reverse: bool) -> None:
    cell, x = make(name, seed=4)
    B, T = MASK.shape
    H = cell.hidden_size
    R = torch.randn(B, T, H, dtype=DT, generator=torch.Generator().manual_seed(9))

    def loss(h: Tensor) -> Tensor:
        return (R * h).sum() + (h**3).sum()

    s0 = torch.randn(B, H * (2 if cell.is_lstm else 1), dtype=DT)
    state = LSTMState(s0[:, :H], s0[:, H:]) if cell.is_lstm else s0
    got = state_gradients(Recurrent(cell, reverse), x, loss_fn=loss, mask=MASK, state=state)
    # Oracle: per row, read in the direction's order; keep every state's gradient.
    want = [torch.zeros(B, T + 1, H, dtype=DT) for _ in got]
    for b in range(B):
        real = [t for t in range(T) if MASK[b, t]]
        extent = real[-1] + 1 if real else 0
        order = [extent - 1 - j if j < extent else j for j in range(T)] if reverse else range(T)
        s = s0[b : b + 1].clone().requires_grad_(True)
        states, cur, total = [s], s, 0.0
        for pos in order:
            new = flat_run(cell, x[b : b + 1, pos : pos + 1], cur, MASK[b : b + 1, pos : pos + 1])
            cur = new[-1]
            cur.retain_grad()
            states.append(cur)
            h = cur[:, :H]
            total = total + (R[b, pos] * h).sum() + (h**3).sum()  # loss's term of output pos
        total.backward()
        for j, pos in enumerate(order):
            g = states[j + 1].grad
            for k, w in enumerate(want):
                w[b, pos + 1] = g[0, k * H : (k + 1) * H]
        for k, w in enumerate(want):
            w[b, 0] = s.grad[0, k * H : (k + 1) * H]
    assert len(got) == (2 if cell.is_lstm else 1)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    norms = state_gradient_norms(Recurrent(cell, reverse), x, loss_fn=loss, mask=MASK, state=state)
    torch.testing.assert_close(norms, want[0].norm(dim=(0, 2)), rtol=1e-12, atol=0)


def test_gradient_flow_bundle_is_json_ready() -> None:
    cell, x = make("rnn_tanh")
    flow = gradient_flow(cell, x, loss_fn=lambda h: h.sum(), mask=MASK, start=1)
    assert flow.state_grad_norms.shape == (8,)
    assert flow.jacobian_norms.shape == flow.bound.shape == flow.real_steps.shape == (3, 7)
    assert flow.weight_norm == pytest.approx(spectral_norm(cell.weight_hh))
    assert bool((flow.jacobian_norms <= flow.bound * (1 + 1e-12)).all())
    assert flow.real_steps[2].tolist() == [0, 1, 2, 2, 2, 2, 2]
    data = json.loads(json.dumps(flow.to_dict()))
    assert data["start"] == 1 and len(data["bound"][0]) == 7
    lstm, x = make("lstm")
    flow = gradient_flow(lstm, x, loss_fn=lambda h: h.sum(), method="power")
    assert flow.bound is None and json.dumps(flow.to_dict())
