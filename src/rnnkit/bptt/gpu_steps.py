"""Fused GPU steps in Triton, for the functions PyTorch's fused kernels (cuDNN) cannot
compute: masks with holes, resets inside the loop, the GRU with ``reset="before"``, the
``sigmoid`` simple cell.

The library's PyTorch time loop issues some ten to twenty small kernels per step; here
each step is ONE recurrent product (``torch.mm``, cuBLAS on a GPU) and ONE Triton launch
that does the whole gate math, the hold at a padded step (``h_t = h_{t-1}``, ``c`` too)
and the reset (the state entering the step zero for some rows: the launch zeroes
``h_{t-1}``, ``c_{t-1}`` and those rows of the recurrent product, ``0 · W = 0``). A GRU
with ``reset="before"`` needs the product ``(r ⊙ h_{t-1}) W_nhᵀ`` inside the step: two
products and two launches. The backward, per step: one launch (the gate derivatives;
a held step passes its gradient on to the previous state, a reset stops it) and one
product for ∂L/∂h_{t-1} (two for ``reset="before"``); the weight gradients after the
loop, each ONE product over all steps, as the explicit BPTT does
(:mod:`rnnkit.bptt.backward`). The equations are the cells' own (:mod:`rnnkit.cells`);
the tests hold every output and gradient equal to the explicit BPTT in float64.

Recurrent dropout and zoneout (:mod:`rnnkit.bptt.regularized`, their masks constants):
the product reads ``h_{t-1} ⊙ m``, which the launch before wrote (the GRU's update still
mixes the unmasked ``h_{t-1}``), and the launch mixes zoneout's
``h_t = d_t ⊙ h_{t-1} + (1 − d_t) ⊙ h̃_t`` (``c`` too), keeping the cell's own ``c̃``
(LSTM) or ``h̃`` (simple cell) where its backward reads them. The backward splits
∂L/∂h_t into the product's part, times ``m``, and the rest; ``∂L/∂W_hh`` is
``Σ d_gatesᵀ (h_{t-1} ⊙ m)``.

Cell forms: LSTM, the four GRU forms, the simple cell with tanh, relu or sigmoid, and the
layer-normalised LSTM and GRU, with zoneout and the LSTM with recurrent dropout too
(:mod:`rnnkit.bptt.gpu_steps_ln`, kernels in :mod:`rnnkit.bptt.triton_ln_kernels`); float32
and float64; full BPTT (a segment of truncated BPTT is one call from a given state).
For the windowed BPTT(τ) and the segments' recompute, :func:`forward_record` runs the
forward of a plain LSTM, GRU or simple cell and writes the PyTorch loop's record (its
cache layout), whose explicit backward then runs unchanged.
Triton is an optional dependency (``pip install 'rnnkit[gpu]'``), imported on first use:
``import rnnkit`` never imports it. The kernels are :mod:`rnnkit.bptt.triton_kernels`;
under ``TRITON_INTERPRET=1`` they run on the CPU in Triton's interpreter.

Which runs (:func:`wants_steps`, the ``"triton"`` path of ``RNNKIT_GPU_PATH`` and
:func:`rnnkit.bptt.fused.use_fused`): by default (``"auto"``) for CUDA tensors where
PyTorch's fused kernels do not compute the function and triton imports; ``"triton"``
forces it wherever it handles the function, on any device (the CPU only in the
interpreter).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt import gpu_graphs
from rnnkit.bptt.gpu_steps_ln import LN_KERNELS, run_ln_steps
from rnnkit.bptt.record import ForwardRecord
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel, Weights, scratch
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel

__all__ = ["forward_record", "run_steps"]

_ACTIVATIONS = {"tanh": 0, "relu": 1, "sigmoid": 2}
_KERNELS = "rnnkit.bptt.triton_kernels"


class _Reg(NamedTuple):
    """Recurrent dropout's mask and zoneout's keep factors (:mod:`rnnkit.bptt.regularized`),
    in the steps' dtype, or None; ``cn`` the cell's own new states the backward reads under
    zoneout (the LSTM's ``c̃``, the simple cell's ``h̃``), ``(T, B, H)``, contiguous."""

    rm: Tensor | None = None  # (B, H) on h_{t-1} in the recurrent product, contiguous
    kh: Tensor | None = None  # (T, B, H) zoneout's keep factor of h, strided (keep_views)
    kc: Tensor | None = None  # (T, B, H) that of c (the LSTM), kh's strides
    cn: Tensor | None = None


class _Launch(NamedTuple):
    """What every launch of one call shares: the kernels module, the grid and the flags."""

    k: Any  # rnnkit.bptt.triton_kernels
    grid: tuple[int]
    block: int
    mask: Tensor  # (T, B) int8, or a stand-in when there is none
    reset: Tensor  # (T + 1, B) int8, or a stand-in
    has_mask: bool
    has_reset: bool
    reg: _Reg

    def kw(self, fn: Any, **extra: Any) -> dict[str, Any]:
        """The keyword arguments ``fn`` takes of the options, the flags, the regularizers'
        tensors (a stand-in where absent) and ``extra``."""
        r, like = self.reg, self.mask
        zoned = r.kh if r.kh is not None else r.kc
        every = {
            # FMA contraction as cuBLAS and cuDNN have it, asked for explicitly: triton
            # 3.9 warns once where it is left to its default
            "BLOCK": self.block,
            "enable_fp_fusion": True,
            "HAS_MASK": self.has_mask,
            "HAS_RESET": self.has_reset,
            "RMASK": r.rm is not None,
            "ZH": r.kh is not None,
            "ZC": r.kc is not None,
            "CN": r.cn is not None,  # h̃/c̃ kept (zoneout, for a backward)
            # the keep factors' step and row strides (keep_views: shared by kh and kc)
            "kt": 0 if zoned is None else zoned.stride(0),
            "kb": 0 if zoned is None else zoned.stride(1),
            **{name: like if t is None else t for name, t in r._asdict().items()},
            **{name: like if t is None else t for name, t in extra.items()},
        }
        names = set(fn.arg_names)
        return {k: v for k, v in every.items() if k in names or k == "enable_fp_fusion"}


def _launch(
    x: Tensor, B: int, H: int, mask: Tensor | None, reset: Tensor | None, reg: _Reg
) -> _Launch:
    n = B * H
    block = 16
    while block < min(n, 1024):
        block *= 2
    grid = (max(1, (n + block - 1) // block),)  # an empty batch: one program, no element
    k = importlib.import_module(_KERNELS)  # sys.modules after the first call
    m = x if mask is None else mask
    r = x if reset is None else reset
    return _Launch(k, grid, block, m, r, mask is not None, reset is not None, reg)


def _as_int8(
    mask: Tensor | None, reset: Tensor | None, T: int, B: int, like: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """The int8 ``(T, B)`` mask and ``(T + 1, B)`` reset the kernels read (None: none)."""
    m = None if mask is None else mask.reshape(T, B).to(torch.int8).contiguous()
    r = None
    if reset is not None:
        r = torch.zeros(T + 1, B, dtype=torch.int8, device=like.device)
        r[:T] = reset.reshape(T, B).to(torch.int8)
    return m, r


@without_autocast
def _forward(
    kernel: Kernel,
    x: Tensor,
    w: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    reset: Tensor | None,
    reg: _Reg,
    save: bool,
) -> tuple[Tensor, tuple[Tensor, ...], Tensor, Tensor | None, _Launch]:
    """The steps: ``(x rows (T·B, I), states (T + 1, B, H) each, gates (T, B, G·H),
    rec (T, B, H) or None, the launches' settings)``; ``rec`` is the GRU's bracket (after)
    or ``r ⊙ h_{t-1}`` (before), one step's scratch when nothing is saved. The input
    product is one matrix product; the step loop (:func:`_loop`) runs eagerly, or in a
    CUDA graph where :mod:`rnnkit.bptt.gpu_graphs` is switched on."""
    T, B, I = x.shape
    H = w.weight_hh.shape[1]
    x_flat = x.reshape(T * B, I)
    G = w.weight_ih.shape[0]
    gates = torch.addmm(w.bias, x_flat, w.weight_ih.T).view(T, B, G)  # bias included
    if gpu_graphs.wanted(x):
        inputs = (gates, w.weight_hh, w.bias_hn, mask, reset, reg.rm, reg.kh, reg.kc, *states0)
        run = functools.partial(_loop_tensors, kernel, save)
        got = gpu_graphs.replayed(("forward", gpu_graphs.form(kernel), save), run, inputs)
        if got is not None:  # clones: later replays cannot overwrite them
            L = _launch(x, B, H, mask, reset, reg._replace(cn=got[2]))
            states = cast("tuple[Tensor, ...]", got[3:])
            return x_flat, states, cast("Tensor", got[0]), got[1], L
    reg = _keeping(kernel, reg, save, gates)
    L = _launch(x, B, H, mask, reset, reg)
    states, rec = _loop(kernel, L, gates, w.weight_hh, w.bias_hn, states0, save)
    return x_flat, states, gates, rec, L


def _keeping(kernel: Kernel, reg: _Reg, save: bool, like: Tensor) -> _Reg:
    """``reg`` with the buffer of h̃/c̃ that a backward under zoneout reads, where it does."""
    zoned = reg.kc if isinstance(kernel, LSTMKernel) else reg.kh
    if save and zoned is not None and not isinstance(kernel, GRUKernel):
        T, B, H = zoned.shape
        return reg._replace(cn=like.new_empty(T, B, H))
    return reg


def _loop_tensors(
    kernel: Kernel,
    save: bool,
    gates: Tensor,
    w_hh: Tensor,
    bias_hn: Tensor | None,
    mask: Tensor | None,
    reset: Tensor | None,
    rm: Tensor | None,
    kh: Tensor | None,
    kc: Tensor | None,
    *states0: Tensor,
) -> tuple[Tensor | None, ...]:
    """:func:`_loop` over tensors alone (what a CUDA graph captures): ``(gates activated
    in place, rec or None, h̃/c̃ kept for the backward or None, *states)``."""
    reg = _keeping(kernel, _Reg(rm, kh, kc), save, gates)
    L = _launch(gates, states0[0].shape[0], w_hh.shape[1], mask, reset, reg)
    states, rec = _loop(kernel, L, gates, w_hh, bias_hn, states0, save)
    return (gates, rec, reg.cn, *states)


def _loop(
    kernel: Kernel,
    L: _Launch,
    gates: Tensor,
    w_hh: Tensor,
    bias_hn: Tensor | None,
    states0: tuple[Tensor, ...],
    save: bool,
) -> tuple[tuple[Tensor, ...], Tensor | None]:
    """The step loop: ``(states (T + 1, B, H) each, rec or None)``, ``gates`` activated
    in place."""
    T, B, H = gates.shape[0], states0[0].shape[0], w_hh.shape[1]
    states = tuple(gates.new_empty(T + 1, B, H) for _ in states0)
    for buf, s0 in zip(states, states0, strict=True):
        buf[0].copy_(s0)
    reg = L.reg
    hs = states[0]
    # what each step's product reads: h_{t-1}, or h_{t-1} ⊙ m that the launch before wrote
    hm = None if reg.rm is None else hs[0] * reg.rm
    reads = hs.unbind(0) if hm is None else (hm,) * T
    rec = None
    with torch.cuda.device(gates.device) if gates.is_cuda else contextlib.nullcontext():
        if isinstance(kernel, LSTMKernel):
            hw, w_t = gates.new_empty(B, 4 * H), w_hh.T
            kw = L.kw(L.k.lstm_forward, hm=hm)
            for t in range(T):
                torch.mm(reads[t], w_t, out=hw)
                L.k.lstm_forward[L.grid](gates, hw, hs, states[1], L.mask, L.reset, t, B, H, **kw)
        elif isinstance(kernel, RNNKernel):
            hw, w_t = gates.new_empty(B, H), w_hh.T
            kw = L.kw(L.k.rnn_forward, hm=hm, ACT=_ACTIVATIONS[kernel.nonlinearity])
            for t in range(T):
                torch.mm(reads[t], w_t, out=hw)
                L.k.rnn_forward[L.grid](gates, hw, hs, L.mask, L.reset, t, B, H, **kw)
        else:
            assert isinstance(kernel, GRUKernel)
            rec = gates.new_empty(T if save else 1, B, H)
            _gru_forward(kernel, L, gates, hs, rec, w_hh, bias_hn, save, reads, hm)
    return states, rec


def forward_record(
    kernel: Kernel,
    x: Tensor,
    w: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    reset: Tensor | None,
    save: bool,
) -> ForwardRecord:
    """The Triton steps' forward as the PyTorch loop records it (:func:`steps_record`),
    for the library's explicit backward (``backward_sweep``, ``windowed_sweep``,
    ``weight_grads``) read unchanged.

    ``x (T, B, I)``, ``mask``/``reset (T, B, 1)`` bool or None. The record: ``x`` as
    ``(T·B, I)`` rows, the states ``(T + 1, B, H)`` each as the steps left them (each
    step's own result, the reset kept in ``record.reset``), and the kernel's own cache
    layout, converted with whole-tensor operations: the LSTM's ``(activated i, f, g, o
    (T, B, 4H), tanh c_t (T, B, H))``; the GRU's ``(r, z (T, B, 2H), n (T, B, H), rec)``,
    ``rec`` the bracket ``W_nh h_{t-1} + b_hn`` (after) or ``r ⊙ h_{t-1}`` (before) as
    the launches wrote it; none for the simple cell. At a padded step the cache holds
    that step's values unheld (``tanh`` of the held ``c``), which the backward never
    reads. Without ``save`` the cache is one step's scratch."""
    T, B = x.shape[0], x.shape[1]
    m, r = _as_int8(mask, reset, T, B, x)
    with torch.no_grad():  # the Triton launches write in place, unseen by autograd
        x_flat, states, gates, rec, _ = _forward(kernel, x, w, states0, m, r, _Reg(), save)
        H = states[0].shape[2]
        cache: tuple[Tensor, ...] = ()
        if isinstance(kernel, LSTMKernel):
            tanh_c = torch.tanh(states[1][1:]) if save else scratch(T, B, H, gates, False)
            cache = (gates, tanh_c)
        elif isinstance(kernel, GRUKernel):
            assert rec is not None
            cache = (gates[..., : 2 * H], gates[..., 2 * H :], rec.expand(T, B, H))
    return ForwardRecord(x_flat, states, cache, reset)


def _gru_forward(
    kernel: GRUKernel,
    L: _Launch,
    gates: Tensor,
    hs: Tensor,
    rec: Tensor,
    w_hh: Tensor,
    bias_hn: Tensor | None,
    save: bool,
    reads: tuple[Tensor, ...],
    hm: Tensor | None,
) -> None:
    T, B, H = gates.shape[0], hs.shape[1], hs.shape[2]
    keep = kernel.update == "keep"
    rec_steps = rec.unbind(0)
    if kernel.reset == "after":
        hw, w_t = hs.new_empty(B, 3 * H), w_hh.T
        assert bias_hn is not None  # a GRU with reset="after" always has it
        kw = L.kw(L.k.gru_after_forward, hm=hm, KEEP=keep)
        for t in range(T):
            torch.mm(reads[t], w_t, out=hw)
            L.k.gru_after_forward[L.grid](
                gates, hw, bias_hn, hs, rec, L.mask, L.reset, t, t if save else 0, B, H, **kw
            )
        return
    hw, hn = hs.new_empty(B, 2 * H), hs.new_empty(B, H)
    w_rz, w_n = w_hh[: 2 * H].T, w_hh[2 * H :].T
    kw_gates = L.kw(L.k.gru_before_gates)
    kw_state = L.kw(L.k.gru_before_state, hm=hm, KEEP=keep)
    for t in range(T):
        tc = t if save else 0
        torch.mm(reads[t], w_rz, out=hw)
        L.k.gru_before_gates[L.grid](gates, hw, hs, rec, L.reset, t, tc, B, H, **kw_gates)
        torch.mm(rec_steps[tc], w_n, out=hn)
        L.k.gru_before_state[L.grid](gates, hn, hs, L.mask, L.reset, t, B, H, **kw_state)


class _Carry(NamedTuple):
    """The backward's running gradients: ``d`` = ∂L/∂(h_t, c_t) as step t + 1 passed them;
    under recurrent dropout ``d[0]`` is the product's part ∂L/∂(h_t ⊙ m) and ``direct``
    the rest (∂L/∂h_t = d[0] ⊙ m + direct), else ``direct`` is the launch's scratch."""

    d: list[Tensor]
    direct: Tensor

    def product(self, L: _Launch, d_gates: Tensor, w: Tensor) -> None:
        """``d[0]`` ← the product's part of ∂L/∂h_{t-1}: ``d_gates W``, plus ``direct``
        without recurrent dropout."""
        if L.reg.rm is None:
            torch.addmm(self.direct, d_gates, w, out=self.d[0])
        else:
            torch.mm(d_gates, w, out=self.d[0])


@without_autocast
def _backward(
    kernel: Kernel,
    L: _Launch,
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
    L = _launch(hs, hs.shape[1], hs.shape[2], mask, reset, _Reg(rm, kh, kc, cn))
    d_xp, d_rec, d = _sweep(kernel, L, states, gates, rec, w_hh, d_out, rest[n:])
    return (d_xp, d_rec, *d)


def _sweep(
    kernel: Kernel,
    L: _Launch,
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
            act = _ACTIVATIONS[kernel.nonlinearity]
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
    L: _Launch,
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


def _weight_grads(
    kernel: Kernel,
    L: _Launch,
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


class _Steps(torch.autograd.Function):
    """One direction of one layer over the Triton steps; backward: their explicit BPTT."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Kernel,
        mask: Tensor | None,
        reset: Tensor | None,
        reg: _Reg,
        save: bool,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        x_flat, states, gates, rec, L = _forward(kernel, x, w, states0, mask, reset, reg, save)
        if save:
            ctx.kernel, ctx.num_states = kernel, len(states)
            optional = (mask, reset, rec, *L.reg)
            ctx.has = tuple(t is not None for t in optional)
            kept = [t for t in optional if t is not None]
            ctx.save_for_backward(x_flat, weight_ih, weight_hh, gates, *states, *kept)
        return (states[0][1:], *(s[-1].clone() for s in states))

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        x_flat, w_ih, w_hh, gates, *rest = ctx.saved_tensors
        n = ctx.num_states
        states, kept = tuple(rest[:n]), iter(rest[n:])
        mask, reset, rec, *reg = (next(kept) if has else None for has in ctx.has)
        hs = states[0]
        L = _launch(hs, hs.shape[1], hs.shape[2], mask, reset, _Reg(*reg))
        d_xp, d_rec, d_s0 = _backward(ctx.kernel, L, states, gates, rec, w_hh, d_out, d_finals)
        # needs_input_grad: kernel, mask, reset, reg, save, x, w_ih, w_hh, bias, bias_hn, s0...
        need = ctx.needs_input_grad[5:10]
        w = Weights(w_ih, w_hh, None, None)  # type: ignore[arg-type]
        grads = _weight_grads(ctx.kernel, L, x_flat, hs, rec, d_xp, d_rec, w, need)
        d_init = tuple(d if ctx.needs_input_grad[10 + k] else None for k, d in enumerate(d_s0))
        return (None, None, None, None, None, *grads, *d_init)


def _regularizers(kernel: Kernel, T: int, B: int, H: int, like: Tensor) -> tuple[Kernel, _Reg]:
    """The cell's kernel and the regularizers' tensors, in ``like``'s dtype: the recurrent
    mask contiguous, the keep factors strided views (``RegularizedKernel.keep_views``)."""
    if not isinstance(kernel, RegularizedKernel):
        return kernel, _Reg()
    keep: list[Tensor | None] = [None, None]
    for k, view in zip(kernel.zoned, kernel.keep_views(T, B, H, like.dtype), strict=True):
        keep[k] = view
    m = kernel.recurrent_mask
    rm = None if m is None else m.to(like.dtype).contiguous()
    return cast("Kernel", kernel.inner), _Reg(rm, keep[0], keep[1])


def run_steps(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None = None,
    reset: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """One direction of one layer over the Triton steps: the contract of
    :func:`rnnkit.bptt.recurrence.run_recurrence` (full BPTT), plus resets.

    Args:
        kernel: a cell's kernel, or a :class:`~rnnkit.bptt.regularized.RegularizedKernel`
            around one (recurrent dropout's mask and zoneout's keep factors: constants).
        x: ``(T, B, I)`` in the weights' dtype, its padding already zeroed
            (``clean_padding``).  states0: each ``(B, H)``.
        mask: ``(T, B)`` or ``(T, B, 1)`` bool, True at real steps, or None.
        reset: ``(T, B)`` or ``(T, B, 1)`` bool, True where the state entering step t is
            zero (a new document), or None.

    Returns:
        ``(outputs (T, B, H), final states (B, H) each)``, the state held across padding.
    """
    T, B = x.shape[0], x.shape[1]
    kernel, reg = _regularizers(kernel, T, B, states0[0].shape[1], x)
    if type(kernel) in LN_KERNELS:  # x: the normalised input part
        m, r = _as_int8(mask, reset, T, B, x)
        return run_ln_steps(kernel, x, weights, states0, m, r, (reg.rm, reg.kh, reg.kc))
    m, r = _as_int8(mask, reset, T, B, x)
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    states = tuple(s.contiguous() for s in states0)
    result = _Steps.apply(kernel, m, r, reg, save, x, *weights, *states)
    return result[0], tuple(result[1:])
