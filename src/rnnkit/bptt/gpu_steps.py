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
under ``TRITON_INTERPRET=1`` they run on the CPU in Triton's interpreter. This module
holds the forward and the autograd function; what the launches share is
:mod:`rnnkit.bptt.gpu_launch`, the backward :mod:`rnnkit.bptt.gpu_steps_backward`.

Which runs (:func:`wants_steps`, the ``"triton"`` path of ``RNNKIT_GPU_PATH`` and
:func:`rnnkit.bptt.fused.use_fused`): by default (``"auto"``) for CUDA tensors where
PyTorch's fused kernels do not compute the function and triton imports; ``"triton"``
forces it wherever it handles the function, on any device (the CPU only in the
interpreter).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt import gpu_graphs
from rnnkit.bptt.gpu_launch import ACTIVATIONS, Launch, Reg, as_int8, launch, rerun_gradients
from rnnkit.bptt.gpu_steps_backward import steps_backward, steps_weight_grads
from rnnkit.bptt.gpu_steps_ln import LN_KERNELS, run_ln_steps
from rnnkit.bptt.record import ForwardRecord
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel, Weights, batched_gradients, scratch
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel

__all__ = ["forward_record", "run_steps"]


@without_autocast
def _forward(
    kernel: Kernel,
    x: Tensor,
    w: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    reset: Tensor | None,
    reg: Reg,
    save: bool,
) -> tuple[Tensor, tuple[Tensor, ...], Tensor, Tensor | None, Launch]:
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
            L = launch(x, B, H, mask, reset, reg._replace(cn=got[2]))
            states = cast("tuple[Tensor, ...]", got[3:])
            return x_flat, states, cast("Tensor", got[0]), got[1], L
    reg = _keeping(kernel, reg, save, gates)
    L = launch(x, B, H, mask, reset, reg)
    states, rec = _loop(kernel, L, gates, w.weight_hh, w.bias_hn, states0, save)
    return x_flat, states, gates, rec, L


def _keeping(kernel: Kernel, reg: Reg, save: bool, like: Tensor) -> Reg:
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
    reg = _keeping(kernel, Reg(rm, kh, kc), save, gates)
    L = launch(gates, states0[0].shape[0], w_hh.shape[1], mask, reset, reg)
    states, rec = _loop(kernel, L, gates, w_hh, bias_hn, states0, save)
    return (gates, rec, reg.cn, *states)


def _loop(
    kernel: Kernel,
    L: Launch,
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
            kw = L.kw(L.k.rnn_forward, hm=hm, ACT=ACTIVATIONS[kernel.nonlinearity])
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
    m, r = as_int8(mask, reset, T, B, x)
    with torch.no_grad():  # the Triton launches write in place, unseen by autograd
        x_flat, states, gates, rec, _ = _forward(kernel, x, w, states0, m, r, Reg(), save)
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
    L: Launch,
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


class _Steps(torch.autograd.Function):
    """One direction of one layer over the Triton steps; backward: their explicit BPTT."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Kernel,
        mask: Tensor | None,
        reset: Tensor | None,
        reg: Reg,
        save: bool,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        # ``kernel``: the layer's own (a RegularizedKernel around a cell's, whose
        # regularizers' tensors are ``reg``); the launches compute with the cell's
        inner = cast("Kernel", kernel.inner) if isinstance(kernel, RegularizedKernel) else kernel
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        x_flat, states, gates, rec, L = _forward(inner, x, w, states0, mask, reset, reg, save)
        if save:
            ctx.kernel, ctx.layer_kernel, ctx.num_states = inner, kernel, len(states)
            optional = (mask, reset, rec, *L.reg)
            ctx.has = tuple(t is not None for t in optional)
            kept = [t for t in optional if t is not None]
            main = (x_flat, weight_ih, weight_hh, gates, *states, *kept)
            # the node's own inputs too: a differentiated gradient runs the forward again
            ctx.num_main, ctx.has_hn = len(main), bias_hn is not None
            again = (x, bias, *(() if bias_hn is None else (bias_hn,)), *states0)
            ctx.save_for_backward(*main, *again)
        return (states[0][1:], *(s[-1].clone() for s in states))

    @staticmethod
    def backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        # create_graph=True (a gradient penalty, a Hessian) or a batch of incoming
        # gradients under vmap (is_grads_batched=True): the Triton launches have neither
        # a derivative nor a batching rule, so autograd through the plain steps
        if torch.is_grad_enabled() or batched_gradients(d_out, *d_finals):
            return _steps_differentiable_backward(ctx, d_out, *d_finals)
        return _steps_explicit_backward(ctx, d_out, *d_finals)


def _steps_differentiable_backward(
    ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The gradients with a graph: the forward run again in the layer kernel's
    differentiable steps from the node's inputs (``rnnkit.bptt.unrolled``)."""
    saved = ctx.saved_tensors
    mask = saved[4 + ctx.num_states] if ctx.has[0] else None
    w_ih, w_hh = saved[1], saved[2]
    x, bias, *rest = saved[ctx.num_main :]
    bias_hn = rest.pop(0) if ctx.has_hn else None
    weights = Weights(w_ih, w_hh, bias, bias_hn)
    return rerun_gradients(ctx, x, weights, tuple(rest), mask, ctx.has[1], (d_out, *d_finals))


@once_differentiable
def _steps_explicit_backward(
    ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The Triton steps' explicit BPTT (no graph of its own)."""
    x_flat, w_ih, w_hh, gates, *rest = ctx.saved_tensors[: ctx.num_main]
    n = ctx.num_states
    states, kept = tuple(rest[:n]), iter(rest[n:])
    mask, reset, rec, *reg = (next(kept) if has else None for has in ctx.has)
    hs = states[0]
    L = launch(hs, hs.shape[1], hs.shape[2], mask, reset, Reg(*reg))
    d_xp, d_rec, d_s0 = steps_backward(ctx.kernel, L, states, gates, rec, w_hh, d_out, d_finals)
    # needs_input_grad: kernel, mask, reset, reg, save, x, w_ih, w_hh, bias, bias_hn, s0...
    need = ctx.needs_input_grad[5:10]
    w = Weights(w_ih, w_hh, None, None)  # type: ignore[arg-type]
    grads = steps_weight_grads(ctx.kernel, L, x_flat, hs, rec, d_xp, d_rec, w, need)
    d_init = tuple(d if ctx.needs_input_grad[10 + k] else None for k, d in enumerate(d_s0))
    return (None, None, None, None, None, *grads, *d_init)


def _regularizers(kernel: Kernel, T: int, B: int, H: int, like: Tensor) -> tuple[Kernel, Reg]:
    """The cell's kernel and the regularizers' tensors, in ``like``'s dtype: the recurrent
    mask contiguous, the keep factors strided views (``RegularizedKernel.keep_views``)."""
    if not isinstance(kernel, RegularizedKernel):
        return kernel, Reg()
    keep: list[Tensor | None] = [None, None]
    for k, view in zip(kernel.zoned, kernel.keep_views(T, B, H, like.dtype), strict=True):
        keep[k] = view
    m = kernel.recurrent_mask
    rm = None if m is None else m.to(like.dtype).contiguous()
    return cast("Kernel", kernel.inner), Reg(rm, keep[0], keep[1])


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
    inner, reg = _regularizers(kernel, T, B, states0[0].shape[1], x)
    if type(inner) in LN_KERNELS:  # x: the normalised input part
        m, r = as_int8(mask, reset, T, B, x)
        return run_ln_steps(inner, x, weights, states0, m, r, (reg.rm, reg.kh, reg.kc), kernel)
    m, r = as_int8(mask, reset, T, B, x)
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    states = tuple(s.contiguous() for s in states0)
    result = _Steps.apply(kernel, m, r, reg, save, x, *weights, *states)
    return result[0], tuple(result[1:])
