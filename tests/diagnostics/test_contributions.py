"""Per-step and per-lag contributions: they add up to the gradient, and each one is right.

The oracle gives every step of every sequence its OWN copy of the weights (the "dummy
variables" of Goodfellow et al., *Deep Learning*, §10.2.2) in a plain autograd loop over
the cells' differentiable step functions; the gradient of copy k is the contribution of
step k. Sequences are run one at a time so a reverse direction can be read back from each
row's own last step.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import Tensor

from rnnkit import GRUCell, LSTMCell, RNNCell
from rnnkit.cells.layer_norm import LayerNormGRUCell, LayerNormLSTMCell
from rnnkit.diagnostics import Contributions, lag_contributions, step_contributions
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState

DT = torch.float64
VARIANTS = {
    "rnn_tanh": lambda: RNNCell(3, 4),
    "rnn_relu": lambda: RNNCell(3, 4, nonlinearity="relu"),
    "lstm": lambda: LSTMCell(3, 4),
    "gru_candidate_before": lambda: GRUCell(3, 4),
    "gru_candidate_after": lambda: GRUCell(3, 4, reset="after"),
    "gru_keep_before": lambda: GRUCell(3, 4, update="keep"),
    "gru_keep_after": lambda: GRUCell(3, 4, update="keep", reset="after"),
    # the loop reads ν(x W_xᵀ) γ_x: W_x's and the gains' shares pass through ν
    "ln_lstm": lambda: LayerNormLSTMCell(3, 4),
    "ln_gru_candidate": lambda: LayerNormGRUCell(3, 4),
    "ln_gru_keep": lambda: LayerNormGRUCell(3, 4, update="keep"),
}
# Holes, trailing padding, a leading hole, and position 4 masked in every row.
MASK = torch.tensor([[1, 1, 1, 1, 0, 1], [1, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.bool)


def make(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cell = VARIANTS[name]().to(DT)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # gains away from 1 and shifts away from 0, as after training
        for p in cell.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen, dtype=DT))
    B, T = MASK.shape
    x = torch.randn(B, T, 3, generator=gen, dtype=DT)
    R = torch.randn(B, T, 4, generator=gen, dtype=DT)
    s0 = torch.randn(B, 4, generator=gen, dtype=DT)
    state = LSTMState(s0, 0.5 * s0) if cell.is_lstm else s0
    return cell, x, R, state


def oracle(cell, x, R, state, mask, reverse=False, window=None):
    """Per-step and per-lag gradients of ``L = Σ_t ⟨R_t, h_t⟩ + ½‖h_t‖²`` by autograd: the
    cell's own step (``functional_call``) with a copy of every parameter per step.

    Returns ``(steps, lags)``: dicts parameter name → ``(T, ·)``, positions in original
    order.
    """
    B, T, _ = x.shape
    base = {n: p.detach() for n, p in cell.named_parameters()}
    steps = {n: torch.zeros(T, *p.shape, dtype=DT) for n, p in base.items()}
    lags = {n: torch.zeros_like(t) for n, t in steps.items()}
    for b in range(B):
        real = [t for t in range(T) if mask[b, t]]
        extent = real[-1] + 1 if real else 0
        order = list(range(T))
        if reverse:
            order = [extent - 1 - j if j < extent else j for j in range(T)]
        copies = [{n: p.clone().requires_grad_() for n, p in base.items()} for _ in range(T)]
        s = tuple(state) if cell.is_lstm else (state,)
        s = tuple(v[b : b + 1] for v in s)
        hs = []
        for j in range(T):  # reading step j is position order[j]
            pos = order[j]
            prev = LSTMState(*s) if cell.is_lstm else s[0]
            new = torch.func.functional_call(cell, copies[j], (x[b : b + 1, pos], prev))
            new = tuple(new) if cell.is_lstm else (new,)
            s = new if mask[b, pos] else s
            hs.append(s[0])
        for t in range(T):  # the loss at reading step t, alone
            pos_t = order[t]
            h = hs[t]
            loss = (R[b, pos_t] * h[0]).sum() + 0.5 * (h * h).sum()
            if not loss.requires_grad:  # nothing real read yet: the initial state held
                continue
            params = [p for c in copies for p in c.values()]
            grads = iter(torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True))
            for j, c in enumerate(copies):
                for n in c:
                    g = next(grads)
                    if g is None or j > t:
                        continue
                    if window is not None and t - j > window:  # BPTT(τ): lags 0 … τ
                        continue
                    steps[n][order[j]] += g
                    lags[n][t - j] += g
    return steps, lags


def loss_fn_for(R: Tensor):
    return lambda h: (R * h).sum() + 0.5 * (h * h).sum()


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_contributions_match_per_copy_autograd(variant: str, reverse: bool) -> None:
    cell, x, R, state = make(variant)
    source = Recurrent(cell, reverse=reverse)
    steps = step_contributions(source, x, loss_fn=loss_fn_for(R), mask=MASK, state=state)
    lags = lag_contributions(source, x, loss_fn=loss_fn_for(R), mask=MASK, state=state)
    want_steps, want_lags = oracle(cell, x, R, state, MASK, reverse)
    assert set(steps.parameters()) == set(want_steps)
    for name, want in want_steps.items():
        torch.testing.assert_close(steps.parameters()[name], want, rtol=0, atol=1e-10)
        torch.testing.assert_close(lags.parameters()[name], want_lags[name], rtol=0, atol=1e-10)
        # Both splits add up to the same total.
        torch.testing.assert_close(steps.total()[name], lags.total()[name], rtol=0, atol=1e-10)
    # Position 4 is padding in every row: its copy of the weights gets exactly nothing.
    for t in steps.parameters().values():
        assert torch.count_nonzero(t[4]) == 0


@pytest.mark.parametrize("variant", ["lstm", "ln_lstm", "ln_gru_keep"])
def test_sum_equals_the_layer_gradient_float64(variant: str) -> None:
    """The sum of the contributions is the gradient the layer's explicit BPTT computes."""
    cell, x, R, state = make(variant, seed=3)
    mask = MASK.clone()
    mask[2, 0] = True  # the layer itself needs each row to start with a real step
    loss = loss_fn_for(R)
    c = step_contributions(cell, x, loss_fn=loss, mask=mask, state=state)
    out, _ = Recurrent(cell)(x.transpose(0, 1), mask.T, state)
    loss(out.transpose(0, 1)).backward()
    for name, total in c.total().items():
        torch.testing.assert_close(total, getattr(cell, name).grad, rtol=0, atol=1e-10)


def test_d_outputs_equals_loss_fn_and_one_of_them_is_required() -> None:
    cell, x, R, state = make("gru_keep_after")
    h = Recurrent(cell)(x.transpose(0, 1), MASK.T, state)[0].transpose(0, 1).detach()
    by_fn = step_contributions(cell, x, loss_fn=loss_fn_for(R), mask=MASK, state=state)
    by_grad = step_contributions(cell, x, R + h, mask=MASK, state=state)
    for name, t in by_fn.parameters().items():
        torch.testing.assert_close(t, by_grad.parameters()[name], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="exactly one"):
        step_contributions(cell, x, R, loss_fn=loss_fn_for(R))
    with pytest.raises(ValueError, match="exactly one"):
        lag_contributions(cell, x)
    with pytest.raises(ValueError, match="d_outputs must match"):
        step_contributions(cell, x, R[:, :2])


def test_window_truncates_exactly() -> None:
    cell, x, R, state = make("rnn_tanh", seed=5)
    window = 2
    steps = step_contributions(
        cell, x, loss_fn=loss_fn_for(R), mask=MASK, state=state, window=window
    )
    lags = lag_contributions(cell, x, loss_fn=loss_fn_for(R), mask=MASK, state=state, window=window)
    want_steps, want_lags = oracle(cell, x, R, state, MASK, window=window)
    for name, want in want_steps.items():
        torch.testing.assert_close(steps.parameters()[name], want, rtol=0, atol=1e-10)
        torch.testing.assert_close(lags.parameters()[name], want_lags[name], rtol=0, atol=1e-10)
    assert torch.count_nonzero(lags.weight_hh[window + 1 :]) == 0  # nothing longer than τ
    assert torch.count_nonzero(lags.weight_hh[window]) > 0  # ... and lag τ itself is there
    # ... and the total is the layer's own BPTT(τ).
    mask = MASK.clone()
    mask[2, 0] = True
    c = step_contributions(cell, x, loss_fn=loss_fn_for(R), mask=mask, state=state, window=2)
    cell.zero_grad()
    out, _ = Recurrent(cell)(x.transpose(0, 1), mask.T, state, window=2)
    loss_fn_for(R)(out.transpose(0, 1)).backward()
    torch.testing.assert_close(c.total()["weight_hh"], cell.weight_hh.grad, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", ["ln_lstm", "ln_gru_keep"])
def test_window_truncates_exactly_through_layer_normalisation(variant: str) -> None:
    """BPTT(τ) of a layer-normalised cell: its recurrent gradients are wider than its gate
    gradients (they were written into the gates' buffer, a size error)."""
    cell, x, R, state = make(variant, seed=5)
    loss = loss_fn_for(R)
    steps = step_contributions(cell, x, loss_fn=loss, mask=MASK, state=state, window=2)
    lags = lag_contributions(cell, x, loss_fn=loss, mask=MASK, state=state, window=2)
    want_steps, want_lags = oracle(cell, x, R, state, MASK, window=2)
    for name, want in want_steps.items():
        torch.testing.assert_close(steps.parameters()[name], want, rtol=0, atol=1e-10)
        torch.testing.assert_close(lags.parameters()[name], want_lags[name], rtol=0, atol=1e-10)
    assert torch.count_nonzero(lags.gamma_hh[3:]) == 0  # nothing longer than τ


def test_norms_and_json() -> None:
    cell, x, R, state = make("lstm")
    c = step_contributions(cell, x, loss_fn=loss_fn_for(R), mask=MASK, state=state)
    assert isinstance(c, Contributions) and c.axis == "step"
    norms = c.norms()
    assert set(norms) == {"weight_ih", "weight_hh", "bias"}
    for k in range(x.shape[1]):
        assert float(norms["weight_hh"][k]) == pytest.approx(float(c.weight_hh[k].norm()))
    data = json.loads(json.dumps(c.to_dict()))
    assert data["axis"] == "step" and len(data["norms"]["bias"]) == x.shape[1]
    assert data["total_norms"]["bias"] == pytest.approx(float(c.bias.sum(0).norm()))


def test_one_unit_demo_signs_cancel() -> None:
    """A one-unit network, worked by hand: the bars add up to the total (a numerical
    derivative checks it), and they can have different signs."""
    cell = RNNCell(1, 1).to(DT)
    with torch.no_grad():
        cell.weight_ih.fill_(1.0)
        cell.weight_hh.fill_(-0.9)
        cell.bias.zero_()
    x = torch.tensor([[[1.0], [0.5], [-1.0], [0.2]]], dtype=DT)

    def loss(h: Tensor) -> Tensor:
        return h[:, -1].sum()

    c = step_contributions(cell, x, loss_fn=loss)
    bars = c.weight_hh.view(-1)
    assert bool((bars > 0).any()) and bool((bars < 0).any())

    def run(w: float) -> float:
        with torch.no_grad():
            cell.weight_hh.fill_(w)
            out, _ = Recurrent(cell)(x.transpose(0, 1))
        return float(loss(out.transpose(0, 1)))

    eps = 1e-6
    numeric = (run(-0.9 + eps) - run(-0.9 - eps)) / (2 * eps)
    assert float(bars.sum()) == pytest.approx(numeric, abs=1e-8)


def test_rejects_what_is_not_a_cell() -> None:
    with pytest.raises(TypeError, match="Recurrent"):
        step_contributions(torch.nn.Linear(3, 4), torch.zeros(1, 2, 3), loss_fn=torch.sum)
    with pytest.raises(ValueError, match=r"\(B, T, I\)"):
        step_contributions(RNNCell(3, 4), torch.zeros(1, 2, 5), loss_fn=torch.sum)
    with pytest.raises(TypeError, match="float64"):
        step_contributions(RNNCell(3, 4), torch.zeros(1, 2, 3, dtype=DT), loss_fn=torch.sum)


@pytest.mark.parametrize("window", [0, -3, 1.5, True])
def test_a_window_below_one_is_refused_as_the_layers_refuse_it(window):
    # 0 gave other contributions than τ = 1 and -3 all zeros, without a word.
    cell, x = RNNCell(2, 3), torch.randn(2, 4, 2)
    for diagnose in (step_contributions, lag_contributions):
        with pytest.raises(
            ValueError, match=f"window must be a positive integer or None, got {window!r}"
        ):
            diagnose(cell, x, loss_fn=lambda h: h.sum(), window=window)


@pytest.mark.parametrize("shape", [(2, 0, 2), (0, 4, 2)])
def test_no_step_or_no_sequence_is_named_not_a_reshape_error(shape):
    from rnnkit.diagnostics import gradient_flow, state_gradients

    cell, x = LSTMCell(2, 3), torch.randn(*shape)
    for diagnose in (step_contributions, state_gradients, gradient_flow):
        with pytest.raises(ValueError, match=f"x holds {shape[0]} sequences of {shape[1]} steps"):
            diagnose(cell, x, loss_fn=lambda h: h.sum())


@pytest.mark.parametrize("window", [None, 2])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("variant", ["rnn_tanh", "lstm", "gru_keep_after", "ln_lstm"])
def test_a_loss_of_the_final_state_too(variant: str, reverse: bool, window) -> None:
    """``reads_final``: the loss reads the direction's final state as well (a classifier
    of the last state, a decoder started from it). The contributions add up to the
    layer's own backward of that loss (BPTT(τ) with a window), lag by lag as step by step,
    and the initial state's gradient is the layer's."""
    from rnnkit.diagnostics import state_gradients

    cell, x, R, state = make(variant, seed=7)
    mask = MASK.clone()
    mask[2, 0] = True  # the layer needs each row to start with a real step
    gen = torch.Generator().manual_seed(3)
    Rf = [torch.randn(3, 4, generator=gen, dtype=DT) for _ in range(2 if cell.is_lstm else 1)]

    def loss(h: Tensor, final) -> Tensor:
        parts = tuple(final) if cell.is_lstm else (final,)
        return loss_fn_for(R)(h) + sum((r * p).sum() for r, p in zip(Rf, parts, strict=True))

    source = Recurrent(cell, reverse=reverse)
    kw = {"mask": mask, "state": state, "window": window, "reads_final": True}
    steps = step_contributions(source, x, loss_fn=loss, **kw)
    lags = lag_contributions(source, x, loss_fn=loss, **kw)
    s0 = tuple(s.clone().requires_grad_(True) for s in (state if cell.is_lstm else (state,)))
    out, final = source(
        x.transpose(0, 1), mask.T, LSTMState(*s0) if cell.is_lstm else s0[0], window
    )
    loss(out.transpose(0, 1), final).backward()
    for name, total in steps.total().items():
        torch.testing.assert_close(total, getattr(cell, name).grad, rtol=0, atol=1e-10)
        torch.testing.assert_close(lags.total()[name], total, rtol=0, atol=1e-10)
    if window is None:
        grads = state_gradients(source, x, loss_fn=loss, mask=mask, state=state, reads_final=True)
        for g, s in zip(grads, s0, strict=True):
            torch.testing.assert_close(g[:, 0], s.grad, rtol=0, atol=1e-10)


def test_reads_final_takes_a_loss_function() -> None:
    cell, x, R, _ = make("rnn_tanh")
    with pytest.raises(ValueError, match="reads_final=True takes loss_fn"):
        step_contributions(cell, x, R, reads_final=True)
