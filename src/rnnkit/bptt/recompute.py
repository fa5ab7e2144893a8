"""Recompute instead of store: the time loop in segments, for very long sequences.

The default backward (``recurrence.py``) keeps every step's state and gate cache and, during
the sweep, the gate gradients of all steps: memory grows as ``T·B·(G + n)·H``
(G gates, n state tensors). With ``segment=k`` only the input and the states at the
start of each segment are kept (``⌈T/k⌉·B·n·H``); the backward walks the segments from
the last to the first, re-runs each segment's forward WITH its cache, sweeps it, and adds
its weight gradients (one matrix product per segment) before moving on:

    memory  ≈ T·B·(I + H)  +  ⌈T/k⌉·B·n·H  +  k·B·(2G + n)·H
    time    ≈ one extra forward pass (about a third more than the default training step)

``k ≈ √T`` minimises the two last terms (Chen et al. 2016, "Training deep nets with
sublinear memory cost"; Gruslys et al. 2016 for RNNs). The result is the same function
and the same gradients as the default path — only the order of the additions in the
weight gradients differs (float64: ~1e-15).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.recurrence import clean_padding, run_recurrence
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.bptt.unrolled import differentiable_gradients
from rnnkit.cells.kernel import Kernel, Weights, batched_gradients

__all__ = ["run_recomputed"]


def _segments(T: int, k: int) -> list[tuple[int, int]]:
    return [(t0, min(T, t0 + k)) for t0 in range(0, T, k)]


def _segment_kernel(kernel: Kernel, t0: int, t1: int) -> Kernel:
    """The kernel of steps ``t0 … t1 − 1``: zoneout's keep factors of those steps."""
    if isinstance(kernel, RegularizedKernel):
        return kernel.for_steps(t0, t1)  # type: ignore[return-value]  # a step kernel
    return kernel


class _Segmented(torch.autograd.Function):
    """Autograd node: forward in segments storing only their initial states; the
    backward recomputes each segment (reverse order) and runs the explicit BPTT on it."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Kernel,
        mask: Tensor | None,
        segment: int,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        T, B = x.shape[0], x.shape[1]
        H = states0[0].shape[1]
        outputs = x.new_empty(T, B, H)
        starts: list[Tensor] = []  # the states entering each segment, flattened
        states = states0
        for t0, t1 in _segments(T, segment):
            starts.extend(states)
            seg_mask = None if mask is None else mask[t0:t1]
            seg_kernel = _segment_kernel(kernel, t0, t1)
            record = forward_pass(seg_kernel, x[t0:t1], w, states, seg_mask, save=False)
            outputs[t0:t1] = record.states[0][1:]
            states = tuple(s[-1].clone() for s in record.states)
        ctx.kernel, ctx.mask, ctx.segment, ctx.n = kernel, mask, segment, len(states0)
        ctx.save_for_backward(x, weight_ih, weight_hh, bias, bias_hn, *starts)
        finals = tuple(s.clone() for s in states)
        return (outputs, *finals)

    @staticmethod
    def backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled() or batched_gradients(d_out, *d_finals):
            # create_graph=True or a batch of incoming gradients under vmap: as the
            # default path (recurrence.py), the forward run again in differentiable steps
            # from the node's inputs (all of it at once: no memory is saved then)
            x, w_ih, w_hh, bias, bias_hn, *starts = ctx.saved_tensors
            got = differentiable_gradients(
                ctx.kernel,
                x,
                Weights(w_ih, w_hh, bias, bias_hn),
                tuple(starts[: ctx.n]),
                ctx.mask,
                (d_out, *d_finals),
                ctx.needs_input_grad[3:],
            )
            return (None, None, None, *got)
        return _Segmented.explicit_backward(ctx, d_out, *d_finals)

    @staticmethod
    @once_differentiable
    def explicit_backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """Segment by segment from the last: recomputed, then swept (module docstring)."""
        x, w_ih, w_hh, bias, bias_hn, *starts = ctx.saved_tensors
        w = Weights(w_ih, w_hh, bias, bias_hn)
        kernel, mask, n = ctx.kernel, ctx.mask, ctx.n
        T, B = x.shape[0], x.shape[1]
        H = w_hh.shape[1]
        # needs_input_grad: kernel, mask, segment, x, w_ih, w_hh, bias, bias_hn, s0...
        need = ctx.needs_input_grad[3:8]
        d_x = x.new_zeros(x.shape) if need[0] else None
        totals: list[Tensor | None] = [None, None, None, None]
        d_state = tuple(x.new_zeros(B, H) if d is None else d for d in d_finals)
        segments = _segments(T, ctx.segment)
        for index in range(len(segments) - 1, -1, -1):
            t0, t1 = segments[index]
            seg_mask = None if mask is None else mask[t0:t1]
            s0 = tuple(starts[index * n : (index + 1) * n])
            seg_kernel = _segment_kernel(kernel, t0, t1)
            record = forward_pass(seg_kernel, x[t0:t1], w, s0, seg_mask, save=True)
            seg_out = None if d_out is None else d_out[t0:t1]
            sweep = backward_sweep(
                seg_kernel, record, w, seg_mask, seg_out, d_state, need_x=need[0]
            )
            g = weight_grads(seg_kernel, record, sweep, w, need)
            if d_x is not None and g.x is not None:
                d_x[t0:t1] = g.x
            for k, part in enumerate(g[1:]):
                if part is not None:
                    total = totals[k]
                    totals[k] = part if total is None else total + part
            d_state = sweep.d_states0
        d_s0 = tuple(d if ctx.needs_input_grad[8 + k] else None for k, d in enumerate(d_state))
        return (None, None, None, d_x, *totals, *d_s0)


def run_recomputed(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    segment: int,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``run_recurrence`` that stores only every ``segment``-th state for the backward.

    Same arguments and results as ``recurrence.run_recurrence`` (``x (T, B, I)``,
    ``mask (T, B)``); ``segment`` ≥ 1 is the number of steps recomputed at a time.

    >>> from rnnkit.cells.lstm import LSTMCell
    >>> cell = LSTMCell(2, 3)
    >>> out, (h, c) = run_recomputed(cell.kernel, torch.ones(7, 1, 2), cell.weights(),
    ...                              (torch.zeros(1, 3), torch.zeros(1, 3)), None, 3)
    >>> out.shape
    torch.Size([7, 1, 3])
    """
    if isinstance(segment, bool) or not isinstance(segment, int) or segment < 1:
        raise ValueError(f"recompute must be a positive integer (steps a segment), got {segment!r}")
    tensors = (x, *weights, *states0)
    if not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors):
        return run_recurrence(kernel, x, weights, states0, mask)  # nothing stored anyway
    x, mask3 = clean_padding(x, mask)
    result = _Segmented.apply(
        kernel,
        mask3,
        segment,
        x,
        weights.weight_ih,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        *states0,
    )
    return result[0], tuple(result[1:])
