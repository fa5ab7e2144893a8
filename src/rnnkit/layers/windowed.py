"""Windowed BPTT(τ) of a whole stack: one autograd node over every layer and direction.

One node per layer would count the window in each layer on its own: the loss at step t
would reach layer 1 about ``L·τ`` steps back. Here the stack's backward is one lag-by-lag
sweep (``rnnkit.bptt.windowed.windowed_sweep``) that counts a path's steps from the loss,
through every layer it crosses, so a unidirectional stack gets exactly the truncated
graph of the whole stack: every layer recomputed over steps ``t−τ … t`` from the detached
states before them. Document starts inside the batch (``reset``) are handled inside the
same loop, so the window also counts across them: a row that does not start there keeps
its window, a row that does gets no gradient across its start.

The forward is the usual one (``forward_pass``: on a GPU the Triton steps, on the CPU the
compiled loop where it applies, the PyTorch loop when rows reset), layer after layer, the
dropout between layers given as multipliers. A layer-normalised cell's loop reads its
input part ``ν(x W_xᵀ) ⊙ γ_x``, computed here for every step at once; the sweep passes a
gradient ``g`` of that part down as ``ν'(g ⊙ γ_x) W_x`` (``normalize_backward``), at the
same lag, since the part is a function of the same step's input only. The regularizers
of the recurrence act as in the plain loop: weight drop's ``W_hh ⊙ M`` is the node's
weight, recurrent dropout and zoneout run in each unit's step (``regularized``), forward
and in the lag sweep. A stack of float16/bfloat16 weights on the CPU runs in float32,
its outputs and final states rounded once to the weights' dtype
(``rnnkit.cells.amp.computes_in_float32``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from rnnkit.bptt.backward import weight_grads
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.mask_facts import all_real
from rnnkit.bptt.record import ForwardRecord
from rnnkit.bptt.windowed import WindowUnit, reorder, windowed_sweep
from rnnkit.cells.amp import computes_in_float32, float32, low_precision_to, without_autocast
from rnnkit.cells.kernel import Kernel, Weights, batched_gradients
from rnnkit.cells.normalization import normalize, normalize_backward
from rnnkit.errors import ConfigError
from rnnkit.layers.masking import flip_sequences
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.regularization import CellMasks, float32_masks, masked_loop
from rnnkit.types import LSTMState, State

__all__ = ["run_windowed_stack"]


class _Plan(NamedTuple):
    """What the node needs besides its differentiable inputs (all time-major)."""

    kernels: list[list[Kernel]]  # [layer][direction]
    reverse: list[list[bool]]
    num_states: int
    window: int
    mask: Tensor | None  # (T, B, 1) input order, None when every step is real
    reading: Tensor | None  # (T, B, 1) the mask in a reverse direction's reading order
    order: Tensor | None  # (T, B) input order ↔ reverse reading order (an involution)
    reset: Tensor | None  # (T, B, 1) state entering the step zeroed (forward only)
    drops: list[Tensor | None]  # [layer] dropout multiplier on the layer's input
    normed: list[bool]  # [unit] a layer-normalised cell (its input gain is a node input)


def _unit_count(plan: _Plan) -> int:
    return sum(len(layer) for layer in plan.kernels)


def _unit_inputs(
    plan: _Plan, tensors: tuple[Tensor | None, ...]
) -> tuple[list[Weights], list[tuple[Tensor, ...]], list[Tensor | None]]:
    """The node's inputs after ``x``, split per unit: its weights, initial states and
    input gain ``γ_x`` (None but for a layer-normalised cell)."""
    units, s = _unit_count(plan), plan.num_states
    weights, states0 = [], []
    for u in range(units):
        w_ih, w_hh, bias, bias_hn = tensors[4 * u : 4 * u + 4]
        # run_windowed_stack passes every weight but bias_hn, and every state, as a tensor.
        assert w_ih is not None and w_hh is not None and bias is not None
        weights.append(Weights(w_ih, w_hh, bias, bias_hn))
        states = tensors[4 * units + s * u : 4 * units + s * (u + 1)]
        states0.append(tuple(t for t in states if t is not None))
        assert len(states0[-1]) == s
    gains = list(tensors[(4 + s) * units :])
    assert len(gains) == units
    return weights, states0, gains


def _normed_input_grad(
    n: Tensor, inv: Tensor, gain: Tensor, weight_ih: Tensor
) -> Callable[[Tensor], Tensor]:
    """``WindowUnit.input_grad`` of a layer-normalised unit: ``g (k, B, G·H)`` of the input
    part at steps ``0 … k−1`` → ``∂L/∂x = ν'(g ⊙ γ_x) W_x`` there."""

    def back(g: Tensor) -> Tensor:
        k = g.shape[0]
        return normalize_backward(g * gain, n[:k], inv[:k]) @ weight_ih

    return back


class _WindowedStack(torch.autograd.Function):
    """Inputs: ``x (T, B, I)``, then per unit (layer by layer, directions in order) its four
    weights (``bias_hn`` may be None), then per unit its initial states. Outputs: the top
    outputs ``(T, B, D·H)`` and every unit's final states."""

    @staticmethod
    @without_autocast  # as the loop: the input parts' products in the weights' dtype too
    def forward(ctx: Any, plan: _Plan, x: Tensor, *tensors: Tensor | None) -> tuple[Tensor, ...]:
        weights, states0, gains = _unit_inputs(plan, tensors)
        records: list[ForwardRecord] = []
        normed: list[Tensor] = []  # per layer-normalised unit: its input, ν, the scale
        h = x
        u = 0
        for index, layer in enumerate(plan.kernels):
            drop = plan.drops[index]
            if drop is not None:
                h = h * drop
            if plan.mask is not None:  # padding may hold anything: it never enters a step
                h = torch.where(plan.mask, h, 0.0)
            outs = []
            for d, kernel in enumerate(layer):
                rev = plan.reverse[index][d]
                unit_in = reorder(h, plan.order) if rev else h
                gain = gains[u]
                if gain is not None:  # the loop reads the input part ν(x W_xᵀ) ⊙ γ_x
                    unit_in = low_precision_to(unit_in, gain.dtype)  # an autocast product
                    n, inv = normalize(unit_in @ weights[u].weight_ih.T)
                    normed += [unit_in, n, inv]
                    unit_in = n * gain
                rec = forward_pass(
                    kernel,
                    unit_in,
                    weights[u],
                    states0[u],
                    plan.reading if rev else plan.mask,
                    save=True,
                    reset=None if rev else plan.reset,
                )
                records.append(rec)
                out = rec.states[0][1:]
                outs.append(reorder(out, plan.order) if rev else out)
                u += 1
            h = torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]
        ctx.plan = plan
        saved: list[Tensor | None] = []
        for w, rec in zip(weights, records, strict=True):
            saved += [rec.x, w.weight_ih, w.weight_hh, w.bias_hn, *rec.states, *rec.cache]
        ctx.cache_sizes = [len(rec.cache) for rec in records]
        ctx.save_for_backward(*saved, *normed, *(g for g in gains if g is not None))
        finals = [f[-1].clone() for rec in records for f in rec.states]
        return (h, *finals)

    @staticmethod
    @without_autocast
    def backward(ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None):
        plan: _Plan = ctx.plan
        if torch.is_grad_enabled() or batched_gradients(d_out, *d_finals):
            # the lag sweep writes into buffers: no graph of it (full BPTT has one)
            raise ConfigError(
                f"window={plan.window} (truncated BPTT): its gradient cannot be differentiated "
                "again (create_graph=True) or taken for a batch of incoming gradients "
                "(is_grads_batched=True); use full BPTT"
            )
        s = plan.num_states
        saved = ctx.saved_tensors
        n_normed = sum(plan.normed)
        # after the units' records: (input, ν, scale) of each normalised unit, its gain
        normed_at = len(saved) - 4 * n_normed
        gain_at = len(saved) - n_normed
        norms: list[tuple[Tensor, ...] | None] = []
        units: list[list[WindowUnit]] = []
        finals: list[list[tuple[Tensor | None, ...]]] = []
        pos = u = 0
        for index, layer in enumerate(plan.kernels):
            units.append([])
            finals.append([])
            for d, kernel in enumerate(layer):
                n_cache = ctx.cache_sizes[u]
                x_flat, w_ih, w_hh, bias_hn = saved[pos : pos + 4]
                states = tuple(saved[pos + 4 : pos + 4 + s])
                cache = tuple(saved[pos + 4 + s : pos + 4 + s + n_cache])
                pos += 4 + s + n_cache
                back = None
                norms.append(None)
                if plan.normed[u]:
                    unit_in, n, inv = saved[normed_at : normed_at + 3]
                    gain = saved[gain_at]
                    normed_at, gain_at = normed_at + 3, gain_at + 1
                    norms[-1] = (unit_in, n, inv, gain, w_ih)
                    back = _normed_input_grad(n, inv, gain, w_ih)
                rev = plan.reverse[index][d]
                record = ForwardRecord(x_flat, states, cache, None if rev else plan.reset)
                units[-1].append(
                    WindowUnit(
                        kernel,
                        record,
                        # The backward reads the weights and bias_hn (a layer-normalised
                        # cell's gains: backward_reads_bias_hn), never the bias: not saved.
                        Weights(w_ih, w_hh, None, bias_hn),  # type: ignore[arg-type]
                        plan.reading if rev else plan.mask,
                        plan.order if rev else None,
                        back,
                    )
                )
                finals[-1].append(tuple(d_finals[s * u : s * (u + 1)]))
                u += 1
        sweeps = windowed_sweep(units, d_out, finals, plan.window, plan.drops)
        need = ctx.needs_input_grad
        n_units = u
        d_x = None
        d_weights: list[Tensor | None] = []
        d_states0: list[Tensor | None] = []
        d_gains: list[Tensor | None] = []
        u = 0
        for index, (layer_units, layer_sweeps) in enumerate(zip(units, sweeps, strict=True)):
            for unit, sweep in zip(layer_units, layer_sweeps, strict=True):
                flags = (index == 0 and need[1], *need[2 + 4 * u : 6 + 4 * u])
                norm = norms[u]
                if norm is not None:  # the input part's products are the node's own
                    flags = (False, False, *flags[2:])
                g = weight_grads(unit.kernel, unit.record, sweep, unit.weights, flags)
                gx, d_w_ih, d_gain = g.x, g.weight_ih, None
                if norm is not None:
                    unit_in, n, inv, gain, w_ih = norm
                    d_part = sweep.d_xp  # ∂L/∂(ν(x W_xᵀ) ⊙ γ_x), (T, B, G·H)
                    d_v = normalize_backward(d_part * gain, n, inv)
                    if index == 0 and need[1]:
                        gx = d_v @ w_ih
                    if need[2 + 4 * u]:
                        rows = d_v.reshape(-1, d_v.shape[-1])
                        d_w_ih = rows.T @ unit_in.reshape(rows.shape[0], -1)
                    if need[2 + (4 + s) * n_units + u]:
                        d_gain = (d_part * n).sum((0, 1))
                if gx is not None:
                    gx = reorder(gx, unit.order)
                    d_x = gx if d_x is None else d_x + gx
                d_weights += [d_w_ih, g.weight_hh, g.bias, g.bias_hn]
                for k, d0 in enumerate(sweep.d_states0):
                    d_states0.append(d0 if need[2 + 4 * n_units + s * u + k] else None)
                d_gains.append(d_gain)
                u += 1
        return (None, d_x, *d_weights, *d_states0, *d_gains)


def _reverse_order(mask: Tensor | None, T: int, B: int, like: Tensor) -> Tensor:
    """The ``(T, B)`` step index of a reverse direction (``flip_sequences`` of the steps)."""
    steps = torch.arange(T, device=like.device).view(T, 1).expand(T, B)
    return flip_sequences(steps, mask)[0]


def run_windowed_stack(
    layers: Sequence[Sequence[Recurrent]],
    x: Tensor,
    mask: Tensor | None,
    init: Sequence[Sequence[State]] | None,
    window: int,
    drops: Sequence[Tensor | None],
    reset: Tensor | None = None,
    cell_masks: Sequence[CellMasks] | None = None,
) -> tuple[Tensor, list[list[State]]]:
    """Run a stack with the windowed BPTT(τ) of the whole stack (module docstring).

    Args:
        layers: the directions of every layer, bottom first.
        x: ``(T, B, I)``.  mask: ``(T, B)`` bool or None.
        init: ``init[l][d]`` the initial state of each direction, or None for zeros.
        window: τ ≥ 1.
        drops: ``drops[l]`` the dropout multiplier ``(T, B, D·H)`` on the input of layer
            ``l`` (None where there is none; always for layer 0).
        reset: ``(T, B)`` bool, True where the state entering the step is zeroed (every
            layer; unidirectional stacks only), or None.
        cell_masks: per direction of every layer, bottom first, its regularizers' masks
            (``StackMasks.cells``), or None: weight_drop's ``M (G·H, H)`` on ``W_hh``
            (the node reads ``W_hh ⊙ M``; the gradient reaches ``W_hh`` through that
            product), recurrent dropout's and zoneout's in the step
            (``rnnkit.bptt.regularized``, forward and backward).

    Returns:
        ``(top outputs (T, B, D·H), final states [layer][direction])``.
    """
    T, B = x.shape[0], x.shape[1]
    cells = [[r.cell for r in layer] for layer in layers]
    is_lstm = cells[0][0].is_lstm
    has_reverse = any(r.reverse for layer in layers for r in layer)
    order = _reverse_order(mask, T, B, x) if has_reverse else None
    mask3 = reading = None
    # (asked of the mask's host copy: a task's batch mask is read without a wait)
    if mask is not None and not all_real(mask):
        mask3 = mask.unsqueeze(-1)
        if has_reverse:
            reading = flip_sequences(mask, mask)[1].unsqueeze(-1)
    if reset is not None and has_reverse:
        raise ValueError("resets need a unidirectional stack")
    tensors: list[Tensor | None] = []
    # a layer-normalised cell (its class has input_part): the node computes the input part
    normed = [getattr(type(c), "input_part", None) is not None for layer in cells for c in layer]
    units = [c for layer in cells for c in layer]
    masks: list[CellMasks | None] = [None] * len(units)
    if cell_masks is not None:
        masks = list(cell_masks)
    if len(masks) != len(units):
        raise ValueError(f"cell_masks needs one entry per direction ({len(units)})")
    # float16/bfloat16 weights on the CPU: the whole stack in float32, rounded once
    low = x.dtype if computes_in_float32(cells[0][0].weight_hh) else None
    if low is not None:  # (and W_hh ⊙ M in float32, as one layer's loop takes it)
        masks = [float32_masks(m) for m in masks]
    flat_kernels: list[Kernel] = []
    for c, norm, m in zip(units, normed, masks, strict=True):
        kernel, w = masked_loop(c.kernel, c.weights(), m)
        flat_kernels.append(kernel)
        # its weights() hold weight_ih detached (its loop reads the input part): the real one
        tensors += [c.weight_ih if norm else w.weight_ih, *w[1:]]
    for index, layer in enumerate(cells):
        for d, c in enumerate(layer):
            state = c.zero_state(B, x) if init is None else init[index][d]
            tensors += list(state) if isinstance(state, LSTMState) else [state]
    tensors += [
        c.get_parameter("gamma_ih") if norm else None for c, norm in zip(units, normed, strict=True)
    ]
    if low is not None:
        x = x.float()
        tensors = [float32(t) for t in tensors]
        drops = [float32(d) for d in drops]
    unit_kernels = iter(flat_kernels)
    kernels = [[next(unit_kernels) for _ in layer] for layer in cells]
    plan = _Plan(
        kernels=kernels,
        reverse=[[r.reverse for r in layer] for layer in layers],
        num_states=2 if is_lstm else 1,
        window=window,
        mask=mask3,
        reading=reading,
        order=order,
        reset=None if reset is None else reset.unsqueeze(-1),
        drops=list(drops),
        normed=normed,
    )
    result = _WindowedStack.apply(plan, x, *tensors)
    outputs, flat = result[0], result[1:]
    if low is not None:
        outputs, flat = outputs.to(low), tuple(f.to(low) for f in flat)
    s = plan.num_states
    finals: list[list[State]] = []
    u = 0
    for layer in cells:
        finals.append([])
        for _ in layer:
            parts = flat[s * u : s * (u + 1)]
            finals[-1].append(LSTMState(*parts) if is_lstm else parts[0])
            u += 1
    return outputs, finals
