"""Recurrent dropout and zoneout inside the time loop: a kernel around a cell's kernel.

Both act on every step, so they live in the loop, with their masks passed in as inputs
(never drawn in the loop):

* **recurrent dropout** (Keras ``recurrent_dropout``; Gal & Ghahramani): one mask
  ``m (B, H)`` per sequence, ``0`` or ``1/(1 − p)``, on the state the recurrent product
  reads — the gates use ``(h_{t-1} ⊙ m) W_hhᵀ``. The GRU's update still mixes the
  unmasked ``h_{t-1}``: ``h_t = z ⊙ h_{t-1} + (1 − z) ⊙ n`` ("keep"; "candidate" swaps);
* **zoneout** (Krueger et al.): a keep factor ``d_t (B, H)`` per step and state,
  ``h_t = d_t ⊙ h_{t-1} + (1 − d_t) ⊙ h̃_t`` with ``h̃_t`` the cell's step (the LSTM's
  ``c_t`` the same with its own factor). In training ``d_t`` is a Bernoulli(p) draw per
  step and unit, at evaluation the constant ``p`` (the expectation).

Backward, with ``d_h = ∂L/∂h_t``: the cell's step backward gets ``d_h ⊙ (1 − d_t)`` and
its ``∂L/∂h_{t-1}`` gains ``d_h ⊙ d_t``; the recurrent product's gradient
``∂L/∂(h_{t-1} ⊙ m)`` reaches ``h_{t-1}`` times ``m``, and
``∂L/∂W_hh = Σ_t d_gatesᵀ (h_{t-1} ⊙ m)``. For the GRU the update's ``z`` then reads the
unmasked state: ``∂L/∂a_z`` gains ``±d_h ⊙ (h_{t-1} − h_{t-1} ⊙ m) ⊙ z(1 − z)``.

No fused kernel computes this function: a layer with these options never takes the
fused path. The compiled loops take the masks as inputs (``rnnkit/csrc/lstm.h``,
``gru.h``, ``rnn.h``, and ``layer_norm.h`` for the layer-normalised LSTM and GRU; the rows
then stay unsorted and unpacked, the masks being per batch row), and so do the Triton
steps on a GPU (``rnnkit.bptt.gpu_steps``, ``gpu_steps_ln``); elsewhere
the PyTorch time loop runs (``rnnkit.bptt.forward``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from rnnkit.cells.gru import GRUKernel, gru_step
from rnnkit.cells.kernel import Kernel, StepKernel, Weights, scratch
from rnnkit.cells.layer_norm import LayerNormGRUKernel, LayerNormLSTMKernel
from rnnkit.cells.lstm import LSTMKernel
from rnnkit.cells.rnn import RNNKernel
from rnnkit.errors import ConfigError

__all__ = ["CompiledRegularized", "RegularizedKernel", "regularized"]


class RegularizedKernel:
    """``inner``'s step with recurrent dropout and/or zoneout (module docstring).

    Args:
        inner: the cell's kernel (``cell.kernel``).
        recurrent_mask: ``m (B, H)`` on ``h_{t-1}`` in the recurrent product, or None.
        keep: one zoneout keep factor per state (``(h,)`` or ``(h, c)``), each
            ``(T, B, H)`` (any view that broadcasts, e.g. a constant expanded), or None.
    """

    def __init__(
        self,
        inner: StepKernel,
        recurrent_mask: Tensor | None = None,
        keep: tuple[Tensor | None, ...] | None = None,
    ) -> None:
        self.inner = inner
        self.recurrent_mask = recurrent_mask
        keep = keep if keep is not None else (None,) * inner.num_states
        if len(keep) != inner.num_states:
            raise ValueError(
                f"keep needs one entry per state ({inner.num_states}), got {len(keep)}"
            )
        #: the states that zoneout acts on, and their keep factors (T, B, H)
        self.zoned = tuple(k for k, d in enumerate(keep) if d is not None)
        self.keep = tuple(d for d in keep if d is not None)
        self.gates = inner.gates
        self.num_states = inner.num_states
        # the sweep and the weight gradients read these of the kernel (the GRU's layout,
        # a layer-normalised cell's input and separate recurrent gradient)
        self.reset = getattr(inner, "reset", None)
        self.recurrent_grad_width = getattr(inner, "recurrent_grad_width", None)
        self.reads_projected = getattr(inner, "reads_projected", False)
        self.backward_reads_bias_hn = getattr(inner, "backward_reads_bias_hn", False)
        self._gru = inner if isinstance(inner, GRUKernel) else None

    def keep_views(self, T: int, B: int, H: int, dtype: torch.dtype) -> tuple[Tensor, ...]:
        """The keep factors as ``(T, B, H)`` views in ``dtype`` that store only the axes
        along which some factor varies: unit stride 1, and the same step and row strides
        for all (0 along an axis where every factor is constant). The constant ``p`` of
        evaluation (a ``(1, 1, 1)`` value expanded) becomes ``H`` values, never ``T·B·H``;
        for kernels that read the factors by strides (the Triton steps)."""
        views = [d.expand(T, B, H) for d in self.keep]
        # an axis is stored where some factor varies along it (a stride not 0, size > 1)
        steps = T if T > 1 and any(v.stride(0) != 0 for v in views) else min(T, 1)
        rows = B if B > 1 and any(v.stride(1) != 0 for v in views) else min(B, 1)
        stored = [v[:steps, :rows].to(dtype).contiguous() for v in views]
        return tuple(s.expand(T, B, H) for s in stored)

    def for_rows(self, n: int) -> RegularizedKernel:
        """This kernel for ``n`` steps' rows batched as ``n·B`` (the windowed BPTT's
        backward of all steps at one lag): the recurrent mask tiled ``n`` times. The keep
        factors come per row from the cache."""
        m = self.recurrent_mask
        if m is None or n == 1:
            return self
        tiled = copy.copy(self)
        tiled.recurrent_mask = m.repeat(n, 1)
        return tiled

    def for_steps(self, a: int, b: int) -> RegularizedKernel:
        """This kernel for steps ``a … b − 1`` run on their own (a segment of
        ``recompute``): zoneout's keep factors of those steps (a factor constant in time,
        one step long, as it is). The recurrent mask is per row: the same."""
        if not self.keep:
            return self
        cut = copy.copy(self)
        cut.keep = tuple(d[a:b] if d.shape[0] > 1 else d for d in self.keep)
        return cut

    # -- forward ---------------------------------------------------------------------
    def prepare(self, w: Weights) -> object:
        return self.inner.prepare(w)

    def project_inputs(self, x: Tensor, w: Weights, T: int, B: int) -> tuple[Tensor, ...]:
        # the keep factors ride along as per-step inputs: the loop hands step t its rows
        return (*self.inner.project_inputs(x, w, T, B), *self.keep)

    def input_weights_t(self, weight: Tensor) -> tuple[Tensor, ...]:
        return self.inner.input_weights_t(weight)

    def alloc_cache(
        self, T: int, B: int, H: int, xps: tuple[Tensor, ...], save: bool
    ) -> tuple[Tensor, ...]:
        inner = self.inner.alloc_cache(T, B, H, self._inner_xps(xps), save)
        # the cell's own new states h̃_t (c̃_t), before zoneout: its backward reads them
        cands = tuple(scratch(T, B, H, xps[0], save) for _ in self.zoned)
        return (*inner, *cands)

    def _inner_xps(self, xps: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return xps[: len(xps) - len(self.zoned)]

    def _masked(self, prev: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        m = self.recurrent_mask
        return prev if m is None else (prev[0] * m, *prev[1:])

    def step_into(
        self,
        xp: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        out: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        prep: object,
    ) -> None:
        z_n = len(self.zoned)
        inner_xp, keep_t = xp[: len(xp) - z_n], xp[len(xp) - z_n :]
        inner_cache, cands = cache[: len(cache) - z_n], cache[len(cache) - z_n :]
        prev_m = self._masked(prev)
        self.inner.step_into(inner_xp, prev_m, out, inner_cache, prep)
        if self._gru is not None and self.recurrent_mask is not None:
            # the update mixes the unmasked h_{t-1}: add K ⊙ (h − h ⊙ m), K the share kept
            H = prev[0].shape[1]
            z = inner_cache[0][:, H : 2 * H]
            share = z if self._gru.update == "keep" else 1 - z
            out[0].addcmul_(share, prev[0] - prev_m[0])
        for j, k in enumerate(self.zoned):
            cands[j].copy_(out[k])
            out[k].lerp_(prev[k], keep_t[j])  # d ⊙ prev + (1 − d) ⊙ h̃

    def step_at(
        self, t: int, x: Tensor, states: tuple[Tensor, ...], w: Weights
    ) -> tuple[Tensor, ...]:
        """Step ``t`` in plain differentiable operations (a traced graph, a ``torch.func``
        transform, a gradient differentiated again): the cell's step reading the masked
        state (the GRU's update mixing the unmasked ``h_{t-1}``), then zoneout's
        ``d_t ⊙ s_{t-1} + (1 − d_t) ⊙ s̃_t``. ``x (B, ·)``, each state ``(B, H)``."""
        prev_m = self._masked(states)
        if self._gru is not None and self.recurrent_mask is not None:
            g = self._gru
            new = (gru_step(x, prev_m[0], w, g.update, g.reset, mix=states[0]),)
        else:
            new = tuple(self.inner.step(x, prev_m, w))  # type: ignore[attr-defined]
        out = list(new)
        for j, k in enumerate(self.zoned):
            d = self.keep[j]
            d_t = d[t] if d.shape[0] > 1 else d[0]  # a constant (evaluation) broadcasts
            out[k] = d_t * states[k] + (1 - d_t) * new[k]
        return tuple(out)

    # -- backward --------------------------------------------------------------------
    def prepare_backward(self, w: Weights) -> object:
        return self.inner.prepare_backward(w)

    def backward_cache(
        self, cache: tuple[Tensor, ...], states: tuple[Tensor, ...]
    ) -> tuple[Tensor, ...]:
        z_n = len(self.zoned)
        inner_cache, cands = cache[: len(cache) - z_n], cache[len(cache) - z_n :]
        own = list(states)
        for j, k in enumerate(self.zoned):  # the cell's step produced h̃, not h
            own[k] = torch.cat([states[k][:1], cands[j]])
        return (*self.inner.backward_cache(inner_cache, tuple(own)), *self.keep, *cands)

    def step_backward(
        self,
        d_new: tuple[Tensor, ...],
        prev: tuple[Tensor, ...],
        new: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_hp: Tensor,
        w: Any,  # what the inner kernel's prepare_backward returns
    ) -> tuple[Tensor, ...]:
        z_n = len(self.zoned)
        inner_cache = cache[: len(cache) - 2 * z_n]
        keep_t = cache[len(cache) - 2 * z_n : len(cache) - z_n]
        cands = cache[len(cache) - z_n :]
        d_cell, new_cell = list(d_new), list(new)
        for j, k in enumerate(self.zoned):
            d_cell[k] = d_new[k] * (1 - keep_t[j])  # ∂L/∂h̃_t
            new_cell[k] = cands[j]
        prev_m = self._masked(prev)
        d_prev = list(
            self.inner.step_backward(
                tuple(d_cell), prev_m, tuple(new_cell), inner_cache, d_xp, d_hp, w
            )
        )
        m = self.recurrent_mask
        if m is not None:
            if self._gru is not None:
                d_prev[0] = self._gru_unmasked_update(
                    d_cell[0], prev, prev_m, inner_cache, d_xp, d_prev[0], w
                )
            else:
                d_prev[0] = d_prev[0] * m
        for j, k in enumerate(self.zoned):
            d_prev[k] = d_prev[k] + d_new[k] * keep_t[j]
        return tuple(d_prev)

    def _gru_unmasked_update(
        self,
        d_h: Tensor,
        prev: tuple[Tensor, ...],
        prev_m: tuple[Tensor, ...],
        cache: tuple[Tensor, ...],
        d_xp: Tensor,
        d_prev_m: Tensor,
        w: Weights,
    ) -> Tensor:
        """∂L/∂h_{t-1} of a GRU step whose products read ``h ⊙ m`` and whose update reads
        ``h``; ``d_prev_m`` is the kernel's gradient as if the step had read ``h ⊙ m``
        everywhere, and ``d_xp``'s z block is corrected in place."""
        assert self._gru is not None and self.recurrent_mask is not None
        H = prev[0].shape[1]
        rz, _, _, d_rz, _ = cache
        z = rz[:, H : 2 * H]
        share = z if self._gru.update == "keep" else 1 - z
        gap = prev[0] - prev_m[0]  # h − h ⊙ m: what the update reads beyond the products
        sign = 1.0 if self._gru.update == "keep" else -1.0
        extra_az = (d_h * gap * d_rz[:, H : 2 * H]).mul_(sign)
        d_xp[:, H : 2 * H].add_(extra_az)
        W_z = w.weight_hh[H : 2 * H]
        direct = d_h * share  # the update's own path, counted on h ⊙ m by the kernel
        through_products = d_prev_m - direct + extra_az @ W_z
        return through_products * self.recurrent_mask + direct

    def recurrent_grads(
        self,
        d_xp: Tensor,
        d_hp: Tensor,
        h_prev: Tensor,
        cache: tuple[Tensor, ...],
        mm: Callable[[Tensor, Tensor], Tensor] = torch.mm,
    ) -> tuple[Tensor, Tensor | None]:
        return self.inner.recurrent_grads(d_xp, d_hp, self.recurrent_operand(h_prev), cache, mm)

    def recurrent_operand(self, h_prev: Tensor) -> Tensor:
        """What the recurrent product read, for ``h_prev (T·B, H)`` (every step's
        ``h_{t-1}``, unpacked): ``h_{t-1} ⊙ m`` under recurrent dropout, else ``h_prev``.
        The weight gradients read it (``∂L/∂W_hh = Σ_t d_qᵀ (h_{t-1} ⊙ m)``)."""
        m = self.recurrent_mask
        if m is None:
            return h_prev
        B, H = m.shape
        return (h_prev.view(-1, B, H) * m).view(-1, H)


class CompiledRegularized(RegularizedKernel):
    """:class:`RegularizedKernel` with the compiled loop's forward and backward, which
    take the same masks (``rnnkit/csrc/lstm.h``, ``gru.h``, ``rnn.h``, ``layer_norm.h``;
    a layer-normalised cell's backward sums its gains' gradients itself, and the weight
    gradients read :meth:`recurrent_operand`). ``unsorted``:
    the time loop keeps the batch's row order and packs no steps (the masks are per batch
    row)."""

    unsorted = True

    def _reg(self, like: Tensor) -> tuple[Tensor | None, ...]:
        keep: list[Tensor | None] = [None] * self.num_states
        for j, k in enumerate(self.zoned):
            keep[k] = self.keep[j].to(like.dtype).contiguous()
        m = self.recurrent_mask
        return (None if m is None else m.to(like.dtype).contiguous(), *keep)

    def native_reads_rows(self, x: Tensor, w: Weights) -> bool:
        return self.inner.native_reads_rows(x, w)  # type: ignore[attr-defined]

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
    ) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor | None]:
        inner = cast("Kernel", self.inner)  # the compiled loop only runs kernels that have one
        reg = self._reg(states0[0])
        states, cache, outputs = inner.native_forward(
            lib, x, w, T, B, states0, mask, save, offsets, projected, reg=reg
        )
        if self.zoned and not self._keeps_candidates:
            # the PyTorch backward's layout (the cell's cache, then h̃): the LSTM's and
            # GRU's backward (layer-normalised too) never read h̃ (their derivatives come
            # from the gates and the cached normalisations), so
            # the states stand in for it, should that backward follow this forward
            cache = (*cache, *(states[k][1:] for k in self.zoned))
        return states, cache, outputs

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
    ) -> tuple[Any, ...]:  # the inner kernel's (Kernel.native_backward)
        reg = self._reg(record.states[0])
        if self.zoned and not self._keeps_candidates:
            record = record._replace(cache=record.cache[: len(record.cache) - len(self.zoned)])
        return cast("Kernel", self.inner).native_backward(
            lib, record, w, mask, d_out, d_states, offsets, need_x, reg=reg
        )

    @property
    def _keeps_candidates(self) -> bool:
        """Whether the compiled forward itself keeps h̃ (the simple cell: its φ')."""
        return isinstance(self.inner, RNNKernel)


def regularized(
    inner: StepKernel, recurrent_mask: Tensor | None, keep: tuple[Tensor, ...] | None
) -> RegularizedKernel:
    """The kernel of ``inner`` with these masks, in the compiled loop where that loop runs
    (the three cells and the layer-normalised LSTM and GRU), else in the PyTorch loop."""
    if recurrent_mask is not None and isinstance(inner, LayerNormGRUKernel):
        raise ConfigError(
            "recurrent_dropout has no layer-normalised GRU form (its update mixes the "
            "unmasked state): use zoneout or weight_drop"
        )
    if isinstance(
        inner, (LSTMKernel, GRUKernel, RNNKernel, LayerNormLSTMKernel, LayerNormGRUKernel)
    ):
        return CompiledRegularized(inner, recurrent_mask, keep)
    return RegularizedKernel(inner, recurrent_mask, keep)
