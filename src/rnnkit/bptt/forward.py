"""The forward pass of the time loop over T steps, with masking.

This module holds the library's only ``for t in range(T)`` of the forward:

* all input projections in ONE matrix product before the loop: ``xp = x W_ihᵀ + b``
  (the compiled loop of a narrow LSTM, ``I + H ≤ 512`` and 4 rows a thread, multiplies
  each step's inputs itself instead: thin products at that width run faster in the loop,
  beside the recurrent one, than one (T·B, 4H) product and its round trip through
  memory);
* per step only the recurrent product and the gate math (the cell kernel's
  ``step_into``), written into preallocated time-major buffers;
* at a masked step the state is held: ``h_t = h_{t-1}`` (``c`` too), by selection —
  padding may hold NaN or huge values and never leaks (it is replaced by 0 up front).

The compiled loop (``rnnkit.bptt.native``) runs the same steps where it supports the
kernel and the tensors. On a GPU the Triton steps run the forward of a plain LSTM, GRU or
simple cell (``rnnkit.bptt.gpu_steps.forward_record``: one product and one launch per
step) and return the same record, so that every reader of it (the windowed BPTT(τ), the
segments' recompute) runs unchanged. Under ``torch.autocast`` (mixed precision) the loop
runs with autocast off, in its weights' dtype: a float16/bfloat16 input or initial state
is cast up first (``rnnkit.cells.amp`` says why).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.gpu_route import steps_record
from rnnkit.bptt.gpu_steps import forward_record
from rnnkit.bptt.record import ForwardRecord, Packing
from rnnkit.cells.amp import without_autocast
from rnnkit.cells.kernel import Kernel, Weights

__all__ = ["forward_pass"]


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
    projected: bool = False,
    in_place: bool = False,
) -> ForwardRecord:
    """Input projections in one product (or, for a narrow LSTM, in the compiled loop
    step by step), then the step loop. ``x (T, B, I)``,
    ``mask (T, B, 1)`` bool or None; ``packing`` (compiled loop only) skips the rows
    that have finished (see ``Packing``); ``reset (T, B, 1)`` bool or None zeroes the
    state entering a step (the PyTorch loop: the compiled one has no resets). Under
    autocast it computes in the weights' dtype (module docstring).

    ``projected`` (compiled loop only): ``x (T, B, G·H)`` is the input product
    ``x W_ihᵀ`` itself, without the bias, computed by the caller (a language model reads
    it from a table of the vocabulary's rows); the record then keeps no input.

    ``in_place``: where the compiled loop reads ``x`` as it lies (``native_reads_rows``:
    a batch-first input, transposed, needs no copy), the record keeps ``x (T, B, I)``
    itself rather than ``(T·B, I)`` rows, and the outputs may come in the input's layout
    (``ForwardRecord.outputs``).

    Where :func:`rnnkit.bptt.gpu_route.steps_record` says so (CUDA tensors with triton by
    default, ``RNNKIT_GPU_PATH=triton`` on any device), the Triton steps run the forward,
    masks and resets included, and the record is the PyTorch loop's."""
    x, states0 = _like_weights(w, x, states0)
    if packing is None and not projected and steps_record(kernel, x):
        return forward_record(kernel, x, w, states0, mask, reset, save)  # Triton steps
    T, B, I = x.shape
    lib = compiled_library(kernel, x, *w, *states0) if reset is None else None
    in_place = in_place and lib is not None and packing is None and not projected
    in_place = in_place and kernel.native_reads_rows(x, w)
    # (T·B, I): a view where x is contiguous, else a copy — not made where read in place
    x_flat = x if in_place else x.reshape(T * B, I)
    if lib is None and (packing is not None or projected):
        raise RuntimeError(
            "a Packing or a projected input needs the compiled loop (rnnkit.bptt.native)"
        )
    if lib is not None:
        offsets = None
        if packing is not None:
            x_flat, offsets = x_flat.index_select(0, packing.rows), packing.offsets
        states, cache, outputs = kernel.native_forward(
            lib, x_flat, w, T, B, states0, _mask2(mask), save, offsets, projected
        )
        # A projected input is not needed again (no ∂L/∂W_ih here): keep no reference.
        kept = x_flat.new_empty(0, I) if projected else x_flat
        return ForwardRecord(kept, states, cache, None, outputs)
    xps = kernel.project_inputs(x_flat, w, T, B)  # (T, B, ·) buffers
    states, cache = _forward_loop(kernel, xps, mask, states0, kernel.prepare(w), save, reset)
    return ForwardRecord(x_flat, states, cache, reset)
