"""∂L/∂h_k for every state against autograd, forward and reverse, over a masked batch."""

from __future__ import annotations

import pytest
import torch
from jacobian_cases import DT, MASK, flat_run, make
from torch import Tensor

from rnnkit.diagnostics import state_gradient_norms, state_gradients
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("name", ["rnn_tanh", "lstm", "gru_keep_after", "ln_lstm", "ln_gru"])
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
