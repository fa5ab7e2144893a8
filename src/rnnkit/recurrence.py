"""The one time loop: forward over T steps with masking, and the explicit BPTT backward.

This module holds the only ``for t in range(T)`` and the only reversed loop of the
library (DESIGN.md). Forward:

* all input projections in ONE matrix product before the loop: ``xp = x W_ihᵀ + b``;
* per step only the recurrent product and the gate math (the cell kernel's
  ``step_into``), written into preallocated time-major buffers;
* at a masked step the state is held: ``h_t = h_{t-1}`` (``c`` too), by selection —
  padding may hold NaN or huge values and never leaks (it is replaced by 0 up front).

Backward (SPEC §3), replaying the kernel's ``step_backward`` from ``t = T`` down to 1:

    d_h ← d_h + ∂ℓ/∂h_t (gradient of the outputs)
    at a real step:   d_gates_t, d_state_{t-1} = step_backward(d_state_t, …)
    at a masked step: d_gates_t = 0,  d_state_{t-1} = d_state_t  (passes straight through)

then every weight gradient is ONE matrix product over all steps:
``∂L/∂W_ih = d_gatesᵀ x``, ``∂L/∂W_hh = d_gatesᵀ h_prev``, ``∂L/∂x = d_gates W_ih``,
``∂L/∂b = Σ d_gates`` — as cuDNN and haste do.

Truncation is a property of this loop too: ``window=τ`` gives the exact BPTT(τ) of SPEC §3
(the loss at step t reaches back to ``h_{t−τ}`` and no further).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.cells.kernel import Kernel, Weights

__all__ = ["run_recurrence"]


def _forward_loop(
    kernel: Kernel,
    xps: tuple[Tensor, ...],
    mask: Tensor | None,
    states0: tuple[Tensor, ...],
    prep: Any,
    save: bool,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Run all steps. Returns state buffers ``(T + 1, B, H)`` (index 0 = initial) and the
    cache buffers ``(T, B, ·)`` (empty tuple's worth of scratch when ``save`` is False)."""
    T, B = xps[0].shape[0], xps[0].shape[1]
    H = states0[0].shape[1]
    states = tuple(xps[0].new_empty(T + 1, B, H) for _ in states0)
    for buf, s0 in zip(states, states0, strict=True):
        buf[0].copy_(s0)
    cache = kernel.alloc_cache(T, B, H, xps, save)
    cache_steps = [c.unbind(0) for c in cache]
    state_steps = [s.unbind(0) for s in states]
    xp_steps = [xp.unbind(0) for xp in xps]
    mask_steps = mask.unbind(0) if mask is not None else None
    n = len(states)
    for t in range(T):
        prev = tuple(state_steps[k][t] for k in range(n))
        out = tuple(state_steps[k][t + 1] for k in range(n))
        xp_t = tuple(xs[t] for xs in xp_steps)
        kernel.step_into(xp_t, prev, out, tuple(cs[t] for cs in cache_steps), prep)
        if mask_steps is not None:
            m = mask_steps[t]  # (B, 1) bool
            for k in range(n):
                torch.where(m, out[k], prev[k], out=out[k])  # hold state at padding
    return states, cache


class _Recurrence(torch.autograd.Function):
    """Autograd node whose backward is the library's explicit BPTT."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        kernel: Kernel,
        mask: Tensor | None,
        window: int | None,
        save: bool,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        T, B, I = x.shape
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        x_flat = x.reshape(T * B, I)
        xps = kernel.project_inputs(x_flat, w, T, B)  # (T, B, ·) buffers
        states, cache = _forward_loop(kernel, xps, mask, states0, kernel.prepare(w), save)
        if save:
            ctx.kernel, ctx.mask, ctx.window = kernel, mask, window
            ctx.has_bias_hn = bias_hn is not None
            ctx.save_for_backward(x_flat, weight_ih, weight_hh, *states, *cache)
            ctx.num_states = len(states)
        finals = tuple(s[-1].clone() for s in states)
        return (states[0][1:],) + finals  # outputs (T, B, H), final states (B, H) each

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None):  # type: ignore[override]
        kernel: Kernel = ctx.kernel
        mask: Tensor | None = ctx.mask
        saved = ctx.saved_tensors
        x_flat, weight_ih, weight_hh = saved[:3]
        n = ctx.num_states
        states, cache = saved[3 : 3 + n], saved[3 + n :]
        T, B, H = states[0].shape[0] - 1, states[0].shape[1], states[0].shape[2]
        G = kernel.gates
        w = Weights(weight_ih, weight_hh, None, None)
        bcache = kernel.backward_cache(cache, states)
        bcache_steps = [c.unbind(0) for c in bcache]
        state_steps = [s.unbind(0) for s in states]
        d_xp = x_flat.new_empty(T, B, G * H)
        separate_hp = getattr(kernel, "reset", None) == "after"
        d_hp = x_flat.new_empty(T, B, G * H) if separate_hp else d_xp
        d_xp_steps, d_hp_steps = d_xp.unbind(0), d_hp.unbind(0)
        d_out_steps = d_out.unbind(0) if d_out is not None else None
        mask_steps = mask.unbind(0) if mask is not None else None
        wprep = kernel.prepare_backward(w)

        d_state = [(d.clone() if d is not None else x_flat.new_zeros(B, H)) for d in d_finals]
        if ctx.window is not None:
            return _Recurrence._windowed(
                ctx,
                kernel,
                d_out,
                d_finals,
                w,
                wprep,
                bcache_steps,
                state_steps,
                d_xp,
                d_hp,
                x_flat,
                states,
                cache,
            )
        for t in range(T - 1, -1, -1):
            if d_out_steps is not None:
                d_state[0] = d_state[0] + d_out_steps[t]
            prev = tuple(state_steps[k][t] for k in range(n))
            new = tuple(state_steps[k][t + 1] for k in range(n))
            d_prev = kernel.step_backward(
                tuple(d_state),
                prev,
                new,
                tuple(c[t] for c in bcache_steps),
                d_xp_steps[t],
                d_hp_steps[t],
                wprep,
            )
            if mask_steps is not None:
                m = mask_steps[t]
                # Select, never multiply: a masked step contributes nothing to any weight,
                # and the gradient passes through it unchanged to the step before.
                d_xp_steps[t].masked_fill_(~m, 0)
                if separate_hp:
                    d_hp_steps[t].masked_fill_(~m, 0)
                d_prev = tuple(torch.where(m, dp, ds) for dp, ds in zip(d_prev, d_state, strict=True))
            d_state = list(d_prev)
        return _Recurrence._weight_grads(ctx, kernel, d_xp, d_hp, x_flat, w, states, cache, d_state)

    @staticmethod
    def _weight_grads(ctx, kernel, d_xp, d_hp, x_flat, w, states, cache, d_state0):
        T, B = d_xp.shape[0], d_xp.shape[1]
        H = states[0].shape[2]
        d_xp_flat = d_xp.view(T * B, -1)
        d_hp_flat = d_hp.view(T * B, -1)
        # needs_input_grad: kernel, mask, window, save, x, w_ih, w_hh, bias, bias_hn, s0...
        need = ctx.needs_input_grad[4:]
        d_x = (d_xp_flat @ w.weight_ih).view(T, B, -1) if need[0] else None
        d_w_ih = d_xp_flat.T @ x_flat if need[1] else None
        d_bias = d_xp_flat.sum(0) if need[3] else None
        d_w_hh = d_bias_hn = None
        if need[2] or need[4]:
            h_prev = states[0][:-1].reshape(T * B, H)
            flat_cache = tuple(c.reshape(T * B, -1) for c in cache)
            d_w_hh, d_bias_hn = kernel.recurrent_grads(d_hp_flat, h_prev, flat_cache)
        if not ctx.has_bias_hn:
            d_bias_hn = None
        return (None, None, None, None, d_x, d_w_ih, d_w_hh, d_bias, d_bias_hn, *d_state0)

    @staticmethod
    def _windowed(
        ctx,
        kernel,
        d_out,
        d_finals,
        w,
        wprep,
        bcache_steps,
        state_steps,
        d_xp,
        d_hp,
        x_flat,
        states,
        cache,
    ):
        """Exact BPTT(τ): the loss at step t reaches back through at most τ steps.

        The gradient injected at step t (from the outputs, or from the final state at
        t = T) is carried back τ steps — its own step and τ−1 earlier ones — and then
        dropped, so ``h_{t−τ}`` receives it but not the step that produced ``h_{t−τ}``.
        Each injection is propagated separately (O(T·τ) steps): the gradient of a sum
        of windows is not one backward sweep.
        """
        T = d_xp.shape[0]
        B, H = d_xp.shape[1], states[0].shape[2]
        n = len(states)
        tau: int = ctx.window
        mask_steps = ctx.mask.unbind(0) if ctx.mask is not None else None
        separate_hp = d_hp is not d_xp
        d_xp.zero_()
        if separate_hp:
            d_hp.zero_()
        G = d_xp.shape[2]
        tmp_xp = d_xp.new_empty(B, G)
        tmp_hp = d_xp.new_empty(B, G) if separate_hp else tmp_xp
        d_state0 = [x_flat.new_zeros(B, H) for _ in range(n)]
        # Injections: output gradient at each step t (into h_t); final-state gradients
        # count as losses at step T.
        injections: list[tuple[int, list[Tensor]]] = []
        for t in range(T):
            if d_out is not None:
                inj = [d_out[t]] + [x_flat.new_zeros(B, H) for _ in range(n - 1)]
                injections.append((t, inj))
        if any(d is not None for d in d_finals):
            inj = [d if d is not None else x_flat.new_zeros(B, H) for d in d_finals]
            injections.append((T - 1, inj))
        for t_inj, inj in injections:
            d_state = [d.clone() for d in inj]
            stop = max(t_inj - tau, -1)
            for t in range(t_inj, stop, -1):
                prev = tuple(state_steps[k][t] for k in range(n))
                new = tuple(state_steps[k][t + 1] for k in range(n))
                d_prev = kernel.step_backward(
                    tuple(d_state),
                    prev,
                    new,
                    tuple(c[t] for c in bcache_steps),
                    tmp_xp,
                    tmp_hp,
                    wprep,
                )
                if mask_steps is not None:
                    m = mask_steps[t]
                    tmp_xp.masked_fill_(~m, 0)
                    if separate_hp:
                        tmp_hp.masked_fill_(~m, 0)
                    d_prev = tuple(torch.where(m, dp, ds) for dp, ds in zip(d_prev, d_state, strict=True))
                d_xp[t] += tmp_xp
                if separate_hp:
                    d_hp[t] += tmp_hp
                d_state = list(d_prev)
            if stop == -1:  # the window reached the initial state
                for k in range(n):
                    d_state0[k] += d_state[k]
        return _Recurrence._weight_grads(
            ctx, kernel, d_xp, d_hp, x_flat, w, states, cache, d_state0
        )


def run_recurrence(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None = None,
    window: int | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run one direction of one layer over time with the explicit BPTT backward.

    Args:
        kernel: the cell's step math (``cell.kernel``).
        x: ``(T, B, I)`` time-major input.
        weights: the cell's parameters (``cell.weights()``).
        states0: initial state tensors, each ``(B, H)`` (``(h,)`` or ``(h, c)``).
        mask: ``(T, B)`` bool, True at real steps, or None (all real).
        window: None for full BPTT, or τ ≥ 1 for the exact windowed BPTT(τ).

    Returns:
        ``(outputs (T, B, H), final states)`` — the final states are those after each
        sequence's last real step (held across trailing padding).

    >>> from rnnkit.cells.rnn import RNNCell
    >>> cell = RNNCell(2, 3)
    >>> out, (h,) = run_recurrence(cell.kernel, torch.zeros(4, 1, 2), cell.weights(),
    ...                            (torch.zeros(1, 3),))
    >>> out.shape, bool(torch.equal(out[-1], h))
    (torch.Size([4, 1, 3]), True)
    """
    mask3 = None
    if mask is not None:
        mask3 = mask.unsqueeze(-1)  # (T, B, 1)
        # Padding may hold anything (NaN, 1e30): replace it before it can touch a product.
        x = torch.where(mask3, x, 0.0)
        if bool(mask.all()):
            mask3 = None
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    result = _Recurrence.apply(
        kernel,
        mask3,
        window,
        save,
        x,
        weights.weight_ih,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        *states0,
    )
    return result[0], tuple(result[1:])
