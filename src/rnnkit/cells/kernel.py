"""The contract between a cell's step math and the one time loop (``recurrence.py``).

A ``Kernel`` is the functional core of a cell kind with its options fixed (nonlinearity, GRU
switches). The time loop owns masking, buffers and the weight-gradient products; the
kernel owns the equations of one step, forward (``step_into``) and backward
(``step_backward``). Buffers are time-major, ``(T, B, ·)``, so each step reads and writes
contiguous ``(B, ·)`` blocks.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from torch import Tensor

__all__ = ["Kernel", "Weights"]


class Weights(NamedTuple):
    """A cell's parameters as the time loop passes them to a kernel.

    ``bias_hn`` is only used by the GRU with ``reset="after"`` (None otherwise).
    """

    weight_ih: Tensor  # (G·H, I)
    weight_hh: Tensor  # (G·H, H)
    bias: Tensor  # (G·H,)
    bias_hn: Tensor | None  # (H,)


class Kernel(Protocol):
    """One step of a cell kind, forward and backward, for the time loop."""

    gates: int  # G
    num_states: int  # 1 (h) or 2 (h, c)

    def prepare(self, w: Weights) -> object:
        """Per-call precomputation shared by all steps (e.g. transposed/scaled weights)."""

    def project_inputs(self, x: Tensor, w: Weights) -> Tensor:
        """``(N, I) -> (N, G·H)``: the input part of all pre-activations, one matmul."""

    def alloc_cache(self, T: int, B: int, H: int, like: Tensor) -> tuple[Tensor, ...]:
        """Time-major buffers of what backward needs, each ``(T, B, ·)``."""

    def prepare_backward(self, w: Weights) -> object:
        """Per-call precomputation for the backward steps (default: the weights)."""

    def step_into(
        self,
        xp: Tensor,
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: object,
    ) -> None:
        """Compute the new state into ``out`` and fill this step's ``cache`` views."""

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        """Local derivatives (σ', tanh', …) of ALL steps at once, ``(T, B, ·)`` each.

        ``states`` are the state buffers ``(T + 1, B, H)`` (index 0 = initial state).
        Computing these over the whole sequence before the reverse loop turns per-step
        elementwise ops into a few large ones.
        """

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: object,
    ) -> tuple[Tensor, ...]:
        """Backward of one step: write ∂L/∂(input pre-activation) into ``d_xp`` and
        ∂L/∂(recurrent pre-activation) into ``d_hp`` (the same buffer unless the cell's
        recurrent and input pre-activations differ), return ∂L/∂(previous state)."""

    def recurrent_grads(
        self, d_hp: Tensor, h_prev: Tensor, cache: tuple[Tensor, ...]
    ) -> tuple[Tensor, Tensor | None]:
        """``(∂L/∂weight_hh, ∂L/∂bias_hn or None)`` from all steps at once.

        ``d_hp (N, G·H)``, ``h_prev (N, H)`` and the cache are flattened over ``N = T·B``;
        each gradient is ONE matrix product (or sum) over all steps (SPEC §3).
        """
