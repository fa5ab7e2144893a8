"""The time loop in plain differentiable operations, and the gradients it gives.

Two readers need the recurrence as ordinary autograd sees it: a graph being traced
(``torch.compile``, ``torch.export``: ``rnnkit.bptt.recurrence``), and a gradient that is
itself differentiated — ``torch.autograd.grad(..., create_graph=True)`` for a gradient
penalty, ``torch.autograd.functional.hessian``, a Hessian-vector product. There the
explicit BPTT's result would be a constant of the graph; instead the backward runs the
forward again, step by step, from the node's inputs and lets autograd differentiate it
(:func:`differentiable_gradients`), so the gradients are functions of the inputs and of
the incoming gradients, as PyTorch's own recurrent layers give them on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.errors import ConfigError

__all__ = ["differentiable_gradients", "replayed_gradients", "unrolled"]


def unrolled(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask3: Tensor | None,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """``(outputs (T, B, H), final states)`` by the kernel's differentiable step, out of
    place; where ``mask3 (T, B, 1)`` is False the state is held (selection).
    ``x (T, B, I)`` with its padding already zero, each state ``(B, H)``."""
    step = _stepper(kernel)
    states, outputs = states0, []
    for t in range(x.shape[0]):
        new = step(t, x[t], states, weights)
        if mask3 is not None:
            new = tuple(torch.where(mask3[t], a, b) for a, b in zip(new, states, strict=True))
        outputs.append(new[0])
        states = new
    if not outputs:
        return x.new_zeros(0, x.shape[1], states0[0].shape[1]), states0
    return torch.stack(outputs), tuple(states)


def _stepper(kernel: Kernel) -> Callable[[int, Tensor, tuple[Tensor, ...], Weights], Any]:
    """``step(t, x_t, states, weights)``: the kernel's own ``step_at`` where its step reads
    per-step inputs besides ``x_t`` (zoneout's keep factors), else its ``step``."""
    at = getattr(kernel, "step_at", None)
    if at is not None:
        return at
    step = kernel.step  # type: ignore[attr-defined]
    return lambda t, x, states, w: step(x, states, w)


def differentiable_gradients(
    kernel: Kernel,
    x: Tensor,
    weights: Weights,
    states0: tuple[Tensor, ...],
    mask3: Tensor | None,
    grads_out: tuple[Tensor | None, ...],
    needs: tuple[bool, ...],
) -> tuple[Tensor | None, ...]:
    """The gradients of ``(x, weight_ih, weight_hh, bias, bias_hn, *states0)`` for
    ``grads_out = (d_outputs, *d_finals)``, with a graph (``create_graph=True``): the
    forward is run again by :func:`unrolled` and differentiated by autograd. ``needs``:
    which of the inputs want a gradient (None for the others)."""
    if not hasattr(kernel, "step") and not hasattr(kernel, "step_at"):
        raise ConfigError(
            f"{type(kernel).__name__} has no differentiable step: its gradient cannot be "
            "differentiated again (create_graph=True)"
        )
    inputs: tuple[Any, ...] = (x, *weights, *states0)
    wanted = [i for i, t in enumerate(inputs) if needs[i] and t is not None and t.requires_grad]

    def replay(a: tuple[Any, ...]) -> tuple[Tensor, ...]:
        outputs, finals = unrolled(kernel, a[0], Weights(*a[1:5]), a[5:], mask3)
        return (outputs, *finals)

    got = replayed_gradients(replay, inputs, wanted, grads_out)
    result: list[Tensor | None] = [None] * len(inputs)
    for i, g in zip(wanted, got, strict=True):
        # an input the outputs do not depend on (T = 0) gets zeros, as the explicit BPTT's
        result[i] = torch.zeros_like(inputs[i]) if g is None else g
    return tuple(result)


def replayed_gradients(
    replay: Callable[[tuple[Any, ...]], Sequence[Tensor]],
    inputs: Sequence[Any],
    wanted: Sequence[int],
    grads_out: Sequence[Tensor | None],
    create_graph: bool = True,
) -> list[Tensor | None]:
    """The gradients of ``inputs[i]`` for each ``i`` of ``wanted`` (None for one the
    outputs do not depend on) given ``grads_out``, one per output of ``replay(inputs)``
    (None: that output unused): the computation run again by ``replay`` and
    differentiated by autograd, with a graph (``create_graph``: the gradients are then
    functions of the inputs and of ``grads_out``, as a caller differentiating them needs,
    and a batch of incoming gradients under ``vmap`` takes this way too). A node whose own
    backward is no graph (the explicit BPTT, a fused kernel's, a decoder's sweep) answers
    a gradient with a graph so."""
    with torch.enable_grad():
        # A fresh view of each input to differentiate: one tensor may come twice (an LSTM
        # given (h0, h0)), and autograd.grad would give each place the sum of both.
        views = {i: inputs[i].view_as(inputs[i]) for i in wanted}
        outputs = replay(tuple(views.get(i, t) for i, t in enumerate(inputs)))
        pairs = [(o, g) for o, g in zip(outputs, grads_out, strict=True) if g is not None]
        return list(
            torch.autograd.grad(
                [o for o, _ in pairs],
                list(views.values()),
                [g for _, g in pairs],
                create_graph=create_graph,
                allow_unused=True,
            )
        )
