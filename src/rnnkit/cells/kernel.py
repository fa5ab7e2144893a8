"""The contract between a cell's step math and the one time loop (``recurrence.py``).

A ``Kernel`` is the functional core of a cell kind with its options fixed (nonlinearity, GRU
switches). The time loop owns masking, buffers and the weight-gradient products; the
kernel owns the equations of one step, forward (``step_into``) and backward
(``step_backward``). Buffers are time-major, ``(T, B, ·)``, so each step reads and writes
contiguous ``(B, ·)`` blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = ["Kernel", "StepKernel", "Weights", "batched_gradients", "input_product", "scratch"]

# oneDNN's matmul beats the BLAS by 5-30 % on this product for float32 on 2 cores here (the
# projections of all steps: T·B rows), but costs more per call on small ones.
_ONEDNN_MIN_ROWS = 256


def input_product(x: Tensor, weight: Tensor) -> Tensor:
    """``x weightᵀ`` for all steps at once, ``x (N, I)``, ``weight (G·H, I)`` → ``(N, G·H)``.

    >>> input_product(torch.ones(2, 3), torch.ones(4, 3)).tolist()[0]
    [3.0, 3.0, 3.0, 3.0]
    """
    if (
        x.shape[0] >= _ONEDNN_MIN_ROWS
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and x.is_contiguous()
        and weight.is_contiguous()
    ):
        try:
            return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        except (RuntimeError, AttributeError):  # a build without it: the BLAS below
            pass
    return x @ weight.T


def scratch(T: int, B: int, width: int, like: Tensor, save: bool) -> Tensor:
    """A ``(T, B, width)`` buffer; when nothing is saved, one step's worth reused T times."""
    if save:
        return like.new_empty(T, B, width)
    return like.new_empty(1, B, width).expand(T, B, width)


class Weights(NamedTuple):
    """A cell's parameters as the time loop passes them to a kernel.

    ``bias_hn`` is only used by the GRU with ``reset="after"`` (None otherwise).
    """

    weight_ih: Tensor  # (G·H, I)
    weight_hh: Tensor  # (G·H, H)
    bias: Tensor  # (G·H,)
    bias_hn: Tensor | None  # (H,)


class StepKernel(Protocol):
    """One step of a cell kind, forward and backward, for a loop over time in Python."""

    @property
    def gates(self) -> int:
        """``G``, the gate blocks of the pre-activations."""

    @property
    def num_states(self) -> int:
        """1 (``h``) or 2 (``h, c``)."""

    def prepare(self, w: Weights) -> object:
        """Per-call precomputation shared by all steps (e.g. transposed/scaled weights)."""

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        """``x (T·B, I)`` → the input part of all pre-activations, ``(T, B, ·)`` buffers.

        One matrix product over all steps. The buffers are the kernel's to overwrite:
        ``step_into`` may compute the gates in place and keep them as its cache.
        """

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        """The transposed input weights of each ``project_inputs`` buffer: ``x @ W_k``
        is buffer k's input part without the bias, for ``weight (G·H, I')`` — columns of
        ``weight_ih`` whose input is only known step by step (an attention context)."""

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        """Buffers of what backward needs, each ``(T, B, ·)``; may adopt ``xps``.

        With ``save=False`` (inference) a buffer not adopted from ``xps`` may be one
        step's scratch expanded over T (see ``scratch``).
        """

    def prepare_backward(self, w: Weights) -> object:
        """Per-call precomputation for the backward steps (default: the weights)."""

    def step_into(
        self,
        xp: tuple[Tensor, ...],
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
        recurrent and input pre-activations differ: then ``d_hp`` holds only the blocks
        that differ, e.g. the GRU's n block with ``reset="after"``), return
        ∂L/∂(previous state)."""

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        """``(∂L/∂weight_hh, ∂L/∂bias_hn or None)`` from all steps at once.

        ``d_xp (N, G·H)``, ``d_hp`` (see ``step_backward``), ``h_prev (N, H)`` and the
        cache are flattened over ``N = T·B``; each gradient is ONE matrix product (or
        sum) over all steps, computed by ``mm`` (the compiled library's own product
        where the time loop ran there).
        """


class Kernel(StepKernel, Protocol):
    """A :class:`StepKernel` whose whole loops over time also run in the compiled library
    (the time loop of ``rnnkit.bptt``)."""

    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        """Whether ``native_forward`` takes ``x (T, B, I)`` as it lies in memory (any
        strides, contiguous rows: a batch-first input, transposed, needs no copy)."""

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
        """The whole forward loop in the compiled library ``lib`` (rnnkit.bptt.native): the
        state buffers ``(T + 1, B, H)``, the cache, the same as ``step_into`` fills, and
        the outputs ``(T, B, H)`` where the loop also wrote them in the input's layout
        (a batch-first view; None: they are ``states[0][1:]``).
        ``x``: ``(N, I)`` rows, or ``(T, B, I)`` as it lies where ``native_reads_rows``.
        ``offsets``: packed rows (only the rows still running at each step).
        ``projected``: ``x`` is already the input product ``x W_ihᵀ`` ``(N, G·H)``, without
        the bias — the caller's tensor (possibly a view of it), which the loop must not
        overwrite.
        ``reg``: recurrent dropout's mask ``(B, H)`` and zoneout's keep factors, one per
        state ``(T, B, H)`` (None where off; ``rnnkit.bptt.regularized``)."""

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
    ) -> (
        tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None]
        | tuple[Tensor, Tensor, tuple[Tensor, ...], Tensor | None, Tensor | None, Tensor]
    ):
        """The whole backward loop in ``lib`` (``d_out (T, B, H)`` with any strides):
        ``(d_xp, d_hp, ∂L/∂initial states, d_x, d_bias)``, the first three the same as
        the steps of ``step_backward``. ``d_x`` is
        ∂L/∂x ``(N, I)`` where the loop computed it step by step (``need_x`` asks for it; a
        kernel may still return None, and ``weight_grads`` then takes ``d_xp W_ih``);
        ``d_bias`` is ∂L/∂bias, ``d_xp`` summed over its rows, where the loop summed it
        (None: ``weight_grads`` sums ``d_xp``). A sixth, where given, is ∂L/∂bias_hn summed
        by the loop (a layer-normalised cell's gains); ``d_hp`` is then ∂L/∂(W_h h_{t-1})
        alone, ``(N, G·H)``, and ``∂L/∂W_hh = d_hpᵀ h_{t-1}`` (no ``recurrent_grads``)."""


def batched_gradients(*grads: Tensor | None) -> bool:
    """Whether the incoming gradients of a backward are a batch of them under vmap
    (``torch.autograd.grad(..., is_grads_batched=True)``, a vectorized Jacobian), which
    an explicit backward's own operators have no rule for."""
    f = torch._C._functorch
    return any(
        g is not None and (f.is_legacy_batchedtensor(g) or f.is_batchedtensor(g)) for g in grads
    )
