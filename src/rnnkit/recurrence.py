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

Truncation is a property of this loop too: ``window=τ`` gives the exact windowed BPTT(τ):
the gradient of the loss at step t flows back τ steps, to ``h_{t−τ}``, so every product
``∂h_t/∂h_k`` has at most τ factors and the steps ``k = t−τ … t`` contribute to the weight
gradients (τ = 3, t = 10: k = 7, 8, 9, 10; docs/bptt.md).

Under ``torch.autocast`` (mixed precision) the loop runs with autocast off, in its
weights' dtype: a float16/bfloat16 input or initial state is cast up first (``rnnkit.amp``
says why).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit import native
from rnnkit.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.tracing import TracingError, check_tracer, tracing

__all__ = [
    "ForwardRecord",
    "Grads",
    "Packing",
    "Sweep",
    "backward_sweep",
    "clean_padding",
    "forward_pass",
    "make_packing",
    "run_recurrence",
    "unpack_record",
    "weight_grads",
]


def _like_weights(
    w: Weights, x: Tensor, states0: tuple[Tensor, ...]
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``x`` and ``states0`` in the weights' dtype: a float16/bfloat16 input (an autocast
    product upstream) meets float32 weights here. A no-op when the dtypes agree."""
    dtype = w.weight_hh.dtype
    if x.dtype != dtype and x.is_floating_point():
        x = x.to(dtype)
    return x, tuple(s.to(dtype) if s.dtype != dtype else s for s in states0)


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


class ForwardRecord(NamedTuple):
    """What the forward pass keeps for the explicit backward (all time-major).

    With a ``Packing``, ``x`` and the cache hold only the rows each step computes, in
    packed order (``(N, ·)``, like ``PackedSequence.data``); the states stay padded.
    """

    x: Tensor  # (T·B, I) input, padding replaced by 0 — or (N, I) packed
    states: tuple[Tensor, ...]  # each (T + 1, B, H); index 0 = initial state
    cache: tuple[Tensor, ...]  # the kernel's per-step cache, each (T, B, ·) — or (N, ·)


class Packing(NamedTuple):
    """Which rows each step computes, for the compiled loop's packed buffers.

    Step t computes rows ``0 .. act_t − 1`` (rows sorted by their last real step, so the
    finished ones are at the end); its rows sit at ``offsets[t] .. offsets[t+1] − 1`` of
    the packed buffers, and ``index`` maps packed rows to ``t·B + b``. Holes inside the
    computed rows still hold the state through the mask. Input projections and weight
    gradients then cost only the computed rows, not the padding.
    """

    offsets: Tensor  # (T + 1,) int64
    index: Tensor  # (N,) int64


def unpack_record(record: ForwardRecord, packing: Packing) -> ForwardRecord:
    """The padded ``(T·B, ·)`` / ``(T, B, ·)`` record of a packed one (rows never computed
    hold zeros: they are all past their row's last real step, so masked)."""
    T, B = record.states[0].shape[0] - 1, record.states[0].shape[1]

    def pad(t: Tensor) -> Tensor:
        return t.new_zeros(T * B, t.shape[-1]).index_copy_(0, packing.index, t)

    cache = tuple(pad(c).view(T, B, c.shape[-1]) for c in record.cache)
    return ForwardRecord(pad(record.x), record.states, cache)


def make_packing(mask: Tensor) -> Packing | None:
    """The packing of a ``(T, B)`` mask, or None when every step computes every row.

    >>> make_packing(torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)).offsets
    tensor([0, 2, 3, 3])
    """
    T, B = mask.shape
    if mask.numel() == 0:
        return None
    steps = torch.arange(T, device=mask.device)
    rows = torch.arange(1, B + 1, device=mask.device)
    last = torch.where(mask, steps[:, None], -1).amax(0)  # (B,) last real step, −1 if none
    computed = last[None, :] >= steps[:, None]  # (T, B): row still has a real step ahead
    act = (computed * rows).amax(1)  # (T,) 1 + the last such row
    if bool((act == B).all()):
        return None
    offsets = torch.zeros(T + 1, dtype=torch.long, device=mask.device)
    torch.cumsum(act, 0, out=offsets[1:])
    flat = torch.arange(T * B, device=mask.device).view(T, B)
    return Packing(offsets, flat[rows[None, :] <= act[:, None]])


class Sweep(NamedTuple):
    """The result of the backward sweep: gradients of every step's pre-activations.

    ``d_xp[t]`` is ∂L/∂(input pre-activation of step t), ``(T, B, G·H)``; ``d_hp`` the
    same for the recurrent pre-activation (the same tensor unless the cell is a GRU with
    ``reset="after"``); ``d_states0`` the gradients of the initial state. Summing the
    per-step outer products of these gives the weight gradients (``weight_grads``).
    """

    d_xp: Tensor
    d_hp: Tensor
    d_states0: tuple[Tensor, ...]


def _compiled(kernel: Kernel, *tensors: Tensor | None) -> Any:
    """The compiled loop (``rnnkit.native``) if it handles this kernel and these tensors.

    Never while tracing (``torch.compile``/``torch.export``): a graph holds the PyTorch
    loop, the same function in operations a graph can represent (``rnnkit.tracing``)."""
    if not hasattr(kernel, "native_forward") or not native.supports(*tensors) or tracing():
        return None
    return native.library()


def _mask2(mask: Tensor | None) -> Tensor | None:
    return None if mask is None else mask[..., 0].contiguous()  # (T, B, 1) → (T, B)


@without_autocast
def forward_pass(
    kernel: Kernel,
    x: Tensor,
    w: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    save: bool,
    packing: Packing | None = None,
) -> ForwardRecord:
    """Input projections in one product, then the step loop. ``x (T, B, I)``,
    ``mask (T, B, 1)`` bool or None; ``packing`` (compiled loop only) skips the rows
    that have finished (see ``Packing``). Under autocast it computes in the weights'
    dtype (module docstring)."""
    x, states0 = _like_weights(w, x, states0)
    T, B, I = x.shape
    x_flat = x.reshape(T * B, I)
    lib = _compiled(kernel, x, *w, *states0)
    if lib is None and packing is not None:
        raise RuntimeError("a Packing needs the compiled loop (rnnkit.native)")
    if lib is not None:
        offsets = None
        if packing is not None:
            x_flat, offsets = x_flat.index_select(0, packing.index), packing.offsets
        states, cache = kernel.native_forward(
            lib, x_flat, w, T, B, states0, _mask2(mask), save, offsets
        )
        return ForwardRecord(x_flat, states, cache)
    xps = kernel.project_inputs(x_flat, w, T, B)  # (T, B, ·) buffers
    states, cache = _forward_loop(kernel, xps, mask, states0, kernel.prepare(w), save)
    return ForwardRecord(x_flat, states, cache)


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
) -> Sweep:
    """The explicit BPTT sweep from ``t = T`` down to 1 (SPEC §3).

    Args:
        d_out: ∂L/∂outputs ``(T, B, H)`` or None.  d_finals: ∂L/∂(final states).
        window: None for full BPTT, τ ≥ 1 for the exact BPTT(τ).
        packing: the ``Packing`` the record was made with (its ``d_xp`` is then packed).
    """
    states, cache = record.states, record.cache
    T, B, H = states[0].shape[0] - 1, states[0].shape[1], states[0].shape[2]
    n = len(states)
    like = record.x
    lib = _compiled(kernel, like, w.weight_hh) if window is None else None
    if packing is not None and (lib is None or window is not None):
        raise RuntimeError("a Packing needs the compiled loop (rnnkit.native) and no window")
    if lib is not None:
        d_states = tuple(
            like.new_zeros(B, H) if d is None else d.contiguous().clone() for d in d_finals
        )
        d_out_c = None if d_out is None else d_out.contiguous()
        offsets = None if packing is None else packing.offsets
        d_xp, d_hp, d0 = kernel.native_backward(
            lib, record, w, _mask2(mask), d_out_c, d_states, offsets
        )
        return Sweep(d_xp, d_hp, tuple(d0))
    bcache_steps = [c.unbind(0) for c in kernel.backward_cache(cache, states)]
    state_steps = [s.unbind(0) for s in states]
    G = kernel.gates
    separate_hp = getattr(kernel, "reset", None) == "after"
    d_xp = like.new_zeros(T, B, G * H) if window else like.new_empty(T, B, G * H)
    # reset="after": d_hp holds the n block only (the r, z blocks equal d_xp's)
    d_hp = (like.new_zeros(T, B, H) if window else like.new_empty(T, B, H)) if separate_hp else d_xp
    mask_steps = mask.unbind(0) if mask is not None else None
    wprep = kernel.prepare_backward(w)
    zeros = [like.new_zeros(B, H) for _ in range(n)]
    finals = [d if d is not None else z for d, z in zip(d_finals, zeros, strict=True)]

    def sweep(d_state: list[Tensor], t_from: int, t_stop: int, out_xp, out_hp) -> list[Tensor]:
        # One reversed pass over steps t_from .. t_stop+1, writing the gate gradients of
        # step t into out_xp(t)/out_hp(t); returns the gradient of the state before.
        for t in range(t_from, t_stop, -1):
            if d_out is not None and window is None:
                d_state[0] = d_state[0] + d_out[t]
            prev = tuple(state_steps[k][t] for k in range(n))
            new = tuple(state_steps[k][t + 1] for k in range(n))
            g_xp, g_hp = out_xp(t), out_hp(t)
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
            if window is not None:  # accumulate: several windows touch the same step
                d_xp[t] += g_xp
                if separate_hp:
                    d_hp[t] += g_hp
            d_state = list(d_prev)
        return d_state

    if window is None:
        d_xp_steps, d_hp_steps = d_xp.unbind(0), d_hp.unbind(0)
        d0 = sweep(
            [d.clone() for d in finals], T - 1, -1, d_xp_steps.__getitem__, d_hp_steps.__getitem__
        )
        return Sweep(d_xp, d_hp, tuple(d0))

    # Exact BPTT(τ): the loss at step t (its output gradient; the final-state gradient
    # counts as a loss at step T) is carried back to h_{t−τ} (τ Jacobian factors), and the
    # step producing h_{t−τ} still contributes its local gradient: steps t−τ … t, τ + 1 of
    # them. h_{t−τ−1} receives nothing, so the initial state h_0 is reached only for t ≤ τ.
    # Each injection is its own sweep (O(T·τ) steps): a sum of windows is not one sweep.
    tmp_xp = like.new_empty(B, G * H)
    tmp_hp = like.new_empty(B, H) if separate_hp else tmp_xp
    d0 = [z.clone() for z in zeros]
    injections = [(t, [d_out[t], *zeros[1:]]) for t in range(T)] if d_out is not None else []
    if any(d is not None for d in d_finals):
        injections.append((T - 1, finals))
    for t_inj, inj in injections:
        # 0-based step t_inj is 1-based step t = t_inj + 1; its window is 1-based steps
        # t − τ … t, i.e. 0-based t_inj − τ − 1 (exclusive) down to t_inj − τ.
        stop = t_inj - window - 1
        d_state = sweep(
            [d.clone() for d in inj], t_inj, max(stop, -1), lambda t: tmp_xp, lambda t: tmp_hp
        )
        if stop < -1:  # t ≤ τ: ∂h_t/∂h_0 has at most τ factors, h_0 is inside the window
            for k in range(n):
                d0[k] += d_state[k]
    return Sweep(d_xp, d_hp, tuple(d0))


class Grads(NamedTuple):
    """Gradients of one direction of one layer (None where not asked for)."""

    x: Tensor | None  # (T, B, I)
    weight_ih: Tensor | None
    weight_hh: Tensor | None
    bias: Tensor | None
    bias_hn: Tensor | None


@without_autocast
def weight_grads(
    kernel: Kernel,
    record: ForwardRecord,
    sweep: Sweep,
    w: Weights,
    need: tuple[bool, ...],
    packing: Packing | None = None,
) -> Grads:
    """Every gradient as ONE matrix product (or sum) over all steps.

    ``need`` flags (x, weight_ih, weight_hh, bias, bias_hn); with ``packing`` the products
    run over the computed rows only and ``∂L/∂x`` is scattered back to ``(T, B, I)``.
    """
    T, B, H = (s - k for s, k in zip(record.states[0].shape, (1, 0, 0), strict=True))
    d_xp = sweep.d_xp.reshape(-1, sweep.d_xp.shape[-1])  # (T·B or N, G·H)
    d_x = None
    if need[0]:
        d_x = d_xp @ w.weight_ih
        if packing is not None:  # rows never computed get no gradient
            d_x = d_x.new_zeros(T * B, d_x.shape[1]).index_copy_(0, packing.index, d_x)
        d_x = d_x.view(T, B, d_x.shape[-1])
    d_w_ih = d_xp.T @ record.x if need[1] else None
    d_bias = d_xp.sum(0) if need[3] else None
    d_w_hh = d_bias_hn = None
    if need[2] or need[4]:
        h_prev = record.states[0][:-1].reshape(T * B, H)
        if packing is not None:
            h_prev = h_prev.index_select(0, packing.index)
        flat_cache = tuple(c.reshape(h_prev.shape[0], c.shape[-1]) for c in record.cache)
        d_hp = sweep.d_hp.reshape(h_prev.shape[0], sweep.d_hp.shape[-1])
        d_w_hh, d_bias_hn = kernel.recurrent_grads(d_xp, d_hp, h_prev, flat_cache)
    return Grads(d_x, d_w_ih, d_w_hh, d_bias, d_bias_hn if need[4] else None)


class _Recurrence(torch.autograd.Function):
    """Autograd node whose backward is the library's explicit BPTT."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        kernel: Kernel,
        mask: Tensor | None,
        window: int | None,
        save: bool,
        packing: Packing | None,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        record = forward_pass(kernel, x, w, states0, mask, save, packing)
        if save:
            ctx.kernel, ctx.mask, ctx.window, ctx.packing = kernel, mask, window, packing
            ctx.num_states = len(record.states)
            ctx.save_for_backward(record.x, weight_ih, weight_hh, *record.states, *record.cache)
        finals = tuple(s[-1].clone() for s in record.states)
        return (record.states[0][1:], *finals)  # outputs (T, B, H), final states (B, H)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None):  # type: ignore[override]
        saved = ctx.saved_tensors
        n = ctx.num_states
        record = ForwardRecord(saved[0], tuple(saved[3 : 3 + n]), tuple(saved[3 + n :]))
        w = Weights(saved[1], saved[2], None, None)
        packing = ctx.packing
        if packing is not None and ctx.window is not None:
            # BPTT(τ) is the PyTorch sweep, which reads padded buffers. (The forward still
            # ran packed: truncation changes gradients only, never values, to the bit.)
            record, packing = unpack_record(record, packing), None
        sweep = backward_sweep(
            ctx.kernel, record, w, ctx.mask, d_out, d_finals, ctx.window, packing
        )
        # needs_input_grad: kernel, mask, window, save, packing, x, w_ih, w_hh, bias,
        # bias_hn, s0...
        need = ctx.needs_input_grad[5:10]
        g = weight_grads(ctx.kernel, record, sweep, w, need, packing)
        d_s0 = tuple(
            d if ctx.needs_input_grad[10 + k] else None for k, d in enumerate(sweep.d_states0)
        )
        return (None, None, None, None, None, *g, *d_s0)


def clean_padding(x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """``x (T, B, I)`` with its padding replaced by 0, and the mask as ``(T, B, 1)`` —
    None when every step is real. Padding may hold anything (NaN, 1e30): it is replaced
    before it can touch a product (selection, never a multiplication by the mask)."""
    if mask is None:
        return x, None
    mask3 = mask.unsqueeze(-1)
    x = torch.where(mask3, x, 0.0)
    if tracing():  # a graph cannot branch on the data: keep the mask (same result)
        return x, mask3
    return x, None if bool(mask.all()) else mask3


def _traced_recurrence(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    window: int | None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """The time loop as a graph can hold it (``torch.compile``, ``torch.export``, ONNX):
    out-of-place steps of the kernel's differentiable step, the state held at padded
    steps by selection, gradients by autograd (the explicit BPTT equals them: tested).
    The loop over ``T`` is unrolled into the graph."""
    if window is not None and torch.is_grad_enabled():
        raise TracingError(
            f"window={window} (truncated BPTT) cannot be traced by torch.compile/export: "
            "train it eagerly (the traced graph's gradients are full BPTT)"
        )
    x, states0 = _like_weights(weights, x, states0)
    x, mask3 = clean_padding(x, mask)
    step = kernel.step  # type: ignore[attr-defined]
    states, outputs = states0, []
    for t in range(x.shape[0]):
        new = step(x[t], states, weights)
        if mask3 is not None:
            new = tuple(torch.where(mask3[t], a, b) for a, b in zip(new, states, strict=True))
        outputs.append(new[0])
        states = new
    if not outputs:
        return x.new_zeros(0, x.shape[1], states0[0].shape[1]), states0
    return torch.stack(outputs), tuple(states)


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
    check_tracer()
    if tracing():
        return _traced_recurrence(kernel, x, weights, states0, mask, window)
    # Under autocast the input (or a state) may come from a float16/bfloat16 product; the
    # recurrence runs in the weights' dtype (module docstring). Cast here, outside the
    # autograd node, so the cast is differentiable and the compiled loop is chosen below.
    x, states0 = _like_weights(weights, x, states0)
    x, mask3 = clean_padding(x, mask)
    order = packing = None
    if mask3 is not None and _compiled(kernel, x, *weights, *states0) is not None:
        # The compiled loop stops computing rows after their last real step when rows are
        # sorted by it (as packed sequences are): sort here, undo the order on the way out,
        # and pack the steps' buffers so that the products skip the finished rows too.
        steps = torch.arange(1, x.shape[0] + 1, device=x.device)
        last = torch.where(mask, steps[:, None], 0).amax(0)  # (B,) last real step + 1
        if bool((last[1:] > last[:-1]).any()):
            order = torch.argsort(last, descending=True, stable=True)
            x = x.index_select(1, order)
            mask3 = mask3.index_select(1, order)
            states0 = tuple(s.index_select(0, order) for s in states0)
        packing = make_packing(mask3[..., 0])
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    result = _Recurrence.apply(
        kernel,
        mask3,
        window,
        save,
        packing,
        x,
        weights.weight_ih,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        *states0,
    )
    outputs, finals = result[0], tuple(result[1:])
    if order is not None:
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        outputs = outputs.index_select(1, inverse)
        finals = tuple(f.index_select(0, inverse) for f in finals)
    return outputs, finals
