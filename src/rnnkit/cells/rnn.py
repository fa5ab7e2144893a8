"""The simple (Elman) recurrent cell.

    a_t = W_x x_t + W_h h_{t-1} + b          W_x = weight_ih (H, I), W_h = weight_hh (H, H)
    h_t = φ(a_t)                             φ = tanh (default), relu or sigmoid (logistic)

Backward of one step (min-char-rnn's naming), with ``d_h`` = ∂L/∂h_t:

    d_a = φ'(a_t) ⊙ d_h            tanh: φ' = 1 − h_t²;  relu: φ' = [h_t > 0];
                                   sigmoid: φ' = h_t (1 − h_t)  (at most ¼)
    ∂L/∂h_{t-1} = W_hᵀ d_a
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rnnkit.cells.amp import cell_step_in_weights_dtype
from rnnkit.cells.base import CellBase, check_cell_input
from rnnkit.cells.kernel import Weights, input_product

__all__ = ["NONLINEARITIES", "RNNCell", "RNNKernel", "activate", "rnn_step", "rnn_step_backward"]

NONLINEARITIES = ("tanh", "relu", "sigmoid")
#: The compiled loop's code of each nonlinearity (rnnkit.bptt.native: 0 tanh, 1 relu, 2 sigmoid).
ACTIVATION_CODES = {"tanh": 0, "relu": 1, "sigmoid": 2}


def activate(a: Tensor, nonlinearity: str) -> Tensor:
    """``φ(a)``: tanh, relu or the logistic sigmoid."""
    if nonlinearity == "tanh":
        return torch.tanh(a)
    if nonlinearity == "relu":
        return torch.relu(a)
    return torch.sigmoid(a)


def derivative(h: Tensor, nonlinearity: str) -> Tensor:
    """``φ'(a)`` from ``h = φ(a)``: ``1 − h²``, ``[h > 0]`` or ``h (1 − h)``."""
    if nonlinearity == "tanh":
        return 1 - h * h
    if nonlinearity == "relu":
        return (h > 0).to(h.dtype)
    return h * (1 - h)


def rnn_step(x: Tensor, h_prev: Tensor, w: Weights, nonlinearity: str = "tanh") -> Tensor:
    """One step in plain differentiable ops: ``h_t = φ(W_x x_t + W_h h_{t-1} + b)``.

    Args:
        x: ``(B, I)``.  h_prev: ``(B, H)``.
    Returns:
        ``h_t (B, H)``.
    """
    a = x @ w.weight_ih.T + h_prev @ w.weight_hh.T + w.bias
    return activate(a, nonlinearity)


def rnn_step_backward(
    d_h: Tensor, h: Tensor, w: Weights, nonlinearity: str = "tanh"
) -> tuple[Tensor, Tensor]:
    """Readable backward of one step (the module docstring's equations).

    Args:
        d_h: ∂L/∂h_t ``(B, H)``.  h: ``h_t``, the step's output (φ' is read from it).
    Returns:
        ``(d_a, d_h_prev)``, both ``(B, H)``: ∂L/∂a_t (the pre-activation) and ∂L/∂h_{t-1}.
    """
    d_a = d_h * derivative(h, nonlinearity)
    return d_a, d_a @ w.weight_hh


@dataclass(frozen=True)
class RNNKernel:
    """Step math of the Elman cell for the time loop. Cache: none (``h_t`` suffices)."""

    nonlinearity: str = "tanh"
    gates: int = 1
    num_states: int = 1

    def step(self, x: Tensor, states: tuple[Tensor, ...], w: Weights) -> tuple[Tensor, ...]:
        """One step in plain differentiable ops (the loop a traced graph holds)."""
        return (rnn_step(x, states[0], w, self.nonlinearity),)

    def prepare(self, w: Weights) -> Tensor:
        return w.weight_hh.T  # (H, H) view: addmm reads it transposed, no copy

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        return (torch.addmm(w.bias, x, w.weight_ih.T).view(T, B, w.weight_hh.shape[1]),)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        return (weight.T,)

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        return ()

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: Any,  # what this kernel's prepare returns
    ) -> None:
        a = xp[0].addmm_(prev[0], prep)  # a_t = W_x x_t + b + W_h h_{t-1}, in place
        if self.nonlinearity == "tanh":
            torch.tanh(a, out=out[0])
        elif self.nonlinearity == "relu":
            torch.clamp(a, min=0, out=out[0])
        else:
            torch.sigmoid(a, out=out[0])

    def prepare_backward(self, w: Weights) -> Tensor:
        return w.weight_hh

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        h = states[0][1:]  # (T, B, H): h_1..h_T
        # φ'(a_t) for all steps at once: 1 − h² (tanh), [h > 0] (relu), h(1 − h) (sigmoid).
        return (derivative(h, self.nonlinearity),)

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: Any,  # what this kernel's prepare_backward returns
    ) -> tuple[Tensor, ...]:
        (deriv,) = cache
        torch.mul(d_new[0], deriv, out=d_xp)  # d_a = φ'(a_t) ⊙ d_h
        return (d_xp @ w,)  # ∂L/∂h_{t-1} = W_hᵀ d_a

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        return mm(d_hp.T, h_prev), None

    # The compiled loop (rnnkit.bptt.native) fills the same buffers as step_into/step_backward.
    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return False  # its input product runs before the loop, over rows of (T·B, I)

    def native_forward(
        self,
        lib: Any,
        x: Tensor,
        w: Weights,
        T: int,
        B: int,
        states0: tuple[Tensor, ...],
        mask: Tensor | None,
        save: bool,
        offsets: Tensor | None = None,
        projected: bool = False,
        reg: tuple[Tensor | None, ...] | None = None,
    ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor | None]:
        """``reg``: recurrent dropout's mask and zoneout's keep factor of h
        (``rnnkit.bptt.regularized``), each a contiguous tensor or None; None: none. With
        zoneout the cache holds the cell's own ``h̃_t`` (its φ' is the backward's)."""
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h"), reg, strict=True))
        # (T·B or N, H); the bias is added in the loop
        xp = x if projected else input_product(x, w.weight_ih)
        if offsets is None:
            xp = xp.view(T, B, xp.shape[1])
        act = ACTIVATION_CODES[self.nonlinearity]
        W, b = w.weight_hh.contiguous(), w.bias.contiguous()
        hs, cand = lib.rnn_forward(xp, W, b, states0[0], mask, act, offsets, **kw)
        return (hs,), ((cand,) if kw.get("keep_h") is not None else ()), None

    def native_backward(
        self,
        lib: Any,
        record: Any,
        w: Weights,
        mask: Tensor | None,
        d_out: Tensor | None,
        d_states: tuple[Tensor, ...],
        offsets: Tensor | None = None,
        need_x: bool = False,
        reg: tuple[Tensor | None, ...] | None = None,
    ) -> tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None]:
        kw = {} if reg is None else dict(zip(("rec_mask", "keep_h"), reg, strict=True))
        if kw.get("keep_h") is not None:  # φ' of the cell's own h̃_t, kept by the forward
            kw["cand"] = record.cache[-1].contiguous()
        act = ACTIVATION_CODES[self.nonlinearity]
        d_xp, d_h0 = lib.rnn_backward(
            record.states[0].contiguous(),
            w.weight_hh.contiguous(),
            mask,
            None if d_out is None else d_out.contiguous(),
            d_states[0],
            act,
            offsets,
            **kw,
        )
        return d_xp, d_xp, (d_h0,), None, None


class RNNCell(CellBase):
    """Elman cell ``h_t = φ(W_x x_t + W_h h_{t-1} + b)`` with ONE bias.

    Args:
        input_size: ``I``.  hidden_size: ``H``.
        nonlinearity: ``"tanh"``, ``"relu"`` or ``"sigmoid"`` (the logistic ``σ``).
        init: ``"uniform"`` (PyTorch's U(±1/√H)) or ``"orthogonal"`` recurrent weights.

    Parameters: ``weight_ih (H, I)``, ``weight_hh (H, H)``, ``bias (H,)`` — ``H(I + H + 1)``.

    >>> cell = RNNCell(10, 20)
    >>> sum(p.numel() for p in cell.parameters())
    620
    >>> cell(torch.zeros(3, 10)).shape
    torch.Size([3, 20])
    """

    gates = 1

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        nonlinearity: str = "tanh",
        init: str = "uniform",
    ) -> None:
        if nonlinearity not in NONLINEARITIES:
            raise ValueError(f"nonlinearity must be one of {NONLINEARITIES}, got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, init)
        self.nonlinearity = nonlinearity
        self.reset_parameters()

    @property
    def kernel(self) -> RNNKernel:
        return RNNKernel(self.nonlinearity)

    def weights(self) -> Weights:
        return Weights(self.weight_ih, self.weight_hh, self.bias, None)

    @cell_step_in_weights_dtype
    def forward(self, x: Tensor, state: Tensor | None = None) -> Tensor:
        """One step: ``x (B, I)``, ``state (B, H)`` or None (zeros) → ``h_t (B, H)``."""
        h_prev = check_cell_input(self, x, state)
        return rnn_step(x, h_prev, self.weights(), self.nonlinearity)

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, nonlinearity={self.nonlinearity!r}"
