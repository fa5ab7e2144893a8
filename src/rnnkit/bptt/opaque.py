"""The time loop as ONE operator of a compiled graph: ``rnnkit::recurrence``.

``torch.compile`` would otherwise trace the loop over time step by step (a graph of T
unrolled steps: slow to compile, recompiled for every new length). Registered with
``torch.library.custom_op``, the whole recurrence of one direction of one layer is a
single opaque node: the compiler sees its inputs and the shapes of its outputs (a fake
implementation), and at run time the node runs the library's own time loop (the compiled
C++ loop on the CPU), masks, windows and all.

Gradients: ``rnnkit::recurrence_backward``, registered as the node's autograd formula,
runs the forward again and then the library's explicit BPTT (nothing is saved between
the two but the inputs, so a compiled training step computes the forward twice). The
operators live in the ``rnnkit`` namespace of ``torch.ops`` and change nothing else.

Exports (``torch.export``, ONNX) do not use them: an exported graph must hold standard
operators, so it holds PyTorch's fused operator or the unrolled steps
(``rnnkit.bptt.recurrence``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rnnkit.cells.gru import GRUKernel
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel

__all__ = ["kernel_from_name", "kernel_name", "run_opaque"]


def kernel_name(kernel: Kernel) -> str | None:
    """The operator's name of a kernel (``"lstm"``, ``"gru:keep:after"``, ``"rnn:tanh"``),
    or None for a kind it does not know.

    >>> kernel_name(GRUKernel("keep", "after")), kernel_name(RNNKernel("relu"))
    ('gru:keep:after', 'rnn:relu')
    """
    if isinstance(kernel, LSTMKernel):
        return "lstm"
    if isinstance(kernel, GRUKernel):
        return f"gru:{kernel.update}:{kernel.reset}"
    if isinstance(kernel, RNNKernel):
        return f"rnn:{kernel.nonlinearity}"
    return None


def kernel_from_name(name: str) -> Kernel:
    """The kernel :func:`kernel_name` names.

    >>> k = kernel_from_name("gru:candidate:before")
    >>> type(k).__name__, k.update, k.reset
    ('GRUKernel', 'candidate', 'before')
    """
    kind, *options = name.split(":")
    if kind == "lstm":
        return LSTMKernel()
    if kind == "gru":
        return GRUKernel(update=options[0], reset=options[1])
    return RNNKernel(nonlinearity=options[0])


def _eager(
    kind: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    states0: list[Tensor],
    mask: Tensor | None,
    window: int,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    from rnnkit.bptt.recurrence import run_recurrence  # the loop this module wraps

    weights = Weights(w_ih, w_hh, bias, bias_hn)
    return run_recurrence(
        kernel_from_name(kind), x, weights, tuple(states0), mask, None if window < 0 else window
    )


@torch.library.custom_op("rnnkit::recurrence", mutates_args=())
def _recurrence(
    kind: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    states0: list[Tensor],
    mask: Tensor | None,
    window: int,
) -> list[Tensor]:
    """``[outputs (T, B, H), *final states (B, H)]`` of one direction of one layer."""
    outputs, finals = _eager(kind, x, w_ih, w_hh, bias, bias_hn, states0, mask, window)
    # An operator's outputs never alias its inputs (a final state may be its initial one),
    # and are contiguous, as the fake kernel says: the LSTM loop of a batch without padding
    # writes batch-first and returns a transposed view, whose strides failed compiled
    # code's stride check on every such batch.
    same = torch.contiguous_format
    return [outputs.clone(memory_format=same), *(f.clone(memory_format=same) for f in finals)]


@_recurrence.register_fake
def _(
    kind: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    states0: list[Tensor],
    mask: Tensor | None,
    window: int,
) -> list[Tensor]:
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    return [w_hh.new_empty(T, B, H), *(s.new_empty(s.shape) for s in states0)]


@torch.library.custom_op("rnnkit::recurrence_backward", mutates_args=())
def _recurrence_backward(
    kind: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    states0: list[Tensor],
    mask: Tensor | None,
    window: int,
    grads: list[Tensor],
) -> list[Tensor]:
    """The gradients of ``x, w_ih, w_hh, bias, bias_hn (an empty tensor if None),
    *states0`` by the explicit BPTT (its forward run again: autograd does not record
    inside an operator, so the library's backward is called directly)."""
    from rnnkit.bptt.recurrence import recurrence_gradients

    got = recurrence_gradients(
        kernel_from_name(kind),
        x,
        Weights(w_ih, w_hh, bias, bias_hn),
        tuple(states0),
        mask,
        None if window < 0 else window,
        grads[0],
        tuple(grads[1:]),
    )
    like = (x, w_ih, w_hh, bias, x.new_empty(0) if bias_hn is None else bias_hn, *states0)
    # contiguous, as the fake kernel says (a batch-first x is a transposed view: a
    # gradient with its strides failed compiled code's stride check)
    return [
        t.new_zeros(t.shape) if g is None else g.contiguous()
        for g, t in zip(got, like, strict=True)
    ]


@_recurrence_backward.register_fake
def _(
    kind: str,
    x: Tensor,
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    bias_hn: Tensor | None,
    states0: list[Tensor],
    mask: Tensor | None,
    window: int,
    grads: list[Tensor],
) -> list[Tensor]:
    hn = x.new_empty(0) if bias_hn is None else bias_hn.new_empty(bias_hn.shape)
    rest = [t.new_empty(t.shape) for t in (x, w_ih, w_hh, bias)]  # contiguous, as the op's
    return [*rest, hn, *(s.new_empty(s.shape) for s in states0)]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    kind, x, w_ih, w_hh, bias, bias_hn, states0, mask, window = inputs
    ctx.kind, ctx.window, ctx.has_hn, ctx.num_states = (
        kind,
        window,
        bias_hn is not None,
        len(states0),
    )
    ctx.save_for_backward(x, w_ih, w_hh, bias, bias_hn, mask, *states0)


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple[Any, ...]:
    x, w_ih, w_hh, bias, bias_hn, mask, *states0 = ctx.saved_tensors
    T, B, H = x.shape[0], x.shape[1], w_hh.shape[1]
    shapes = [(T, B, H), *[(B, H)] * ctx.num_states]  # the outputs'
    full = [
        w_hh.new_zeros(shape) if g is None else g for g, shape in zip(grads, shapes, strict=True)
    ]
    got = torch.ops.rnnkit.recurrence_backward(
        ctx.kind, x, w_ih, w_hh, bias, bias_hn, states0, mask, ctx.window, full
    )
    d_x, d_ih, d_hh, d_b, d_hn, *d_s0 = got
    return (None, d_x, d_ih, d_hh, d_b, d_hn if ctx.has_hn else None, d_s0, None, None)


_recurrence.register_autograd(_backward, setup_context=_setup_context)


def run_opaque(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask: Tensor | None,
    window: int | None,
) -> tuple[Tensor, tuple[Tensor, ...]] | None:
    """``run_recurrence``'s result through ``rnnkit::recurrence`` (one graph node), or
    None for a kernel the operator does not know. ``x (T, B, I)`` in the weights'
    dtype, ``mask (T, B)`` bool or None."""
    kind = kernel_name(kernel)
    if kind is None:
        return None
    result = torch.ops.rnnkit.recurrence(
        kind,
        x,
        weights.weight_ih,
        weights.weight_hh,
        weights.bias,
        weights.bias_hn,
        list(states0),
        mask,
        -1 if window is None else window,
    )
    return result[0], tuple(result[1:])
