"""The explicit BPTT backward of the time loop, and the weight gradients.

Backward (docs/math.md, "Backpropagation through time"), replaying the kernel's
``step_backward`` from ``t = T`` down to 1 (the library's only reversed loop over
time, besides the lag-by-lag one of ``rnnkit.bptt.windowed``):

    d_h ← d_h + ∂ℓ/∂h_t (gradient of the outputs)
    at a real step:   d_gates_t, d_state_{t-1} = step_backward(d_state_t, …)
    at a masked step: d_gates_t = 0,  d_state_{t-1} = d_state_t  (passes straight through)

then every weight gradient is ONE matrix product over all steps:
``∂L/∂W_ih = d_gatesᵀ x``, ``∂L/∂W_hh = d_gatesᵀ h_prev``, ``∂L/∂x = d_gates W_ih``,
``∂L/∂b = Σ d_gates`` — as cuDNN and haste do. A row whose state was reset at step t
passes no gradient back past it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.forward import _mask2
from rnnkit.bptt.record import (
    ForwardRecord,
    Grads,
    Packing,
    Sweep,
    incoming_states,
    recurrent_grad_width,
)
from rnnkit.bptt.windowed import WindowUnit, windowed_sweep
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights

__all__ = ["backward_sweep", "weight_grads"]


@torch.no_grad()  # a gradient computation, never itself differentiated (once_differentiable)
@without_autocast
def backward_sweep(
    kernel: Kernel,
    record: ForwardRecord,
    w: Weights,
    mask: Tensor | None,
    d_out: Tensor | None,
    d_finals: tuple[Tensor | None, ...],
    window: int | None = None,
    packing: Packing | None = None,
    need_x: bool = False,
) -> Sweep:
    """The explicit BPTT sweep from ``t = T`` down to 1.

    Args:
        d_out: ∂L/∂outputs ``(T, B, H)`` or None.  d_finals: ∂L/∂(final states).
        window: None for full BPTT, τ ≥ 1 for the exact BPTT(τ) (``windowed_sweep``).
        packing: the ``Packing`` the record was made with (its ``d_xp`` is then packed).
        need_x: ∂L/∂x will be needed: the compiled loop may compute it step by step
            (``Sweep.d_x``; ``weight_grads`` then skips the product ``d_xp W_ih``).
    """
    if window is not None:
        if packing is not None:
            raise RuntimeError(
                "a Packing needs the compiled loop (rnnkit.bptt.native) and no window"
            )
        unit = WindowUnit(kernel, record, w, mask)
        return windowed_sweep([[unit]], d_out, [[tuple(d_finals)]], window)[0][0]
    states, cache = record.states, record.cache
    T, B, H = states[0].shape[0] - 1, states[0].shape[1], states[0].shape[2]
    n = len(states)
    like = record.x
    lib = compiled_library(kernel, like, w.weight_hh) if record.reset is None else None
    if packing is not None and lib is None:
        raise RuntimeError("a Packing needs the compiled loop (rnnkit.bptt.native) and no window")
    if lib is not None:
        d_states = tuple(
            like.new_zeros(B, H) if d is None else d.contiguous().clone() for d in d_finals
        )
        offsets = None if packing is None else packing.offsets
        result = kernel.native_backward(
            lib, record, w, _mask2(mask), d_out, d_states, offsets, need_x
        )
        d_xp, d_hp, d0, d_x, d_bias = result[:5]
        d_bias_hn = result[5] if len(result) > 5 else None
        return Sweep(d_xp, d_hp, tuple(d0), d_x, d_bias, d_bias_hn)
    bcache_steps = [c.unbind(0) for c in kernel.backward_cache(cache, states)]
    state_steps = [s.unbind(0) for s in states]
    prev_steps = [p.unbind(0) for p in incoming_states(record)]
    d_xp = like.new_empty(T, B, kernel.gates * H)
    d_hp = _recurrent_gradients_buffer(kernel, d_xp, H)
    separate_hp = d_hp is not d_xp
    mask_steps = mask.unbind(0) if mask is not None else None
    reset_steps = record.reset.unbind(0) if record.reset is not None else None
    wprep = kernel.prepare_backward(w)
    d_state = [like.new_zeros(B, H) if d is None else d.clone() for d in d_finals]
    for t in range(T - 1, -1, -1):
        if d_out is not None:
            d_state[0] = d_state[0] + d_out[t]
        prev = tuple(prev_steps[k][t] for k in range(n))
        new = tuple(state_steps[k][t + 1] for k in range(n))
        g_xp, g_hp = d_xp[t], d_hp[t]
        d_prev = kernel.step_backward(
            tuple(d_state), prev, new, tuple(c[t] for c in bcache_steps), g_xp, g_hp, wprep
        )
        if mask_steps is not None:
            m = mask_steps[t]
            # Select, never multiply: a masked step contributes nothing to any weight,
            # and the gradient passes through it unchanged to the step before.
            g_xp.masked_fill_(~m, 0)
            if separate_hp:
                g_hp.masked_fill_(~m, 0)
            d_prev = tuple(torch.where(m, a, b) for a, b in zip(d_prev, d_state, strict=True))
        if reset_steps is not None:  # the step read the zero state: nothing flows back
            d_prev = tuple(torch.where(reset_steps[t], 0.0, d) for d in d_prev)
        d_state = list(d_prev)
    return Sweep(d_xp, d_hp, tuple(d_state))


def _recurrent_gradients_buffer(kernel: Kernel, d_xp: Tensor, H: int) -> Tensor:
    """Where the sweep writes the gradients of the recurrent pre-activations: ``d_xp``
    itself where they equal the input side's, else a buffer of their own
    (:func:`rnnkit.bptt.record.recurrent_grad_width`)."""
    width = recurrent_grad_width(kernel, H)
    return d_xp if width is None else d_xp.new_empty(d_xp.shape[0], d_xp.shape[1], width)


@without_autocast
def weight_grads(
    kernel: Kernel,
    record: ForwardRecord,
    sweep: Sweep,
    w: Weights,
    need: tuple[bool, ...],
    packing: Packing | None = None,
    projected: bool = False,
) -> Grads:
    """Every gradient as ONE matrix product (or sum) over all steps.

    ``need`` flags (x, weight_ih, weight_hh, bias, bias_hn); with ``packing`` the products
    run over the computed rows only and ``∂L/∂x`` is scattered back to ``(T, B, I)``.
    ``projected``: ``x`` was the input product itself (``forward_pass``): ``∂L/∂x`` is
    ``d_xp`` and ``weight_ih`` gets no gradient here (the caller's product gives it one);
    the same for a kernel that always reads it so (``reads_projected``).
    """
    T, B, H = (s - k for s, k in zip(record.states[0].shape, (1, 0, 0), strict=True))
    d_xp = sweep.d_xp.reshape(-1, sweep.d_xp.shape[-1])  # (T·B or N, G·H)
    # Where the time loop ran compiled, so do these products: the library's own matmul
    # (torch's BLAS may take a path at half the machine's rate, e.g. MKL on AMD CPUs).
    lib = compiled_library(kernel, d_xp, w.weight_hh) if record.reset is None else None
    mm = torch.mm if lib is None else lib.matmul
    d_x = None
    if need[0]:
        if projected or getattr(kernel, "reads_projected", False):
            d_x = d_xp
        elif sweep.d_x is not None:  # the compiled loop's, step by step
            d_x = sweep.d_x.reshape(-1, sweep.d_x.shape[-1])
        else:
            d_x = mm(d_xp, w.weight_ih)
        if packing is not None:  # rows never computed get no gradient
            d_x = d_x.new_zeros(T * B, d_x.shape[1]).index_copy_(0, packing.rows, d_x)
        d_x = d_x.view(T, B, d_x.shape[-1])
    # x (T, B, I) as the compiled loop read it in place: the library's product takes its
    # rows where they lie; torch's (the compiled loop switched off since the forward)
    # needs the (T·B, I) rows
    x = record.x
    x = x.reshape(-1, x.shape[-1]) if x.dim() == 3 and lib is None else x
    d_w_ih = mm(d_xp.T, x) if need[1] and not projected else None
    d_bias = None
    if need[3]:  # summed by the compiled loop where it could, while the rows were in cache
        d_bias = sweep.d_bias if sweep.d_bias is not None else d_xp.sum(0)
    d_w_hh = d_bias_hn = None
    if need[2] or need[4]:
        h_prev = incoming_states(record)[0].reshape(T * B, H)
        if packing is not None:
            h_prev = h_prev.index_select(0, packing.rows)
        d_hp = sweep.d_hp.reshape(h_prev.shape[0], sweep.d_hp.shape[-1])
        if sweep.d_bias_hn is not None:  # summed by the compiled loop; d_hp: ∂L/∂(W_h h)
            # the product's operand: h_{t-1} ⊙ m under recurrent dropout (regularized.py)
            operand = getattr(kernel, "recurrent_operand", None)
            h_read = h_prev if operand is None else operand(h_prev)
            d_w_hh, d_bias_hn = mm(d_hp.T, h_read), sweep.d_bias_hn
        else:
            flat_cache = tuple(c.reshape(h_prev.shape[0], c.shape[-1]) for c in record.cache)
            d_w_hh, d_bias_hn = kernel.recurrent_grads(d_xp, d_hp, h_prev, flat_cache, mm)
    return Grads(d_x, d_w_ih, d_w_hh, d_bias, d_bias_hn if need[4] else None)
