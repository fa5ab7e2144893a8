"""The one time loop (``run_recurrence``) against the plain autograd oracle, for every cell.

* the explicit BPTT equals autograd through the oracle step loop (float64, 1e-10), with a
  mask that has holes and a zero-length row;
* ``torch.autograd.gradcheck`` on every input, parameter and the initial state;
* hold-state semantics: zero-length rows keep the initial state, holes hold the state;
* windowed BPTT(τ) equals autograd of the explicitly truncated graph (docs/math.md,
  "Truncation"), and τ ≥ T equals full BPTT.
"""

from __future__ import annotations

import pytest
import torch
from torch.autograd.function import BackwardCFunction

import rnnkit.nn
from rnnkit import RNNCell
from rnnkit.bptt.recurrence import run_recurrence
from rnnkit.cells.kernel import Weights
from rnnkit.diagnostics.contributions import step_contributions
from rnnkit.errors import ConfigError

pytestmark = pytest.mark.usefixtures("single_thread", "time_loop")

DT = torch.float64
TOL = {"atol": 1e-10, "rtol": 0.0}
T, B, I, H = 6, 4, 3, 4


def params_of(cell) -> list[torch.Tensor]:
    return [p for p in cell.weights() if p is not None]


def make_case(spec, gen, seed=0):
    cell = spec.cell(I, H, seed=seed)
    x = torch.randn(T, B, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = tuple(
        torch.randn(B, H, generator=gen, dtype=DT, requires_grad=True)
        for _ in range(spec.num_states)
    )
    g_out = torch.randn(T, B, H, generator=gen, dtype=DT)
    g_fin = tuple(torch.randn(B, H, generator=gen, dtype=DT) for _ in range(spec.num_states))
    return cell, x, s0, g_out, g_fin


def loss_of(out, finals, g_out, g_fin):
    loss = (out * g_out).sum()
    for f, g in zip(finals, g_fin, strict=True):
        loss = loss + (f * g).sum()
    return loss


def grads(loss, cell, x, s0, retain=False):
    return torch.autograd.grad(loss, [x, *s0, *params_of(cell)], retain_graph=retain)


def graph_has_custom_function(t: torch.Tensor) -> bool:
    seen, todo = set(), [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, BackwardCFunction):
            return True
        todo.extend(n for n, _ in node.next_functions)
    return False


# ---------------------------------------------------------------- explicit BPTT = oracle


@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "holes"])
def test_explicit_backward_equals_autograd_of_step_loop(cell_spec, gen, holey_mask, masked):
    cell, x, s0, g_out, g_fin = make_case(cell_spec, gen)
    mask = holey_mask.T if masked else None  # (T, B)
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    assert graph_has_custom_function(out), "gradients must come from the explicit BPTT"
    got = grads(loss_of(out, finals, g_out, g_fin), cell, x, s0)

    ref_out, ref_finals = cell_spec.run(cell, x, s0, mask)
    want = grads(loss_of(ref_out, ref_finals, g_out, g_fin), cell, x, s0)

    torch.testing.assert_close(out, ref_out, **TOL)
    for a, b in zip(finals, ref_finals, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    names = ["x"] + [f"state0[{k}]" for k in range(len(s0))] + ["w_ih", "w_hh", "b", "b_hn"]
    for name, a, b in zip(names, got, want, strict=False):
        torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"grad of {n}: {m}")


def test_masked_steps_contribute_nothing(cell_spec, gen, holey_mask):
    """A loss only on a zero-length row gives zero weight and input gradients."""
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    mask = holey_mask.T
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    loss = out[:, 2].sum() + finals[0][2].sum()  # row 2 has no real step
    g = grads(loss, cell, x, s0)
    for p_grad in [g[0], *g[1 + len(s0) :]]:
        assert torch.count_nonzero(p_grad) == 0
    # the gradient passes straight through to the initial state: T outputs + the final
    assert torch.equal(g[1][2], torch.full((H,), T + 1.0, dtype=DT))


def test_only_output_or_only_final_gradient(cell_spec, gen, holey_mask):
    """Backward with a gradient on the outputs only, or on the final state only."""
    cell, x, s0, g_out, g_fin = make_case(cell_spec, gen)
    mask = holey_mask.T
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    ref_out, ref_finals = cell_spec.run(cell, x, s0, mask)
    for pick in (lambda o, f: (o * g_out).sum(), lambda o, f: (f[-1] * g_fin[-1]).sum()):
        got = grads(pick(out, finals), cell, x, s0, retain=True)
        want = grads(pick(ref_out, ref_finals), cell, x, s0, retain=True)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, **TOL)


def test_no_grad_forward_equals_grad_forward(cell_spec, gen, holey_mask):
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    mask = holey_mask.T
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    with torch.no_grad():
        out2, finals2 = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    assert torch.equal(out, out2)
    for a, b in zip(finals, finals2, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------- gradcheck


def _recurrence_of_all_inputs(cell_spec, gen, mask, I, H):
    """``(f, inputs)``: ``run_recurrence`` of a fresh cell as a function of the input, the
    initial states and every parameter (float64, all requiring gradients)."""
    T, B = mask.shape
    cell = cell_spec.cell(I, H)
    x = torch.randn(T, B, I, generator=gen, dtype=DT, requires_grad=True)
    s0 = [torch.randn(B, H, generator=gen, dtype=DT) for _ in range(cell_spec.num_states)]
    params = [p.detach().clone().requires_grad_() for p in params_of(cell)]
    n_s = len(s0)

    def f(x, *rest):
        states0, ps = tuple(rest[:n_s]), list(rest[n_s:])
        w = Weights(ps[0], ps[1], ps[2], ps[3] if len(ps) > 3 else None)
        out, finals = run_recurrence(cell.kernel, x, w, states0, mask)
        return (out, *finals)

    return f, (x, *(s.requires_grad_() for s in s0), *params)


def test_gradcheck_run_recurrence(cell_spec, gen):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], dtype=torch.bool)
    f, inputs = _recurrence_of_all_inputs(cell_spec, gen, mask, I=2, H=3)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_gradgradcheck_run_recurrence(cell_spec, gen):
    """A gradient taken with create_graph=True is itself differentiable (gradient
    penalties, Hessians): second derivatives against finite differences."""
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 0]], dtype=torch.bool)
    f, inputs = _recurrence_of_all_inputs(cell_spec, gen, mask, I=2, H=2)
    assert torch.autograd.gradgradcheck(f, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_a_batch_of_incoming_gradients_gives_each_ones_gradients(cell_spec, gen, holey_mask):
    """``is_grads_batched=True`` (vmap over the backward, as a vectorized Jacobian does):
    each vector's gradients equal the explicit BPTT's for that vector alone."""
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    out, _ = run_recurrence(cell.kernel, x, cell.weights(), s0, holey_mask.T)
    vectors = torch.randn(3, *out.shape, generator=gen, dtype=DT)
    leaves = [x, *s0, *params_of(cell)]
    got = torch.autograd.grad(out, leaves, vectors, retain_graph=True, is_grads_batched=True)
    for k in range(3):
        want = torch.autograd.grad(out, leaves, vectors[k], retain_graph=True)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a[k], b, **TOL)


def test_one_tensor_given_as_both_states_is_differentiated_twice_right(cell_spec, gen):
    """``(h0, h0)``: the gradient with a graph counts each place once (a second
    derivative against autograd through the cell's plain step loop)."""
    if cell_spec.num_states < 2:
        pytest.skip("one state only")
    cell, x, _, _, _ = make_case(cell_spec, gen)
    h0 = torch.randn(B, H, generator=gen, dtype=DT, requires_grad=True)
    results = []
    for explicit in (True, False):
        if explicit:
            out, _ = run_recurrence(cell.kernel, x, cell.weights(), (h0, h0))
        else:
            out, _ = cell_spec.run(cell, x, (h0, h0), None)
        (d_h0,) = torch.autograd.grad(out.pow(2).sum(), h0, create_graph=True)
        results.append((d_h0, *torch.autograd.grad(d_h0.pow(2).sum(), h0)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_a_window_refuses_a_second_derivative(gen):
    cell = RNNCell(I, H).double()
    x = torch.randn(T, B, I, generator=gen, dtype=DT, requires_grad=True)
    out, _ = run_recurrence(cell.kernel, x, cell.weights(), (torch.zeros(B, H, dtype=DT),), None, 2)
    with pytest.raises(ConfigError, match=r"window=2 .*cannot be differentiated again"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    (d_x,) = torch.autograd.grad(out.pow(2).sum(), x)  # a first derivative is fine
    assert d_x.shape == x.shape


def test_a_projected_input_refuses_a_second_derivative_and_is_not_kept(gen):
    """The input product given itself (``projected=True``, the compiled loop): the node
    keeps no reference to it (the record lets it go), and a second derivative is one
    ConfigError; a first derivative is fine."""
    from rnnkit.bptt.native import available

    if not available():
        pytest.skip("no compiled loop here")
    cell = RNNCell(I, H).double()
    w = cell.weights()
    x = torch.randn(T, B, I, generator=gen, dtype=DT)
    xp = (x @ w.weight_ih.detach().T + w.bias.detach()).requires_grad_()  # (T, B, H)
    out, _ = run_recurrence(cell.kernel, xp, w, (torch.zeros(B, H, dtype=DT),), None, None, True)
    saved = out.grad_fn.saved_tensors
    assert not any(t.data_ptr() == xp.data_ptr() for t in saved if t.numel())
    with pytest.raises(ConfigError, match=r"projected input's gradient cannot be differentiated"):
        torch.autograd.grad(out.pow(2).sum(), xp, create_graph=True)
    (d_xp,) = torch.autograd.grad(out.pow(2).sum(), xp)
    assert d_xp.shape == xp.shape


# ------------------------------------------------------------------------- hold state


def test_zero_length_row_keeps_initial_state(cell_spec, gen, holey_mask):
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    with torch.no_grad():
        out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, holey_mask.T)
    for t in range(T):
        assert torch.equal(out[t, 2], s0[0][2])
    for f, s in zip(finals, s0, strict=True):
        assert torch.equal(f[2], s[2])


def test_holes_hold_the_state_hand_computed(cell_spec, gen, holey_mask):
    """Row 3 has mask 1 0 1 1 0 1: h_2 = h_1, h_5 = h_4, and each real step continues from
    the held state (computed here with ``cell.forward``, one step at a time)."""
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    with torch.no_grad():
        out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, holey_mask.T)
        row = 3
        state = cell_spec.pack(tuple(s[row : row + 1] for s in s0))
        expect = []
        for t, real in enumerate(holey_mask[row].tolist()):
            if real:
                state = cell(x[t, row : row + 1], state)
            expect.append(cell_spec.unpack(state)[0][0])
    assert torch.equal(out[1, row], out[0, row])  # hole at t = 1 holds
    assert torch.equal(out[4, row], out[3, row])  # hole at t = 4 holds
    assert not torch.allclose(out[2, row], out[1, row])
    torch.testing.assert_close(out[:, row], torch.stack(expect), **TOL)
    for f, e in zip(finals, cell_spec.unpack(state), strict=True):
        torch.testing.assert_close(f[row], e[0], **TOL)


def test_trailing_padding_holds_last_real_state(cell_spec, gen, holey_mask):
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    with torch.no_grad():
        out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, holey_mask.T)
    # row 1 has length 3: outputs 3..5 and the final state are h_3
    for t in (3, 4, 5):
        assert torch.equal(out[t, 1], out[2, 1])
    assert torch.equal(finals[0][1], out[2, 1])


def test_garbage_in_padding_is_ignored(cell_spec, gen, holey_mask):
    cell, x, s0, g_out, g_fin = make_case(cell_spec, gen)
    mask = holey_mask.T
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    want = grads(loss_of(out, finals, g_out, g_fin), cell, x, s0)
    for junk in (1e30, float("nan"), float("inf")):
        xj = torch.where(mask[..., None], x.detach(), junk).requires_grad_()
        out_j, fin_j = run_recurrence(cell.kernel, xj, cell.weights(), s0, mask)
        got = grads(loss_of(out_j, fin_j, g_out, g_fin), cell, xj, s0)
        assert torch.equal(out_j, out)
        for a, b in zip(fin_j, finals, strict=True):
            assert torch.equal(a, b)
        for a, b in zip(got, want, strict=True):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, **TOL)


# -------------------------------------------------------------------- windowed BPTT(τ)


def truncated_reference(spec, cell, x, s0, mask, tau, g_out, g_fin):
    """Autograd of the explicitly truncated graph of windowed BPTT(τ).

    The loss at step t (on ``h_t``, 1-based) is recomputed over steps ``t − τ … t`` from
    ``h_{t−τ−1}`` with that state detached, so ``∂h_t/∂h_k`` keeps at most τ factors; where
    ``t − τ − 1 < 0`` the recomputation starts from the (differentiable) initial state. The
    final-state loss is a loss at step T.
    """
    with torch.no_grad():  # the state values h_0..h_T
        states = [tuple(s.detach() for s in s0)]
        for t in range(x.shape[0]):
            _, fin = spec.run(
                cell, x[t : t + 1], states[-1], None if mask is None else mask[t : t + 1]
            )
            states.append(fin)
    n_steps = x.shape[0]

    def window_run(t):  # returns the state h_t recomputed over its window, t in 1..T
        start = t - tau - 1  # the detached state h_{t−τ−1}
        prev = s0 if start < 0 else states[start]
        first = max(start, 0)
        m = None if mask is None else mask[first:t]
        _, fin = spec.run(cell, x[first:t], prev, m)
        return fin

    loss = 0.0
    for t in range(1, n_steps + 1):
        loss = loss + (window_run(t)[0] * g_out[t - 1]).sum()
    fin = window_run(n_steps)
    for f, g in zip(fin, g_fin, strict=True):
        loss = loss + (f * g).sum()
    return loss


@pytest.mark.parametrize(
    ("tau", "masked"),
    [(1, True), (2, True), (3, True), (2, False)],
    ids=["tau1-holes", "tau2-holes", "tau3-holes", "tau2-nomask"],
)
def test_windowed_bptt_equals_truncated_graph(cell_spec, gen, holey_mask, tau, masked):
    cell, x, s0, g_out, g_fin = make_case(cell_spec, gen)
    mask = holey_mask.T if masked else None
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask, window=tau)
    got = grads(loss_of(out, finals, g_out, g_fin), cell, x, s0)
    ref = truncated_reference(cell_spec, cell, x, s0, mask, tau, g_out, g_fin)
    want = grads(ref, cell, x, s0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    # truncation changes gradients only, never values
    full_out, full_fin = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    assert torch.equal(out, full_out)
    full = grads(loss_of(full_out, full_fin, g_out, g_fin), cell, x, s0)
    assert not all(torch.allclose(a, b) for a, b in zip(got, full, strict=True))


@pytest.mark.parametrize("tau", [T, T + 5])
def test_window_at_least_seq_len_is_full_bptt(cell_spec, gen, holey_mask, tau):
    cell, x, s0, g_out, g_fin = make_case(cell_spec, gen)
    mask = holey_mask.T
    out, finals = run_recurrence(cell.kernel, x, cell.weights(), s0, mask, window=tau)
    got = grads(loss_of(out, finals, g_out, g_fin), cell, x, s0)
    out_f, fin_f = run_recurrence(cell.kernel, x, cell.weights(), s0, mask)
    want = grads(loss_of(out_f, fin_f, g_out, g_fin), cell, x, s0)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("tau", [1, 2])
def test_window_limits_how_far_a_loss_reaches(cell_spec, gen, tau):
    """Hand check: with BPTT(τ) a loss on h_t alone gives ∂/∂x_s ≠ 0 exactly for
    t − τ ≤ s ≤ t, and a gradient to the initial state exactly when t ≤ τ."""
    cell, x, s0, _, _ = make_case(cell_spec, gen)
    t = 5  # 1-based step of the loss
    out, _ = run_recurrence(cell.kernel, x, cell.weights(), s0, None, window=tau)
    d_x, *d_s0 = torch.autograd.grad(out[t - 1].sum(), [x, *s0])
    reached = [s + 1 for s in range(T) if bool(d_x[s].abs().sum() > 0)]
    assert reached == list(range(t - tau, t + 1))
    assert all(torch.count_nonzero(d) == 0 for d in d_s0)
    for t, reaches_h0 in ((tau, True), (tau + 1, False)):
        out, _ = run_recurrence(cell.kernel, x, cell.weights(), s0, None, window=tau)
        d_s0 = torch.autograd.grad(out[t - 1].sum(), s0[0])[0]
        assert (torch.count_nonzero(d_s0) > 0) == reaches_h0


def test_lecture_example_tau3_loss_at_step_10_reaches_steps_7_to_10():
    """The worked example of windowed BPTT: τ = 3, the loss at step t = 10 gets weight
    gradient contributions from k = 7, 8, 9, 10 and exactly none from k ≤ 6."""
    torch.manual_seed(0)
    cell = RNNCell(2, 3).double()
    x = torch.randn(1, 12, 2, dtype=DT)
    d_out = torch.zeros(1, 12, 3, dtype=DT)
    d_out[0, 9] = torch.randn(3, dtype=DT)  # a loss on h_10 only
    c = step_contributions(cell, x, d_out, window=3)
    for name in ("weight_hh", "weight_ih", "bias"):
        norms = c.norms()[name]
        reached = [k + 1 for k in range(12) if float(norms[k]) != 0.0]
        assert reached == [7, 8, 9, 10], (name, norms)
    # the same figures as autograd of the graph with h_6 detached
    xt, w = x.transpose(0, 1), cell.weights()
    with torch.no_grad():
        h6 = run_recurrence(cell.kernel, xt[:6], w, (torch.zeros(1, 3, dtype=DT),), None)[1]
    out, _ = run_recurrence(cell.kernel, xt[6:10], w, h6, None)
    want = torch.autograd.grad((out[-1] * d_out[0, 9]).sum(), cell.weight_hh)[0]
    torch.testing.assert_close(c.weight_hh.sum(0), want, **TOL)


@pytest.mark.parametrize("steps", [5, 20])
def test_an_input_changed_in_place_before_backward_is_torchs_error(steps):
    # the node keeps the input (not a view made in its forward's no-grad mode), so
    # autograd's own check names what happened, as for torch's layers
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    lstm = rnnkit.nn.LSTM(4, 6)
    x = layer(torch.randn(steps, 3, 4))  # an input with a graph (an embedding's output)
    out, _ = lstm(x)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
