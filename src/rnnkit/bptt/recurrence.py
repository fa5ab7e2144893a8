"""The one time loop: forward over T steps with masking, and the explicit BPTT backward.

This module holds the only ``for t in range(T)`` and the only reversed loop of the
library. Forward:

* all input projections in ONE matrix product before the loop: ``xp = x W_ihᵀ + b``;
* per step only the recurrent product and the gate math (the cell kernel's
  ``step_into``), written into preallocated time-major buffers;
* at a masked step the state is held: ``h_t = h_{t-1}`` (``c`` too), by selection —
  padding may hold NaN or huge values and never leaks (it is replaced by 0 up front).

Backward (docs/math.md, "Backpropagation through time"), replaying the kernel's
``step_backward`` from ``t = T`` down to 1:

    d_h ← d_h + ∂ℓ/∂h_t (gradient of the outputs)
    at a real step:   d_gates_t, d_state_{t-1} = step_backward(d_state_t, …)
    at a masked step: d_gates_t = 0,  d_state_{t-1} = d_state_t  (passes straight through)

then every weight gradient is ONE matrix product over all steps:
``∂L/∂W_ih = d_gatesᵀ x``, ``∂L/∂W_hh = d_gatesᵀ h_prev``, ``∂L/∂x = d_gates W_ih``,
``∂L/∂b = Σ d_gates`` — as cuDNN and haste do.

Truncation is a property of this loop too: ``window=τ`` gives the exact windowed BPTT(τ):
the gradient of the loss at step t flows back τ steps, to ``h_{t−τ}``, so every product
``∂h_t/∂h_k`` has at most τ factors and the steps ``k = t−τ … t`` contribute to the weight
gradients (τ = 3, t = 10: k = 7, 8, 9, 10; docs/bptt.md). ``windowed_sweep`` computes it
lag by lag for one direction or for a whole stack (the window then counts the steps of a
path through every layer it crosses).

A reset mask (``reset (T, B, 1)``, True where a new document starts) replaces the state
entering step t of those rows by zeros in the forward and stops the gradient there in the
backward; the record keeps it (``ForwardRecord.reset``) so that every reader of the
states sees the same incoming states (``incoming_states``).

Under ``torch.autocast`` (mixed precision) the loop runs with autocast off, in its
weights' dtype: a float16/bfloat16 input or initial state is cast up first (``rnnkit.cells.amp``
says why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt import native
from rnnkit.bptt.tracing import TracingError, check_tracer, tracing
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights

__all__ = [
    "ForwardRecord",
    "Grads",
    "Packing",
    "Sweep",
    "WindowUnit",
    "backward_sweep",
    "clean_padding",
    "forward_pass",
    "incoming_states",
    "make_packing",
    "reorder",
    "run_recurrence",
    "unpack_record",
    "weight_grads",
    "windowed_sweep",
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
    reset: Tensor | None = None,
) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Run all steps. Returns state buffers ``(T + 1, B, H)`` (index 0 = initial) and the
    cache buffers ``(T, B, ·)`` (empty tuple's worth of scratch when ``save`` is False).

    ``reset (T, B, 1)``: the rows whose state entering step t is replaced by zeros (the
    buffers keep each step's own result: ``incoming_states`` applies the reset)."""
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
    # Which steps reset a row: read once, so that the other steps pay nothing.
    resets = [] if reset is None else reset.any(1).view(-1).tolist()
    n = len(states)
    for t in range(T):
        prev = tuple(state_steps[k][t] for k in range(n))
        if resets and resets[t]:  # a new document: this step starts from the zero state
            prev = tuple(torch.where(reset[t], 0.0, p) for p in prev)  # type: ignore[index]
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
    reset: Tensor | None = None  # (T, B, 1) bool: state entering step t zeroed, or None


def incoming_states(record: ForwardRecord) -> tuple[Tensor, ...]:
    """The state each step starts from, ``(T, B, H)`` each: ``states[:-1]``, with zeros
    where the record resets a row (what the step actually read)."""
    prev = tuple(s[:-1] for s in record.states)
    if record.reset is None:
        return prev
    return tuple(torch.where(record.reset, 0.0, p) for p in prev)


class Packing(NamedTuple):
    """Which rows each step computes, for the compiled loop's packed buffers.

    Step t computes rows ``0 .. act_t − 1`` (rows sorted by their last real step, so the
    finished ones are at the end); its rows sit at ``offsets[t] .. offsets[t+1] − 1`` of
    the packed buffers, and ``rows`` maps packed rows to ``t·B + b``. Holes inside the
    computed rows still hold the state through the mask. Input projections and weight
    gradients then cost only the computed rows, not the padding.
    """

    offsets: Tensor  # (T + 1,) int64
    rows: Tensor  # (N,) int64: packed row -> t·B + b


def unpack_record(record: ForwardRecord, packing: Packing) -> ForwardRecord:
    """The padded ``(T·B, ·)`` / ``(T, B, ·)`` record of a packed one (rows never computed
    hold zeros: they are all past their row's last real step, so masked)."""
    T, B = record.states[0].shape[0] - 1, record.states[0].shape[1]

    def pad(t: Tensor) -> Tensor:
        return t.new_zeros(T * B, t.shape[-1]).index_copy_(0, packing.rows, t)

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
    """The compiled loop (``rnnkit.bptt.native``) if it handles this kernel and these tensors.

    Never while tracing (``torch.compile``/``torch.export``): a graph holds the PyTorch
    loop, the same function in operations a graph can represent (``rnnkit.bptt.tracing``)."""
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
    reset: Tensor | None = None,
) -> ForwardRecord:
    """Input projections in one product, then the step loop. ``x (T, B, I)``,
    ``mask (T, B, 1)`` bool or None; ``packing`` (compiled loop only) skips the rows
    that have finished (see ``Packing``); ``reset (T, B, 1)`` bool or None zeroes the
    state entering a step (the PyTorch loop: the compiled one has no resets). Under
    autocast it computes in the weights' dtype (module docstring)."""
    x, states0 = _like_weights(w, x, states0)
    T, B, I = x.shape
    x_flat = x.reshape(T * B, I)
    lib = _compiled(kernel, x, *w, *states0) if reset is None else None
    if lib is None and packing is not None:
        raise RuntimeError("a Packing needs the compiled loop (rnnkit.bptt.native)")
    if lib is not None:
        offsets = None
        if packing is not None:
            x_flat, offsets = x_flat.index_select(0, packing.rows), packing.offsets
        states, cache = kernel.native_forward(
            lib, x_flat, w, T, B, states0, _mask2(mask), save, offsets
        )
        return ForwardRecord(x_flat, states, cache)
    xps = kernel.project_inputs(x_flat, w, T, B)  # (T, B, ·) buffers
    states, cache = _forward_loop(kernel, xps, mask, states0, kernel.prepare(w), save, reset)
    return ForwardRecord(x_flat, states, cache, reset)


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
    """The explicit BPTT sweep from ``t = T`` down to 1.

    Args:
        d_out: ∂L/∂outputs ``(T, B, H)`` or None.  d_finals: ∂L/∂(final states).
        window: None for full BPTT, τ ≥ 1 for the exact BPTT(τ) (``windowed_sweep``).
        packing: the ``Packing`` the record was made with (its ``d_xp`` is then packed).
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
    lib = _compiled(kernel, like, w.weight_hh) if record.reset is None else None
    if packing is not None and lib is None:
        raise RuntimeError("a Packing needs the compiled loop (rnnkit.bptt.native) and no window")
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
    prev_steps = [p.unbind(0) for p in incoming_states(record)]
    G = kernel.gates
    separate_hp = getattr(kernel, "reset", None) == "after"
    d_xp = like.new_empty(T, B, G * H)
    # reset="after": d_hp holds the n block only (the r, z blocks equal d_xp's)
    d_hp = like.new_empty(T, B, H) if separate_hp else d_xp
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


class WindowUnit(NamedTuple):
    """One direction of one layer as ``windowed_sweep`` sees it (all in reading order).

    ``order`` maps time steps between the order of the layer's input and this direction's
    reading order, ``reading[t, b] = input[order[t, b], b]``; it is an involution (the same
    index maps back), None when the two orders agree.
    """

    kernel: Kernel
    record: ForwardRecord
    weights: Weights
    mask: Tensor | None  # (T, B, 1) bool in reading order, or None (every step real)
    order: Tensor | None = None  # (T, B) int64


def reorder(t: Tensor, order: Tensor | None) -> Tensor:
    """``t (T, B, ·)`` with its steps taken in ``order`` (``WindowUnit.order``)."""
    if order is None:
        return t
    return t.gather(0, order.view(*order.shape, 1).expand_as(t))


class _Steps:
    """The backward of steps ``0 … n−1`` of one unit in one batched call, each step with
    its own gradient of the state after it (``n·B`` rows for the kernel's step)."""

    def __init__(self, unit: WindowUnit) -> None:
        record, kernel = unit.record, unit.kernel
        self.kernel = kernel
        self.cache = kernel.backward_cache(record.cache, record.states)
        self.prev = incoming_states(record)
        self.new = tuple(s[1:] for s in record.states)
        self.mask, self.reset = unit.mask, record.reset
        self.wprep = kernel.prepare_backward(unit.weights)
        self.separate = getattr(kernel, "reset", None) == "after"
        self.width = kernel.gates * record.states[0].shape[2]

    def __call__(self, d_new: list[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
        """``d_new`` each ``(n, B, H)`` → ``(d_xp (n, B, G·H), d_hp, d_prev (n, B, H))``."""
        n, B, H = d_new[0].shape
        rows = n * B

        def flat(t: Tensor) -> Tensor:
            return t[:n].reshape(rows, t.shape[-1])

        like = d_new[0]
        g_xp = like.new_empty(rows, self.width)
        g_hp = like.new_empty(rows, H) if self.separate else g_xp
        d_state = tuple(flat(d) for d in d_new)
        d_prev = self.kernel.step_backward(
            d_state,
            tuple(flat(p) for p in self.prev),
            tuple(flat(s) for s in self.new),
            tuple(flat(c) for c in self.cache),
            g_xp,
            g_hp,
            self.wprep,
        )
        if self.mask is not None:  # as in backward_sweep: select, pass masked steps through
            m = flat(self.mask)
            g_xp.masked_fill_(~m, 0)
            if self.separate:
                g_hp.masked_fill_(~m, 0)
            d_prev = tuple(torch.where(m, a, b) for a, b in zip(d_prev, d_state, strict=True))
        if self.reset is not None:
            r = flat(self.reset)
            d_prev = tuple(torch.where(r, 0.0, d) for d in d_prev)
        return (
            g_xp.view(n, B, g_xp.shape[-1]),
            g_hp.view(n, B, g_hp.shape[-1]),
            [d.view(n, B, H) for d in d_prev],
        )


@without_autocast
def windowed_sweep(
    layers: Sequence[Sequence[WindowUnit]],
    d_out: Tensor | None,
    d_finals: Sequence[Sequence[tuple[Tensor | None, ...]]],
    window: int,
    drops: Sequence[Tensor | None] | None = None,
) -> list[list[Sweep]]:
    """The exact windowed BPTT(τ) of a stack of layers (bottom first; one layer: a list of
    its directions, whose outputs are concatenated), lag by lag.

    A loss at step t (an output gradient of the top layer, or a final-state gradient of
    any layer: a loss at step T) reaches a step only along paths of at most τ recurrent
    steps, counted in every layer the path crosses, in each direction's reading order:
    every Jacobian product ``∂s_t/∂s_k`` on the way keeps at most τ factors, and the steps
    reached contribute their local gradients (a path of j ≤ τ steps ends at a step whose
    weights, input and — for j < τ, at step 1 — initial state it reaches). For a
    unidirectional stack this is autograd of the truncated graph of the whole stack: every
    layer recomputed over steps ``t−τ … t`` from the detached states before them.

    Lag j holds, for every layer and step k, the gradient of the state after step k from
    the paths that have gone j steps: ONE batched backward step of all steps per layer and
    lag (``n·B`` rows), the layer's input gradient passed to the layer below at the same
    lag (where its own lag goes on), then shifted one step back for lag j + 1. The cost is
    ``(min(τ, span) + 1)`` batched steps per layer and direction, ``O(T·τ·L·D)`` step rows
    in all, the longest path ``span`` being ``T − 1`` steps (``L·(T − 1)`` when a reverse
    direction lets a path turn around).

    Args:
        layers: the units of every layer, bottom first (a reverse direction has an
            ``order``); the records' steps all ``(T, B)``.
        d_out: ∂L/∂(top outputs concatenated) ``(T, B, D·H)`` in the input order, or None.
        d_finals: ``d_finals[l][d]`` the gradients of unit (l, d)'s final states.
        window: τ ≥ 1.
        drops: ``drops[l]`` the dropout multiplier ``(T, B, ·)`` on the input of layer
            ``l`` (None where there is none): the gradient passed down is scaled by it.

    Returns:
        ``Sweep`` per unit (the gate gradients summed over all lags, the initial states').
    """
    first = layers[-1][0].record
    T, B = first.states[0].shape[0] - 1, first.states[0].shape[1]
    like = first.x
    steps = [[_Steps(u) for u in layer] for layer in layers]
    # With forward directions only, a path only goes back in time: lag j reaches steps
    # 0 … T−1−j only, and the batches shrink with the lag.
    shrink = all(u.order is None for layer in layers for u in layer)
    span = (T - 1) * (1 if shrink else len(layers))
    grads = [
        [[like.new_zeros(T, B, s.shape[2]) for s in u.record.states] for u in layer]
        for layer in layers
    ]
    d0 = [
        [[like.new_zeros(B, s.shape[2]) for s in u.record.states] for u in layer]
        for layer in layers
    ]
    acc_xp, acc_hp = [], []
    for layer, layer_steps in zip(layers, steps, strict=True):
        acc_xp.append([like.new_zeros(T, B, st.width) for st in layer_steps])
        acc_hp.append(
            [
                like.new_zeros(T, B, u.record.states[0].shape[2]) if st.separate else xp
                for u, st, xp in zip(layer, layer_steps, acc_xp[-1], strict=True)
            ]
        )
    if d_out is not None:
        col = 0
        for u, g in zip(layers[-1], grads[-1], strict=True):
            H = u.record.states[0].shape[2]
            g[0] += reorder(d_out[..., col : col + H], u.order)
            col += H
    for layer_grads, layer_d0, layer_finals in zip(grads, d0, d_finals, strict=True):
        for g, z, fin in zip(layer_grads, layer_d0, layer_finals, strict=True):
            for buf, zero, f in zip(g, z, fin, strict=True):
                if f is not None:
                    # the final state is a loss at step T (with no step: the initial state)
                    (buf[T - 1] if T else zero).add_(f)
    for j in range(min(window, span) + 1):
        n = T - j if shrink else T
        below: Tensor | None = None  # ∂/∂(input of layer l + 1) along paths of j steps
        for index in range(len(layers) - 1, -1, -1):
            layer = layers[index]
            if below is not None:
                drop = None if drops is None else drops[index + 1]
                if drop is not None:
                    below = below * drop[:n]
                col = 0
                for u, g in zip(layer, grads[index], strict=True):
                    H = u.record.states[0].shape[2]
                    g[0] = g[0] + reorder(below[..., col : col + H], u.order)
                    col += H
            below = None
            for d, u in enumerate(layer):
                g_xp, g_hp, d_prev = steps[index][d](grads[index][d])
                acc_xp[index][d][:n] += g_xp
                if steps[index][d].separate:
                    acc_hp[index][d][:n] += g_hp
                if index > 0:  # the same paths go on in the layer below, at the same lag
                    g_in = reorder(g_xp @ u.weights.weight_ih, u.order)
                    below = g_in if below is None else below + g_in
                if j < window:  # a path of j < τ steps at step 1 goes on to h_0
                    for d0_part, dp in zip(d0[index][d], d_prev, strict=True):
                        d0_part += dp[0]
                # one step back in time: what lag j + 1 starts from
                if shrink:
                    grads[index][d] = [dp[1:] for dp in d_prev]
                else:
                    grads[index][d] = [
                        torch.cat([dp[1:], torch.zeros_like(dp[:1])]) for dp in d_prev
                    ]
    return [
        [Sweep(xp, hp, tuple(z)) for xp, hp, z in zip(acc_xp[i], acc_hp[i], d0[i], strict=True)]
        for i in range(len(layers))
    ]


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
            d_x = d_x.new_zeros(T * B, d_x.shape[1]).index_copy_(0, packing.rows, d_x)
        d_x = d_x.view(T, B, d_x.shape[-1])
    d_w_ih = d_xp.T @ record.x if need[1] else None
    d_bias = d_xp.sum(0) if need[3] else None
    d_w_hh = d_bias_hn = None
    if need[2] or need[4]:
        h_prev = incoming_states(record)[0].reshape(T * B, H)
        if packing is not None:
            h_prev = h_prev.index_select(0, packing.rows)
        flat_cache = tuple(c.reshape(h_prev.shape[0], c.shape[-1]) for c in record.cache)
        d_hp = sweep.d_hp.reshape(h_prev.shape[0], sweep.d_hp.shape[-1])
        d_w_hh, d_bias_hn = kernel.recurrent_grads(d_xp, d_hp, h_prev, flat_cache)
    return Grads(d_x, d_w_ih, d_w_hh, d_bias, d_bias_hn if need[4] else None)


class _Recurrence(torch.autograd.Function):
    """Autograd node whose backward is the library's explicit BPTT."""

    @staticmethod
    def forward(
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
    def backward(ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None):
        saved = ctx.saved_tensors
        n = ctx.num_states
        record = ForwardRecord(saved[0], tuple(saved[3 : 3 + n]), tuple(saved[3 + n :]))
        # The backward reads no bias: None stands in for it.
        w = Weights(saved[1], saved[2], None, None)  # type: ignore[arg-type]
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
    if (
        mask is not None
        and mask3 is not None
        and _compiled(kernel, x, *weights, *states0) is not None
    ):
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
