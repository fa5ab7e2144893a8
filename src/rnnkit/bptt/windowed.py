"""The exact windowed BPTT(τ): truncation as a property of the time loop.

``window=τ``: the gradient of the loss at step t flows back τ steps, to ``h_{t−τ}``, so
every product ``∂h_t/∂h_k`` has at most τ factors and the steps ``k = t−τ … t``
contribute to the weight gradients (τ = 3, t = 10: k = 7, 8, 9, 10; docs/bptt.md).
:func:`windowed_sweep` computes it lag by lag for one direction or for a whole stack (the
window then counts the steps of a path through every layer it crosses).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from rnnkit.bptt.record import ForwardRecord, Sweep, incoming_states, recurrent_grad_width
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights

__all__ = ["WindowUnit", "reorder", "windowed_sweep"]


class WindowUnit(NamedTuple):
    """One direction of one layer as ``windowed_sweep`` sees it (all in reading order).

    ``order`` maps time steps between the order of the layer's input and this direction's
    reading order, ``reading[t, b] = input[order[t, b], b]``; it is an involution (the same
    index maps back), None when the two orders agree.

    ``input_grad`` maps the gradient of the loop's input at steps ``0 … n−1``,
    ``(n, B, G·H)``, to the gradient of the unit's input there, in reading order; None
    for ``g ↦ g W_ih`` (a layer-normalised cell's loop reads ``ν(x W_xᵀ) ⊙ γ_x``:
    ``rnnkit.layers.windowed``).
    """

    kernel: Kernel
    record: ForwardRecord
    weights: Weights
    mask: Tensor | None  # (T, B, 1) bool in reading order, or None (every step real)
    order: Tensor | None = None  # (T, B) int64
    input_grad: Callable[[Tensor], Tensor] | None = None


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
        H = record.states[0].shape[2]
        self.width = kernel.gates * H
        self.hp_width = recurrent_grad_width(kernel, H)  # None: d_hp is d_xp
        self.separate = self.hp_width is not None

    def __call__(self, d_new: list[Tensor]) -> tuple[Tensor, Tensor, list[Tensor]]:
        """``d_new`` each ``(n, B, H)`` → ``(d_xp (n, B, G·H), d_hp, d_prev (n, B, H))``."""
        n, B, H = d_new[0].shape
        rows = n * B

        def flat(t: Tensor) -> Tensor:
            return t[:n].reshape(rows, t.shape[-1])

        like = d_new[0]
        g_xp = like.new_empty(rows, self.width)
        g_hp = g_xp if self.hp_width is None else like.new_empty(rows, self.hp_width)
        d_state = tuple(flat(d) for d in d_new)
        kernel: Kernel | RegularizedKernel = self.kernel
        if isinstance(kernel, RegularizedKernel):  # its recurrent mask, one per row
            kernel = kernel.for_rows(n)
        d_prev = kernel.step_backward(
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


@torch.no_grad()  # a gradient computation, never itself differentiated
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
    # One function, not split further: the lag loop, the per-layer pass down the stack at
    # one lag and the shift to the next lag share the gradient buffers of every layer and
    # direction, and the order of those three is the algorithm (docstring above).
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
    for layer_steps in steps:
        acc_xp.append([like.new_zeros(T, B, st.width) for st in layer_steps])
        acc_hp.append(
            [
                xp if st.hp_width is None else like.new_zeros(T, B, st.hp_width)
                for st, xp in zip(layer_steps, acc_xp[-1], strict=True)
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
                    back = u.input_grad
                    g_in = g_xp @ u.weights.weight_ih if back is None else back(g_xp)
                    g_in = reorder(g_in, u.order)
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
