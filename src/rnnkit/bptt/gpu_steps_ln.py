"""The layer-normalised LSTM and GRU (:mod:`rnnkit.cells.layer_norm`) on the Triton steps:
per step ONE recurrent product ``h_{t-1} W_hᵀ`` (``torch.mm``) and ONE launch
(:mod:`rnnkit.bptt.triton_ln_kernels`: ν of the product, the gates, the LSTM's ν(c_t));
the backward per step one launch (the docstring's backward of ν) and one product for
∂L/∂h_{t-1}; the gradients of ``W_h``, the bias and the gains after the loop, each one
product or sum over all steps. Holes (the state held) and resets (the state entering a
step zero) as :mod:`rnnkit.bptt.gpu_steps`. The input is the layer's normalised input
part ``ν(W_x x) γ_x`` (``reads_projected``). Recurrent dropout (the LSTM's) and zoneout
(:mod:`rnnkit.bptt.regularized`) as the plain cells' steps: the product reads
``h_{t-1} ⊙ m``, which the launch before wrote; the launch mixes zoneout's step; the
backward splits ∂L/∂h_t into the product's part, times ``m``, and the rest, and
``∂L/∂W_h = Σ d_qᵀ (h_{t-1} ⊙ m)``.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt.gpu_launch import rerun_gradients
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights, batched_gradients
from rnnkit.cells.layer_norm import LayerNormGRUKernel, LayerNormLSTMKernel

__all__ = ["run_ln_steps"]

LN_KERNELS = (LayerNormLSTMKernel, LayerNormGRUKernel)
_KERNELS = "rnnkit.bptt.triton_ln_kernels"


class _Flags:
    """What every launch of one call shares; ``reg``: recurrent dropout's mask ``(B, H)``
    (contiguous) and zoneout's keep factors of h and c, ``(T, B, H)`` views with the same
    step and row strides (``RegularizedKernel.keep_views``: 0 along an axis the factor
    does not vary on), in the steps' dtype, or None."""

    def __init__(
        self,
        hs: Tensor,
        mask: Tensor | None,
        reset: Tensor | None,
        reg: tuple[Tensor | None, ...] = (None, None, None),
    ) -> None:
        self.k: Any = importlib.import_module(_KERNELS)
        self.grid = (hs.shape[1],)  # one program per batch row
        block = 16
        while block < hs.shape[2]:
            block *= 2
        self.mask = hs if mask is None else mask
        self.reset = hs if reset is None else reset
        self.has_reset = reset is not None
        self.rm, kh, kc = reg
        zoned = kh if kh is not None else kc
        self.kw: dict[str, Any] = {
            "BLOCK": block,
            # a row of 1024 or more in one program: 8 warps (4 spilled registers there)
            "num_warps": 8 if block >= 1024 else 4,
            "HAS_MASK": mask is not None,
            "HAS_RESET": reset is not None,
            "enable_fp_fusion": True,
            "ZH": kh is not None,
            "kh": hs if kh is None else kh,  # a stand-in where absent
            # the keep factors' step and row strides (shared by kh and kc)
            "kt": 0 if zoned is None else zoned.stride(0),
            "kb": 0 if zoned is None else zoned.stride(1),
        }
        # the LSTM's launches take the recurrent mask and c's keep factors too
        self.lstm_kw = {
            **self.kw,
            "RMASK": self.rm is not None,
            "ZC": kc is not None,
            "rm": hs if self.rm is None else self.rm,
            "kc": hs if kc is None else kc,
        }

    def device(self, x: Tensor) -> Any:
        return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


@without_autocast
def _forward(
    kernel: Kernel, x: Tensor, w: Weights, states0: tuple[Tensor, ...],
    mask: Tensor | None, reset: Tensor | None, reg: tuple[Tensor | None, ...],
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], _Flags]:  # fmt: skip
    """``(states (T + 1, B, H) each, caches)``: LSTM ``(gates, nq, iq, nc, ic, tc)``,
    GRU ``(gates, nq, iq, qn)``, all ``(T, B, ·)``; ``reg`` as :class:`_Flags`'."""
    T, B, GH = x.shape
    H = w.weight_hh.shape[1]
    assert w.bias_hn is not None
    gains = w.bias_hn.contiguous()
    gates = (x + w.bias).contiguous()  # the input part + b, activated in place
    states = tuple(x.new_empty(T + 1, B, H) for _ in states0)
    for buf, s0 in zip(states, states0, strict=True):
        buf[0].copy_(s0)
    F = _Flags(states[0], mask, reset, reg)
    hs, w_t, hw = states[0], w.weight_hh.T, x.new_empty(B, GH)
    nq, iq = x.new_empty(T, B, GH), x.new_empty(T, B)
    # what each step's product reads: h_{t-1}, or h_{t-1} ⊙ m that the launch before wrote
    hm = None if F.rm is None else hs[0] * F.rm
    reads = hs.unbind(0) if hm is None else (hm,) * T
    with F.device(x):
        if isinstance(kernel, LayerNormLSTMKernel):
            nc, ic, tc = x.new_empty(T, B, H), x.new_empty(T, B), x.new_empty(T, B, H)
            kw = {**F.lstm_kw, "hm": hs if hm is None else hm}
            for t in range(T):
                torch.mm(reads[t], w_t, out=hw)
                F.k.ln_lstm_forward[F.grid](
                    gates, hw, hs, states[1], nq, iq, nc, ic, tc, gains, F.mask, F.reset,
                    t, B, H, **kw,
                )  # fmt: skip
            return states, (gates, nq, iq, nc, ic, tc), F
        assert isinstance(kernel, LayerNormGRUKernel)
        qn = x.new_empty(T, B, H)
        kw = {**F.kw, "KEEP": kernel.update == "keep"}
        for t in range(T):
            torch.mm(hs[t], w_t, out=hw)
            F.k.ln_gru_forward[F.grid](
                gates, hw, hs, nq, iq, qn, gains, F.mask, F.reset, t, B, H, **kw
            )  # fmt: skip
    return states, (gates, nq, iq, qn), F


@without_autocast
def _backward(
    kernel: Kernel,
    F: _Flags,
    states: tuple[Tensor, ...],
    cache: tuple[Tensor, ...],
    w_hh: Tensor,
    gains: Tensor,
    d_out: Tensor | None,
    d_finals: tuple[Tensor | None, ...],
) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
    """The sweep from step T down to 1: ``(d_xp, d_q, d_gains, ∂L/∂states0)``; ``d_q``
    ``(T, B, G·H)`` is ∂L/∂(W_h h_{t-1})."""
    hs = states[0]
    T, B, H = hs.shape[0] - 1, hs.shape[1], hs.shape[2]
    gates, nq = cache[0], cache[1]
    d_xp, d_q = torch.empty_like(gates), torch.empty_like(gates)
    d = [hs.new_zeros(B, H) if g is None else g.contiguous().clone() for g in d_finals]
    direct = hs.new_empty(B, H)
    if F.rm is not None:  # d[0]: ∂L/∂(h ⊙ m), direct the rest; the final state's is the rest
        direct.copy_(d[0])
        d[0].zero_()
    kw = {**F.kw, "HAS_DOUT": d_out is not None}
    lstm_kw = {**F.lstm_kw, "HAS_DOUT": d_out is not None}
    d_o = hs if d_out is None else d_out.contiguous()
    extra = hs.new_empty(T, B, H)  # the LSTM's ∂L/∂ĉ, the GRU's ∂L/∂q_n
    with F.device(hs):
        for t in range(T - 1, -1, -1):
            if isinstance(kernel, LayerNormLSTMKernel):
                F.k.ln_lstm_backward[F.grid](
                    gates, states[1], *cache[1:], gains, F.mask, F.reset, d[0], d[1], d_o,
                    d_xp, d_q, extra, direct, t, B, H, **lstm_kw,
                )  # fmt: skip
            else:
                F.k.ln_gru_backward[F.grid](
                    gates, hs, *cache[1:], gains, F.mask, F.reset, d[0], d_o, d_xp, d_q,
                    extra, direct, t, B, H, KEEP=kernel.update == "keep", **kw,  # type: ignore[attr-defined]
                )  # fmt: skip
            if F.rm is None:
                torch.addmm(direct, d_q[t], w_hh, out=d[0])
            else:  # the product's part only: the next launch multiplies it by m
                torch.mm(d_q[t], w_hh, out=d[0])
    if F.rm is not None:
        d[0] = torch.addcmul(direct, d[0], F.rm)
    if F.has_reset:  # a row reset at step 0 read no initial state
        d = [torch.where(F.reset[0, :, None] != 0, 0.0, g) for g in d]
    if isinstance(kernel, LayerNormLSTMKernel):  # γ_h; γ_c, β_c
        nc = cache[3]
        d_gains = torch.cat([(d_xp * nq).sum((0, 1)), (extra * nc).sum((0, 1)), extra.sum((0, 1))])
    else:  # γ_h over [d_ar, d_az, ∂L/∂q_n]; b_hn
        q_grad = torch.cat([d_xp[..., : 2 * H], extra], dim=2)
        d_gains = torch.cat([(q_grad * nq).sum((0, 1)), extra.sum((0, 1))])
    return d_xp, d_q, d_gains, tuple(d)


class _LNSteps(torch.autograd.Function):
    """One direction of one layer over the layer-normalised Triton steps."""

    @staticmethod
    def forward(
        ctx: Any,
        kernels: tuple[Kernel, Kernel],
        mask: Tensor | None,
        reset: Tensor | None,
        reg: tuple[Tensor | None, ...],
        save: bool,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        kernel, layer_kernel = kernels  # the cell's, and the layer's with its regularizers
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        states, cache, _ = _forward(kernel, x, w, states0, mask, reset, reg)
        if save:
            ctx.kernel, ctx.layer_kernel, ctx.n = kernel, layer_kernel, len(states)
            optional = (mask, reset, *reg)
            ctx.has = tuple(t is not None for t in optional)
            kept = [t for t in optional if t is not None]
            main = (weight_hh, bias_hn, *states, *cache, *kept)
            # the node's own inputs too: a differentiated gradient runs the forward again
            ctx.num_main = len(main)
            ctx.save_for_backward(*main, x, weight_ih, bias, *states0)
        return (states[0][1:], *(s[-1].clone() for s in states))

    @staticmethod
    def backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        # create_graph=True or a batch of incoming gradients under vmap: the launches have
        # neither a derivative nor a batching rule, so autograd through the plain steps
        if torch.is_grad_enabled() or batched_gradients(d_out, *d_finals):
            return _ln_steps_differentiable_backward(ctx, d_out, *d_finals)
        return _ln_steps_explicit_backward(ctx, d_out, *d_finals)


def _ln_steps_differentiable_backward(
    ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The gradients with a graph: the forward run again in the layer kernel's
    differentiable steps from the node's inputs (``rnnkit.bptt.unrolled``)."""
    saved = ctx.saved_tensors
    w_hh, gains = saved[0], saved[1]
    mask = saved[ctx.num_main - sum(ctx.has)] if ctx.has[0] else None
    x, w_ih, bias, *states0 = saved[ctx.num_main :]
    weights = Weights(w_ih, w_hh, bias, gains)
    grads = (d_out, *d_finals)
    return rerun_gradients(ctx, x, weights, tuple(states0), mask, ctx.has[1], grads)


@once_differentiable
def _ln_steps_explicit_backward(
    ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
) -> tuple[Tensor | None, ...]:
    """The Triton steps' explicit BPTT (no graph of its own)."""
    w_hh, gains, *rest = ctx.saved_tensors[: ctx.num_main]
    n, nc = ctx.n, 6 if ctx.n == 2 else 4
    states, cache = tuple(rest[:n]), tuple(rest[n : n + nc])
    kept = iter(rest[n + nc :])
    mask, reset, *reg = (next(kept) if has else None for has in ctx.has)
    hs = states[0]
    F = _Flags(hs, mask, reset, tuple(reg))
    d_xp, d_q, d_gains, d_s0 = _backward(
        ctx.kernel, F, states, cache, w_hh, gains.contiguous(), d_out, d_finals
    )
    T, B, H = d_xp.shape[0], d_xp.shape[1], hs.shape[2]
    # needs_input_grad: kernel, mask, reset, reg, save, x, w_ih, w_hh, bias, bias_hn,
    # s0...
    need = ctx.needs_input_grad[5:]
    d_hh = None
    if need[2]:
        h_prev = hs[:-1]
        if reset is not None:  # what each step's product read
            h_prev = torch.where(reset[:T, :, None] != 0, 0.0, h_prev)
        if F.rm is not None:  # the products read h_{t-1} ⊙ m
            h_prev = h_prev * F.rm
        d_hh = torch.mm(d_q.reshape(T * B, d_q.shape[2]).T, h_prev.reshape(T * B, H))
    d_b = d_xp.sum((0, 1)) if need[3] else None
    d_init = tuple(d if need[5 + k] else None for k, d in enumerate(d_s0))
    d_x = d_xp if need[0] else None
    return (None, None, None, None, None, d_x, None, d_hh, d_b,
            d_gains if need[4] else None, *d_init)  # fmt: skip


def run_ln_steps(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    reset: Tensor | None,
    reg: tuple[Tensor | None, ...] = (None, None, None),
    layer_kernel: Kernel | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """:func:`rnnkit.bptt.gpu_steps.run_steps` for a layer-normalised cell: ``x (T, B, G·H)``
    the normalised input part; ``mask (T, B)`` and ``reset (T + 1, B)`` int8 or None;
    ``reg``: recurrent dropout's mask ``(B, H)`` (the LSTM's only) and zoneout's keep
    factors of h and c, ``(T, B, H)`` views sharing their strides
    (``RegularizedKernel.keep_views``), in ``x``'s dtype, or None each; ``layer_kernel``:
    the :class:`~rnnkit.bptt.regularized.RegularizedKernel` those come from, whose plain
    steps a gradient differentiated again runs (None: ``kernel``, no regularizers)."""
    if reg[0] is not None and not isinstance(kernel, LayerNormLSTMKernel):
        raise ValueError("recurrent dropout has no layer-normalised GRU form")
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    states = tuple(s.contiguous() for s in states0)
    kernels = (kernel, kernel if layer_kernel is None else layer_kernel)
    result = _LNSteps.apply(kernels, mask, reset, reg, save, x.contiguous(), *weights, *states)
    return result[0], tuple(result[1:])
