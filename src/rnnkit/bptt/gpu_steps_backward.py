"""The backward of the Triton steps (:mod:`rnnkit.bptt.gpu_steps`): the sweep from step
``T`` down to 1, per step one launch (the gate derivatives; a held step passes its
gradient on to the previous state, a reset stops it) and one product for
∂L/∂h_{t-1} (two for a GRU with ``reset="before"``), eager or replayed in a CUDA graph
(:mod:`rnnkit.bptt.gpu_graphs`); then the weight gradients, each ONE product over all
steps, as the explicit BPTT does (:mod:`rnnkit.bptt.backward`). Under recurrent dropout
∂L/∂h_t splits into the product's part, times the mask ``m``, and the rest, and
``∂L/∂W_hh`` is ``Σ d_gatesᵀ (h_{t-1} ⊙ m)``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt import gpu_graphs
from rnnkit.bptt.gpu_launch import ACTIVATIONS, Launch, Reg, launch
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel

# Nothing public: the Triton steps start at rnnkit.bptt.gpu_steps.run_steps.
__all__: list[str] = []


class _Carry(NamedTuple):
    """The backward's running gradients: ``d`` = ∂L/∂(h_t, c_t) as step t + 1 passed them;
    under recurrent dropout ``d[0]`` is the product's part ∂L/∂(h_t ⊙ m) and ``direct``
    the rest (∂L/∂h_t = d[0] ⊙ m + direct), else ``direct`` is the launch's scratch."""

    d: list[Tensor]
    direct: Tensor

    def product(self, L: Launch, d_gates: Tensor, w: Tensor) -> None:
        """``d[0]`` ← the product's part of ∂L/∂h_{t-1}: ``d_gates W``, plus ``direct``
        without recurrent dropout."""
        if L.reg.rm is None:
            torch.addmm(self.direct, d_gates, w, out=self.d[0])
        else:
            torch.mm(d_gates, w, out=self.d[0])


@without_autocast
def steps_backward(
    kernel: Kernel,
    L: Launch,
    states: tuple[Tensor, ...],
    gates: Tensor,
    rec: Tensor | None,
    w_hh: Tensor,
    d_out: Tensor | None,
    d_finals: tuple[Tensor | None, ...],
) -> tuple[Tensor, Tensor | None, tuple[Tensor, ...]]:
    """The sweep from step T down to 1: ``(d_xp (T, B, G·H), d_rec, ∂L/∂states0)``;
    ``d_rec`` the GRU (after)'s recurrent gradients ``(T, B, 3H)``, else None. Eager, or
    in a CUDA graph where :mod:`rnnkit.bptt.gpu_graphs` is switched on."""
    if gpu_graphs.wanted(gates):
        mask, reset = (L.mask if L.has_mask else None), (L.reset if L.has_reset else None)
        inputs = (gates, rec, w_hh, d_out, mask, reset, *L.reg, *states, *d_finals)
        run = functools.partial(_backward_tensors, kernel, len(states))
        got = gpu_graphs.replayed(("backward", gpu_graphs.form(kernel)), run, inputs)
        if got is not None:
            d_xp, d_rec, *d = got
            assert d_xp is not None
            return d_xp, d_rec, tuple(cast("list[Tensor]", d))
    return _sweep(kernel, L, states, gates, rec, w_hh, d_out, d_finals)


def _backward_tensors(
    kernel: Kernel,
    n: int,
    gates: Tensor,
    rec: Tensor | None,
    w_hh: Tensor,
    d_out: Tensor | None,
    mask: Tensor | None,
    reset: Tensor | None,
    rm: Tensor | None,
    kh: Tensor | None,
    kc: Tensor | None,
    cn: Tensor | None,
    *rest: Tensor | None,
) -> tuple[Tensor | None, ...]:
    """:func:`_sweep` over tensors alone (what a CUDA graph captures): ``rest`` the ``n``
    states and the ``n`` final states' gradients; ``(d_xp, d_rec, *∂L/∂states0)``."""
    states = cast("tuple[Tensor, ...]", rest[:n])
    hs = states[0]
    L = launch(hs, hs.shape[1], hs.shape[2], mask, reset, Reg(rm, kh, kc, cn))
    d_xp, d_rec, d = _sweep(kernel, L, states, gates, rec, w_hh, d_out, rest[n:])
    return (d_xp, d_rec, *d)


def _sweep(
    kernel: Kernel,
    L: Launch,
    states: tuple[Tensor, ...],
    gates: Tensor,
    rec: Tensor | None,
    w_hh: Tensor,
    d_out: Tensor | None,
    d_finals: tuple[Tensor | None, ...],
) -> tuple[Tensor, Tensor | None, tuple[Tensor, ...]]:
    hs = states[0]
    T, B, H = hs.shape[0] - 1, hs.shape[1], hs.shape[2]
    d_xp = gates.new_empty(gates.shape)
    d = [hs.new_zeros(B, H) if g is None else g.contiguous().clone() for g in d_finals]
    c = _Carry(d, hs.new_empty(B, H))
    if L.reg.rm is not None:  # the final state's gradient reached h itself, not h ⊙ m
        c.direct.copy_(d[0])
        d[0].zero_()
    has_dout = d_out is not None
    d_o = d_out.contiguous() if d_out is not None else hs
    d_steps = d_xp.unbind(0)
    d_rec = None
    with torch.cuda.device(hs.device) if hs.is_cuda else contextlib.nullcontext():
        if isinstance(kernel, LSTMKernel):
            kw = L.kw(L.k.lstm_backward, HAS_DOUT=has_dout)
            for t in range(T - 1, -1, -1):
                L.k.lstm_backward[L.grid](
                    gates, states[1], L.mask, L.reset, d[0], d[1], d_o, d_xp, c.direct,
                    t, B, H, **kw,
                )  # fmt: skip
                c.product(L, d_steps[t], w_hh)
        elif isinstance(kernel, RNNKernel):
            act = ACTIVATIONS[kernel.nonlinearity]
            kw = L.kw(L.k.rnn_backward, ACT=act, HAS_DOUT=has_dout)
            for t in range(T - 1, -1, -1):
                L.k.rnn_backward[L.grid](
                    hs, L.mask, L.reset, d[0], d_o, d_xp, c.direct, t, B, H, **kw
                )  # fmt: skip
                c.product(L, d_steps[t], w_hh)
        else:
            assert isinstance(kernel, GRUKernel) and rec is not None
            d_rec = _gru_backward(kernel, L, hs, gates, rec, w_hh, d_o, has_dout, d_xp, c)
    if L.reg.rm is not None:
        d[0] = torch.addcmul(c.direct, d[0], L.reg.rm)
    if L.has_reset:  # a row reset at step 0 read no initial state
        d = [torch.where(L.reset[0, :, None] != 0, 0.0, g) for g in d]
    return d_xp, d_rec, tuple(d)


def _gru_backward(
    kernel: GRUKernel,
    L: Launch,
    hs: Tensor,
    gates: Tensor,
    rec: Tensor,
    w_hh: Tensor,
    d_o: Tensor,
    has_dout: bool,
    d_xp: Tensor,
    c: _Carry,
) -> Tensor | None:
    T, B, H = gates.shape[0], hs.shape[1], hs.shape[2]
    keep = kernel.update == "keep"
    d_steps = d_xp.unbind(0)
    update = L.k.gru_update_backward
    d = c.d
    if kernel.reset == "after":
        d_rec = torch.empty_like(d_xp)
        d_rec_steps = d_rec.unbind(0)
        kw = L.kw(update, KEEP=keep, AFTER=True, HAS_DOUT=has_dout)
        for t in range(T - 1, -1, -1):
            update[L.grid](
                gates, rec, hs, L.mask, L.reset, d[0], d_o, d_xp, d_rec, c.direct, t, B, H, **kw
            )
            c.product(L, d_rec_steps[t], w_hh)
        return d_rec
    d_rh = hs.new_empty(B, H)
    w_rz, w_n = w_hh[: 2 * H], w_hh[2 * H :]
    kw = L.kw(update, KEEP=keep, AFTER=False, HAS_DOUT=has_dout)
    kw_r = L.kw(L.k.gru_before_backward, d_hm=d[0])
    for t in range(T - 1, -1, -1):
        update[L.grid](
            gates, rec, hs, L.mask, L.reset, d[0], d_o, d_xp, d_xp, c.direct, t, B, H, **kw
        )
        torch.mm(d_steps[t][:, 2 * H :], w_n, out=d_rh)  # ∂L/∂(r ⊙ h_{t-1})
        L.k.gru_before_backward[L.grid](gates, hs, L.reset, d_rh, d_xp, c.direct, t, B, H, **kw_r)
        if L.reg.rm is None:
            torch.addmm(c.direct, d_steps[t][:, : 2 * H], w_rz, out=d[0])
        else:  # d[0] holds d_rh ⊙ r, the n product's part
            d[0].addmm_(d_steps[t][:, : 2 * H], w_rz)
    return None


def steps_weight_grads(
    kernel: Kernel,
    L: Launch,
    x_flat: Tensor,
    hs: Tensor,
    rec: Tensor | None,
    d_xp: Tensor,
    d_rec: Tensor | None,
    w: Weights,
    need: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """``(∂L/∂x, ∂L/∂weight_ih, ∂L/∂weight_hh, ∂L/∂bias, ∂L/∂bias_hn)``, each ONE product
    (or sum) over all steps; None where ``need`` says no."""
    T, B, H = d_xp.shape[0], d_xp.shape[1], hs.shape[2]
    d2 = d_xp.reshape(T * B, d_xp.shape[2])
    d_x = torch.mm(d2, w.weight_ih).view(T, B, x_flat.shape[1]) if need[0] else None
    d_ih = torch.mm(d2.T, x_flat) if need[1] else None
    d_b = d2.sum(0) if need[3] else None
    d_hh = d_hn = None
    if need[2] or need[4]:
        h_prev = hs[:-1]
        if L.has_reset:  # what each step read
            h_prev = torch.where(L.reset[:T, :, None] != 0, 0.0, h_prev)
        if L.reg.rm is not None:  # the products read h_{t-1} ⊙ m
            h_prev = h_prev * L.reg.rm
        h_prev = h_prev.reshape(T * B, H)
        if d_rec is not None:  # GRU, reset="after": [d_ar, d_az, d_an ⊙ r]
            q = d_rec.reshape(T * B, 3 * H)
            d_hh, d_hn = torch.mm(q.T, h_prev), q[:, 2 * H :].sum(0)
        elif isinstance(kernel, GRUKernel):  # reset="before": the n rows read r ⊙ h_{t-1}
            assert rec is not None
            r_h = rec.reshape(T * B, H)
            d_hh = torch.cat([torch.mm(d2[:, : 2 * H].T, h_prev), torch.mm(d2[:, 2 * H :].T, r_h)])
        else:
            d_hh = torch.mm(d2.T, h_prev)
    return d_x, d_ih, d_hh if need[2] else None, d_b, d_hn if need[4] else None
