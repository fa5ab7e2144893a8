"""The readable pair of each cell, ``step`` and ``step_backward`` (``rnn_step``,
``lstm_step``, ``gru_step`` and their ``*_step_backward``), and what the time loop runs.

1. Each ``step_backward`` equals autograd through its ``step`` in float64: every input,
   state and parameter gradient, on random shapes, for every cell variant.
2. The time loops agree with the pair: the in-place kernels (``step_into``/``step_backward``
   of ``RNNKernel``/``LSTMKernel``/``GRUKernel`` in the PyTorch loop) and the compiled loop
   (``rnnkit.bptt.native``) give, step by step, the states, caches, pre-activation gradients and
   initial-state gradients of a Python loop of ``step``/``step_backward``, with a mask
   that holds the state at some steps.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from rnnkit.bptt.backward import backward_sweep
from rnnkit.bptt.forward import forward_pass
from rnnkit.cells.gru import gru_step, gru_step_backward
from rnnkit.cells.kernel import Weights
from rnnkit.cells.lstm import lstm_step, lstm_step_backward
from rnnkit.cells.rnn import rnn_step, rnn_step_backward
from rnnkit.types import LSTMState

pytestmark = pytest.mark.usefixtures("single_thread")


def close(actual: Tensor, expected: Tensor, what: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12, msg=what)


def step_with_cache(spec, cell, x: Tensor, states: tuple[Tensor, ...], w: Weights):
    """``(new states, cache)`` of the cell's readable step (the cache None for the RNN,
    whose backward reads the step's output)."""
    if spec.kind == "rnn":
        return (rnn_step(x, states[0], w, cell.nonlinearity),), None
    if spec.kind == "lstm":
        new, cache = lstm_step(x, LSTMState(*states), w, return_cache=True)
        return tuple(new), cache
    h, cache = gru_step(x, states[0], w, cell.update, cell.reset, return_cache=True)
    return (h,), cache


def step_backward(spec, cell, d_new, prev, new, cache, w: Weights):
    """The readable backward: ``(d_gates (B, G·H), d_prev states, d_hn)``; ``d_hn`` is the
    GRU's gradient of the n block's recurrent product (None for the others)."""
    if spec.kind == "rnn":
        d_a, d_h_prev = rnn_step_backward(d_new[0], new[0], w, cell.nonlinearity)
        return d_a, (d_h_prev,), None
    if spec.kind == "lstm":
        d_gates, d_h_prev, d_c_prev = lstm_step_backward(d_new[0], d_new[1], prev[1], cache, w)
        return d_gates, (d_h_prev, d_c_prev), None
    d_gates, d_h_prev, d_hn = gru_step_backward(
        d_new[0], prev[0], cache, w, cell.update, cell.reset
    )
    return d_gates, (d_h_prev,), d_hn


@pytest.mark.parametrize("draw", range(3))
def test_step_backward_equals_autograd(cell_spec, draw):
    """∂L/∂(x, states, weight_ih, weight_hh, bias, bias_hn) for ``L = Σ d_new ⊙ new``:
    from the readable backward (weight gradients as the time loop forms them: one outer
    product per block) against autograd through the step, float64, random B, I, H."""
    gen = torch.Generator().manual_seed(100 + draw)
    B, I, H = (int(v) for v in torch.randint(1, 7, (3,), generator=gen))
    cell = cell_spec.cell(I, H, seed=draw)
    H = cell.hidden_size
    w = cell.weights()
    x = torch.randn(B, I, generator=gen, dtype=torch.float64, requires_grad=True)
    prev = tuple(
        torch.randn(B, H, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(cell_spec.num_states)
    )
    new, cache = step_with_cache(cell_spec, cell, x, prev, w)
    d_new = tuple(torch.randn(B, H, generator=gen, dtype=torch.float64) for _ in new)
    loss = sum((d * s).sum() for d, s in zip(d_new, new, strict=True))
    params = {name: p for name, p in w._asdict().items() if p is not None}
    auto = torch.autograd.grad(loss, [x, *prev, *params.values()])
    auto_x, auto_prev = auto[0], auto[1 : 1 + len(prev)]
    auto_w = dict(zip(params, auto[1 + len(prev) :], strict=True))

    with torch.no_grad():
        d_gates, d_prev, d_hn = step_backward(cell_spec, cell, d_new, prev, new, cache, w)
        close(d_gates @ w.weight_ih, auto_x, "x")
        for k, (mine, theirs) in enumerate(zip(d_prev, auto_prev, strict=True)):
            close(mine, theirs, f"state {k}")
        close(d_gates.T @ x, auto_w["weight_ih"], "weight_ih")
        close(d_gates.sum(0), auto_w["bias"], "bias")
        if cell_spec.kind != "gru":
            close(d_gates.T @ prev[0], auto_w["weight_hh"], "weight_hh")
            return
        # r, z: d_gates times h_{t-1}; n: d_hn times what W_nh multiplies
        n_input = prev[0] if cell.reset == "after" else cache.rec  # h_{t-1} or r ⊙ h_{t-1}
        d_w_hh = torch.cat([d_gates[:, : 2 * H].T @ prev[0], d_hn.T @ n_input])
        close(d_w_hh, auto_w["weight_hh"], "weight_hh")
        if cell.reset == "after":
            close(d_hn.sum(0), auto_w["bias_hn"], "bias_hn")
        else:
            close(d_hn, d_gates[:, 2 * H :], "d_hn is d_an (reset before)")


def _oracle(spec, cell, x, states0, mask, d_out, d_finals):
    """A Python loop of ``step`` forward and ``step_backward`` back, holding the state
    where ``mask (T, B)`` is False (no gate gradient there; the state gradient passes)."""
    w = cell.weights()
    T = x.shape[0]
    states, caches = [states0], []
    for t in range(T):
        new, cache = step_with_cache(spec, cell, x[t], states[-1], w)
        m = mask[t][:, None]
        states.append(tuple(torch.where(m, a, b) for a, b in zip(new, states[-1], strict=True)))
        caches.append((new, cache))
    d_state = list(d_finals)
    d_xp, d_hn = [None] * T, [None] * T
    for t in range(T - 1, -1, -1):
        d_state[0] = d_state[0] + d_out[t]
        new, cache = caches[t]
        d_gates, d_prev, d_n = step_backward(spec, cell, d_state, states[t], new, cache, w)
        m = mask[t][:, None]
        d_xp[t] = torch.where(m, d_gates, 0.0)
        d_hn[t] = None if d_n is None else torch.where(m, d_n, 0.0)
        d_state = [torch.where(m, a, b) for a, b in zip(d_prev, d_state, strict=True)]
    return states, caches, d_xp, d_hn, d_state


def _loop_caches(spec, cell, record, t: int):
    """The time loop's cache of step t in the readable step's terms."""
    cache = tuple(c[t] for c in record.cache)
    if spec.kind == "lstm":  # (gates, tanh_c)
        return cache
    if spec.kind == "gru":  # (rz, n, rec)
        return (torch.cat([cache[0], cache[1]], dim=-1), cache[2])
    return ()


def test_time_loops_agree_with_step_and_step_backward(cell_spec, time_loop, holey_mask):
    """Both loops (``time_loop``: compiled and PyTorch), float64, T = 6, B = 4 with holes,
    a zero-length row and finished rows: states, caches at real steps, every step's
    pre-activation gradients (``Sweep.d_xp``; the GRU's ``d_hp`` with reset="after") and
    the initial-state gradients equal those of the readable pair."""
    gen = torch.Generator().manual_seed(7)
    mask = holey_mask.T.contiguous()  # (T, B)
    T, B = mask.shape
    cell = cell_spec.cell(3, 5, seed=1)
    H, w = cell.hidden_size, cell.weights()
    x = torch.randn(T, B, 3, generator=gen, dtype=torch.float64)
    x = torch.where(mask[..., None], x, 0.0)  # the loop's input: padding already cleaned
    states0 = tuple(
        torch.randn(B, H, generator=gen, dtype=torch.float64) for _ in range(cell_spec.num_states)
    )
    d_out = torch.randn(T, B, H, generator=gen, dtype=torch.float64)
    d_finals = tuple(torch.randn(B, H, generator=gen, dtype=torch.float64) for _ in states0)
    with torch.no_grad():
        states, caches, d_xp, d_hn, d_states0 = _oracle(
            cell_spec, cell, x, states0, mask, d_out, d_finals
        )
        kernel, mask3 = cell.kernel, mask[..., None]
        record = forward_pass(kernel, x, w, states0, mask3, save=True)
        sweep = backward_sweep(kernel, record, w, mask3, d_out, d_finals)

    for k in range(cell_spec.num_states):
        close(record.states[k], torch.stack([s[k] for s in states]), f"states {k}")
    for t in range(T):
        real = mask[t]
        _, cache = caches[t]
        if cell_spec.kind != "rnn":
            for part, mine in zip(cache, _loop_caches(cell_spec, cell, record, t), strict=True):
                close(mine[real], part[real], f"cache at step {t}")
        close(sweep.d_xp[t].reshape(B, -1), d_xp[t], f"d_xp at step {t}")
        if cell_spec.kind == "gru" and cell.reset == "after":
            close(sweep.d_hp[t].reshape(B, H), d_hn[t], f"d_hp at step {t}")
    for k, (mine, theirs) in enumerate(zip(sweep.d_states0, d_states0, strict=True)):
        close(mine, theirs, f"initial state {k}")
