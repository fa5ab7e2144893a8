"""A linear layer whose large float32 products run on the compiled library's ``matmul``.

``y = x Wᵀ + b`` — ``torch.nn.Linear``'s function, parameters and state dict. Where the
compiled library multiplies with its own AVX-512 kernel (``rnnkit.bptt.native.own_matmul``)
and the call has at least 64 rows, the forward product and both backward products
(``∂L/∂x = g W``, ``∂L/∂W = gᵀ x``) run there: torch's BLAS takes its AVX2 path on AMD
processors, at half of what such a core multiplies (an LM head of 2,048 rows × 256 → 100
took 3.5 ms a training step there, 1.65 ms on the library's product). Everywhere else —
other dtypes and devices, fewer rows, autocast, graph tracing, or no such library — it is
``torch.nn.functional.linear`` itself.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rnnkit.bptt import native
from rnnkit.bptt.tracing import tracing
from rnnkit.cells.amp import autocast_devices_on

__all__ = ["Linear", "linear"]

_MIN_ROWS = 64  # below this the library's matmul is torch's product anyway


class _LibraryLinear(torch.autograd.Function):
    """``x (N, in) Wᵀ + b`` with the library's products forward and backward."""

    @staticmethod
    def forward(ctx: Any, lib: Any, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.lib = lib
        ctx.save_for_backward(x, weight)
        out = lib.matmul(x, weight.T)  # (N, out)
        return out if bias is None else out.add_(bias)

    @staticmethod
    def backward(ctx: Any, d_out: Tensor):
        x, weight = ctx.saved_tensors
        # Under create_graph the products must be differentiable again: torch's own then.
        mm = torch.mm if torch.is_grad_enabled() else ctx.lib.matmul
        d_out = d_out.contiguous()
        need = ctx.needs_input_grad
        d_x = mm(d_out, weight) if need[1] else None  # (N, in)
        d_w = mm(d_out.T, x) if need[2] else None  # (out, in)
        d_b = d_out.sum(0) if need[3] else None
        return None, d_x, d_w, d_b


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``; on the library's product where that is faster
    (module docstring). ``x (..., in)``, ``weight (out, in)``, ``bias (out,)``.

    >>> linear(torch.ones(2, 3), torch.ones(4, 3)).tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
    """
    # a traced graph first: a comparison of its symbolic sizes would guard them (an
    # export with a dynamic batch then fails)
    if tracing() or torch.jit.is_tracing():
        return F.linear(x, weight, bias)
    rows = x.numel() // max(x.shape[-1], 1) if x.dim() else 0
    if (
        rows < _MIN_ROWS
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or (bias is not None and bias.dtype != torch.float32)
        or x.device.type != "cpu"
        or weight.device.type != "cpu"
        or autocast_devices_on()
        or not native.own_matmul()
    ):
        return F.linear(x, weight, bias)
    lib = native.library()
    flat = x.reshape(rows, x.shape[-1])
    out = _LibraryLinear.apply(lib, flat, weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """``torch.nn.Linear`` (same arguments, parameters and state dict) computed by
    :func:`linear`.

    >>> layer = Linear(3, 4)
    >>> layer(torch.zeros(2, 3)).shape, sorted(layer.state_dict())
    (torch.Size([2, 4]), ['bias', 'weight'])
    """

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
