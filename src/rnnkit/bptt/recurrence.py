"""The one time loop of the library as an autograd node: forward over T steps with
masking, and the explicit BPTT backward.

:func:`run_recurrence` runs one direction of one layer: its forward is
``rnnkit.bptt.forward.forward_pass`` (one input product, then the steps), its backward
``rnnkit.bptt.backward.backward_sweep`` (full BPTT, or the exact windowed BPTT(τ) of
``rnnkit.bptt.windowed``) and ``weight_grads`` (every weight gradient as one product over
all steps), on the records of ``rnnkit.bptt.record``. Where PyTorch's fused kernels
(cuDNN on a GPU) compute the same function, they run the layer instead
(``rnnkit.bptt.fused``: CUDA tensors by default); where they do not, on a GPU, the
Triton steps (``rnnkit.bptt.gpu_steps``); with a window, there, the Triton steps run the
forward and the explicit windowed BPTT(τ) the backward. With the compiled loop, rows are
sorted by their last real step and packed, so finished rows cost nothing. Under graph
tracing (``torch.compile``, ``torch.export``) the loop is the kernel's differentiable
step, unrolled, and autograd gives the gradients (the explicit BPTT equals them: tested).
A gradient that is differentiated again (``create_graph=True``) is autograd's through
those unrolled steps, run again in the backward (``rnnkit.bptt.unrolled``).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from rnnkit.bptt.backward import backward_sweep, weight_grads
from rnnkit.bptt.dispatch import (
    FUSED,
    GRAPH_FUSED,
    GRAPH_OP,
    GRAPH_STEPS,
    STEPS,
    compiled_library,
    route,
)
from rnnkit.bptt.forward import _like_weights, forward_pass
from rnnkit.bptt.fused import run_fused
from rnnkit.bptt.gpu_route import steps_record, wants_steps
from rnnkit.bptt.gpu_steps import run_steps
from rnnkit.bptt.mask_facts import all_real
from rnnkit.bptt.opaque import run_opaque
from rnnkit.bptt.record import ForwardRecord, Packing, make_packing, unpack_record
from rnnkit.bptt.tracing import TracingError, check_tracer, tracing, transforming
from rnnkit.bptt.unrolled import differentiable_gradients, unrolled
from rnnkit.cells.kernel import Kernel, Weights, batched_gradients
from rnnkit.errors import ConfigError

__all__ = [
    "clean_padding",
    "recurrence_gradients",
    "run_recurrence",
    "takes_projected",
    "takes_resets",
]


def _base(t: Tensor) -> Tensor:
    """The tensor whose storage ``t`` views (``t`` itself where it is no view)."""
    return t if t._base is None else t._base


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
        projected: bool,
        x: Tensor,
        weight_ih: Tensor,
        weight_hh: Tensor,
        bias: Tensor,
        bias_hn: Tensor | None,
        *states0: Tensor,
    ) -> tuple[Tensor, ...]:
        w = Weights(weight_ih, weight_hh, bias, bias_hn)
        record = forward_pass(
            kernel, x, w, states0, mask, save, packing, projected=projected, in_place=True
        )
        if save:
            ctx.kernel, ctx.mask, ctx.window, ctx.packing = kernel, mask, window, packing
            ctx.projected = projected
            ctx.num_states = len(record.states)
            # a kernel whose step backward reads bias_hn (a layer-normalised cell's gains)
            ctx.keeps_hn = bool(getattr(kernel, "backward_reads_bias_hn", False))
            kept = (bias_hn,) if ctx.keeps_hn else ()
            # x's (T·B, I) view is made again in backward: a view saved from here (no grad
            # mode) turned a later in-place change of x into torch's note on no-grad views
            # instead of its "modified by an inplace operation"
            ctx.flat_view = record.x is not x and record.x._base is _base(x)
            first = x if ctx.flat_view else record.x
            main = (first, weight_ih, weight_hh, *record.states, *record.cache, *kept)
            # the node's own inputs too: a differentiated gradient runs the forward again
            # (never for a projected input, which the record lets go: it refuses it)
            ctx.num_main, ctx.has_hn = len(main), bias_hn is not None
            hn = (bias_hn,) if bias_hn is not None else ()
            again = () if projected else (x, bias, *hn, *states0)
            ctx.save_for_backward(*main, *again)
        finals = tuple(s[-1].clone() for s in record.states)
        outputs = record.states[0][1:] if record.outputs is None else record.outputs
        return (outputs, *finals)  # outputs (T, B, H), final states (B, H)

    @staticmethod
    def backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        # create_graph=True (the gradient is differentiated), or a batch of incoming
        # gradients under vmap (is_grads_batched=True), which the explicit BPTT's
        # compiled operators have no rule for: autograd through the plain steps
        if torch.is_grad_enabled() or batched_gradients(d_out, *d_finals):
            return _Recurrence._differentiable_backward(ctx, d_out, *d_finals)
        return _Recurrence._explicit_backward(ctx, d_out, *d_finals)

    @staticmethod
    def _differentiable_backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """The gradients with a graph: the forward run again in differentiable steps
        from the node's inputs (``rnnkit.bptt.unrolled``), differentiated by autograd."""
        if ctx.window is not None:
            raise ConfigError(
                f"window={ctx.window} (truncated BPTT): its gradient cannot be "
                "differentiated again (create_graph=True); use full BPTT"
            )
        if ctx.projected:
            raise ConfigError(
                "a projected input's gradient cannot be differentiated again "
                "(create_graph=True): call the layer on the embedded input"
            )
        saved = ctx.saved_tensors
        w_ih, w_hh = saved[1], saved[2]
        x, bias, *rest = saved[ctx.num_main :]
        bias_hn = rest.pop(0) if ctx.has_hn else None
        got = differentiable_gradients(
            ctx.kernel,
            x,
            Weights(w_ih, w_hh, bias, bias_hn),
            tuple(rest),
            ctx.mask,
            (d_out, *d_finals),
            ctx.needs_input_grad[6:],
        )
        return (None, None, None, None, None, None, *got)

    @staticmethod
    @once_differentiable
    def _explicit_backward(
        ctx: Any, d_out: Tensor | None, *d_finals: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        """The library's explicit BPTT (no graph of its own)."""
        saved = ctx.saved_tensors[: ctx.num_main]
        n = ctx.num_states
        bias_hn = saved[-1] if ctx.keeps_hn else None
        saved = saved[:-1] if ctx.keeps_hn else saved
        x = saved[0].reshape(-1, saved[0].shape[-1]) if ctx.flat_view else saved[0]
        record = ForwardRecord(x, tuple(saved[3 : 3 + n]), tuple(saved[3 + n :]))
        # The backward reads no bias: None stands in for it.
        w = Weights(saved[1], saved[2], None, bias_hn)  # type: ignore[arg-type]
        packing = ctx.packing
        if packing is not None and ctx.window is not None:
            # BPTT(τ) is the PyTorch sweep, which reads padded buffers. (The forward still
            # ran packed: truncation changes gradients only, never values, to the bit.)
            record, packing = unpack_record(record, packing), None
        # needs_input_grad: kernel, mask, window, save, packing, projected, x, w_ih, w_hh,
        # bias, bias_hn, s0...
        need = ctx.needs_input_grad[6:11]
        sweep = backward_sweep(
            ctx.kernel, record, w, ctx.mask, d_out, d_finals, ctx.window, packing, need[0]
        )
        g = weight_grads(ctx.kernel, record, sweep, w, need, packing, ctx.projected)
        d_s0 = tuple(
            d if ctx.needs_input_grad[11 + k] else None for k, d in enumerate(sweep.d_states0)
        )
        return (None, None, None, None, None, None, *g, *d_s0)


def takes_projected(
    kernel: Kernel, x: Tensor, weights: Weights, states0: tuple[Tensor, ...] = ()
) -> bool:
    """Whether :func:`run_recurrence` can take ``x`` as the input product itself
    (``projected=True``): where the compiled loop runs for these tensors, for a kernel
    that reads ``x W_ihᵀ`` (a layer-normalised cell reads its normalised input part)."""
    if getattr(kernel, "reads_projected", False):
        return False
    return compiled_library(kernel, x, *weights, *states0) is not None


def takes_resets(
    kernel: Kernel, x: Tensor, weights: Weights, mask: Tensor | None, window: int | None
) -> bool:
    """Whether :func:`run_recurrence` takes ``reset`` for this layer: where its route is
    the Triton steps (``rnnkit.bptt.gpu_steps``), which zero the state inside one call;
    never with a ``window`` (the layers run a window with resets in their windowed node,
    ``rnnkit.layers.windowed``). Elsewhere a caller runs the pieces between resets.
    ``x (T, B, ·)``, ``mask (T, B)``."""
    if tracing():
        return False
    like = x[:0].to(weights.weight_hh.dtype)  # the route reads the device and the dtype
    # No Triton steps possible (the CPU by default): say so before reading the mask,
    # which the full route below would reduce for every layer of every call
    if not wants_steps(kernel, like, window, False):
        return False
    mask3 = None if mask is None or all_real(mask) else mask.unsqueeze(-1)
    return route(kernel, like, weights, (), mask, mask3, window, False).path == STEPS


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
    return x, None if all_real(mask) else mask3  # read once per mask (mask_facts)


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
        if transforming():
            raise TracingError(
                f"window={window} (truncated BPTT) cannot run under a torch.func transform "
                "or forward-mode AD, whose derivatives are full BPTT: use window=None there"
            )
        raise TracingError(
            f"window={window} (truncated BPTT) cannot be traced by torch.compile/export: "
            "train it eagerly (the traced graph's gradients are full BPTT)"
        )
    x, states0 = _like_weights(weights, x, states0)
    x, mask3 = clean_padding(x, mask)
    return unrolled(kernel, x, weights, states0, mask3)


def run_recurrence(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None = None,
    window: int | None = None,
    projected: bool = False,
    reset: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run one direction of one layer over time with the explicit BPTT backward.

    Args:
        kernel: the cell's step math (``cell.kernel``).
        x: ``(T, B, I)`` time-major input.
        weights: the cell's parameters (``cell.weights()``).
        states0: initial state tensors, each ``(B, H)`` (``(h,)`` or ``(h, c)``).
        mask: ``(T, B)`` bool, True at real steps, or None (all real).
        window: None for full BPTT, or τ ≥ 1 for the exact windowed BPTT(τ).
        projected: ``x (T, B, G·H)`` is the input product ``x W_ihᵀ`` (no bias) the caller
            computed; ``weight_ih`` then gets no gradient from this node. The compiled
            loop only (:func:`takes_projected`), full BPTT.
        reset: ``(T, B)`` bool, True where the state entering step t is zero (a new
            document; no gradient crosses it), or None. Only where :func:`takes_resets`
            says so (the Triton steps, full BPTT). A window with resets is the layers'
            windowed node (``rnnkit.layers.windowed``): a layer's call
            ``layer(x, window=τ, resets=r)`` runs it, a single layer included.

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
    if projected and (window is not None or not takes_projected(kernel, x, weights, states0)):
        raise ValueError(
            "a projected input needs the compiled loop, no tracing and full BPTT "
            "(check takes_projected first)"
        )
    # Under autocast the input (or a state) may come from a float16/bfloat16 product; the
    # recurrence runs in the weights' dtype (module docstring). Cast here, outside the
    # autograd node, so the cast is differentiable and the compiled loop is chosen below.
    x, states0 = _like_weights(weights, x, states0)
    mask3 = None
    if not tracing():
        x, mask3 = clean_padding(x, mask)
    way = route(kernel, x, weights, states0, mask, mask3, window, projected)  # dispatch.py
    if reset is not None and way.path != STEPS:
        raise ValueError(
            "resets inside one call run on the Triton steps only (check takes_resets first; "
            "elsewhere run the pieces between them)"
        )
    if way.path == GRAPH_FUSED:
        return run_fused(kernel, way.form, x, weights, states0, None)
    if way.path == GRAPH_OP:
        opaque = run_opaque(kernel, x, weights, states0, mask, window)
        assert opaque is not None  # route chose it for a kernel the operator knows
        return opaque
    if way.path == GRAPH_STEPS:  # the graph's own steps (a window with gradients: refused)
        return _traced_recurrence(kernel, x, weights, states0, mask, window)
    if way.path == FUSED:  # PyTorch's fused kernel (cuDNN) computes this function
        return run_fused(kernel, way.form, x, weights, states0, way.lengths)
    if way.path == STEPS:  # one product and one Triton launch per step (gpu_steps.py)
        return run_steps(kernel, x, weights, states0, mask3, reset)
    x, mask3, states0, order, packing = _sorted_rows(kernel, x, weights, states0, mask, mask3)
    tensors = (x, *weights, *states0)
    save = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
    result = _Recurrence.apply(
        kernel,
        mask3,
        window,
        save,
        packing,
        projected,
        x,
        weights.weight_ih,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        *states0,
    )
    outputs, finals = result[0], tuple(result[1:])
    if order is not None:
        inverse = _inverse(order)
        outputs = outputs.index_select(1, inverse)
        finals = tuple(f.index_select(0, inverse) for f in finals)
    return outputs, finals


def _sorted_rows(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    mask3: Tensor | None,
) -> tuple[Tensor, Tensor | None, tuple[Tensor, ...], Tensor | None, Packing | None]:
    """Rows sorted by their last real step and the steps' buffers packed, where the
    compiled loop runs a mask: ``(x, mask3, states0, order or None, packing or None)``."""
    if mask is None or mask3 is None or compiled_library(kernel, x, *weights, *states0) is None:
        return x, mask3, states0, None, None
    if steps_record(kernel, x):  # forced Triton steps on the CPU: forward_pass runs them
        return x, mask3, states0, None, None
    if getattr(kernel, "unsorted", False):  # per-row masks inside (rnnkit.bptt.regularized)
        return x, mask3, states0, None, None
    # The compiled loop stops computing rows after their last real step when rows are
    # sorted by it (as packed sequences are): sort here, undo the order on the way out,
    # and pack the steps' buffers so that the products skip the finished rows too.
    order = None
    steps = torch.arange(1, x.shape[0] + 1, device=x.device)
    last = torch.where(mask, steps[:, None], 0).amax(0)  # (B,) last real step + 1
    if bool((last[1:] > last[:-1]).any()):
        order = torch.argsort(last, descending=True, stable=True)
        x = x.index_select(1, order)
        mask3 = mask3.index_select(1, order)
        states0 = tuple(s.index_select(0, order) for s in states0)
    return x, mask3, states0, order, make_packing(mask3[..., 0])


def _inverse(order: Tensor) -> Tensor:
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


class _PlainContext:
    """What :class:`_Recurrence` reads and writes of an autograd context, outside autograd."""

    def __init__(self, needs_input_grad: tuple[bool, ...]) -> None:
        self.needs_input_grad = needs_input_grad
        self.saved_tensors: tuple[Tensor, ...] = ()

    def save_for_backward(self, *tensors: Tensor) -> None:
        self.saved_tensors = tensors


def recurrence_gradients(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    window: int | None,
    d_outputs: Tensor,
    d_finals: tuple[Tensor, ...],
) -> tuple[Tensor | None, ...]:
    """The explicit BPTT's gradients of ``(x, weight_ih, weight_hh, bias, bias_hn,
    *states0)`` for the gradients of :func:`run_recurrence`'s outputs and final states,
    computed without autograd (the backward of ``rnnkit::recurrence``, where autograd
    does not record). ``x`` in the weights' dtype; ``bias_hn``'s entry is None without
    one."""
    x, mask3 = clean_padding(x, mask)
    x, mask3, states0, order, packing = _sorted_rows(kernel, x, weights, states0, mask, mask3)
    if order is not None:
        d_outputs = d_outputs.index_select(1, order)
        d_finals = tuple(d.index_select(0, order) for d in d_finals)
    needs = (False,) * 6 + (True,) * 4 + (weights.bias_hn is not None,) + (True,) * len(states0)
    ctx = _PlainContext(needs)
    _Recurrence.forward(ctx, kernel, mask3, window, True, packing, False, x, *weights, *states0)
    grads = _Recurrence._explicit_backward(ctx, d_outputs, *d_finals)[6:]
    # all are asked for (needs) but bias_hn's: only d_rest may hold a None
    d_x, d_rest = cast(Tensor, grads[0]), list(grads[1:5])
    d_s0 = cast("list[Tensor]", list(grads[5:]))
    if order is not None:
        inverse = _inverse(order)
        d_x = d_x.index_select(1, inverse)
        d_s0 = [d.index_select(0, inverse) for d in d_s0]
    if mask3 is not None:  # the padding was replaced by zeros: no gradient reaches it
        d_x = torch.where(mask3 if order is None else mask3.index_select(1, inverse), d_x, 0.0)
    return (d_x, *d_rest, *d_s0)
