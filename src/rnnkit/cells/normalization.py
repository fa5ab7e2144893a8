"""The normalisation ν of the layer-normalised cells (``rnnkit.cells.layer_norm``, whose
docstring has the equations): ν and its scale, its backward, and the input part
``ν(x W_xᵀ) ⊙ γ_x`` of every step at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from rnnkit.cells.amp import autocast_devices_on, autocast_off, low_precision_to
from rnnkit.cells.kernel import batched_gradients, input_product

__all__ = ["EPS", "normalize", "normalize_backward", "normalized_input"]

EPS = 1e-5


def normalize(v: Tensor) -> tuple[Tensor, Tensor]:
    """``(ν(v), 1/√(var(v) + ε))`` over the last dimension (the scale keeps that dim, 1)."""
    mean = v.mean(-1, keepdim=True)
    inv = torch.rsqrt(v.var(-1, unbiased=False, keepdim=True) + EPS)
    return (v - mean) * inv, inv


class _InputProduct(torch.autograd.Function):
    """``x W_xᵀ`` of rows ``x (N, I)`` as the time loop computes its own input product:
    forward :func:`rnnkit.cells.kernel.input_product` (oneDNN where it is faster), backward
    the products of ``mm`` (the compiled library's where the loop runs compiled)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, mm: Callable[..., Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.mm = mm
        return input_product(x, weight)

    @staticmethod
    def backward(ctx: Any, d: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        # A gradient with a graph (create_graph=True) or a batch of them under vmap: torch's
        # own product, which autograd and vmap see through (the library's has no rules)
        mm = torch.mm if torch.is_grad_enabled() or batched_gradients(d) else ctx.mm
        d = d.contiguous()
        d_x = mm(d, weight) if ctx.needs_input_grad[0] else None
        d_w = mm(d.T, x) if ctx.needs_input_grad[1] else None
        return d_x, d_w, None


def normalized_input(
    x: Tensor, weight_ih: Tensor, gain: Tensor, mm: Callable[..., Tensor] | None = None
) -> Tensor:
    """The input part ``ν(x W_xᵀ) ⊙ γ_x`` of every step at once, ``x (…, I)`` →
    ``(…, G·H)``: ``normalize(x W_xᵀ)[0] * gain`` as torch's fused layer norm, whose
    forward and backward cost a few passes over the ``(T·B, G·H)`` product (the same
    function in separate operations costs a dozen). ``mm``: the compiled library's product
    (``rnnkit.bptt.native``), where the layer's loop runs compiled: the input product then
    runs as the time loop's own (:class:`_InputProduct`).

    Under ``torch.autocast`` the part is computed as the recurrence is
    (:mod:`rnnkit.cells.amp`): with autocast off, in the weights' dtype, a float16/bfloat16
    ``x`` cast up first. ν divides by the spread of the product's row, so the rounding of
    a bfloat16 product would come out amplified (a 2-layer LSTM's gradients were up to
    87 % off, against 0 in float32)."""
    on = autocast_devices_on()
    if on:
        with autocast_off(on):
            return normalized_input(low_precision_to(x, weight_ih.dtype), weight_ih, gain, mm)
    if mm is None:
        v = x @ weight_ih.T
    else:
        rows = _InputProduct.apply(x.reshape(-1, x.shape[-1]), weight_ih, mm)
        v = rows.view(*x.shape[:-1], rows.shape[-1])
    return F.layer_norm(v, (v.shape[-1],), gain, None, EPS)


def normalize_backward(d: Tensor, n: Tensor, inv: Tensor) -> Tensor:
    """∂L/∂v from ``d = ∂L/∂ν(v)``, ``n = ν(v)`` and its scale (module docstring)."""
    mean_d = d.mean(-1, keepdim=True)
    mean_dn = (d * n).mean(-1, keepdim=True)
    return inv * (d - mean_d - n * mean_dn)
