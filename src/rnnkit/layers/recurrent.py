"""One direction of one recurrent layer: a cell run over time by the one time loop.

Works time-major, ``(T, B, ·)``: the stacked layers convert the batch-first input once,
so no per-layer transposes are paid.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from rnnkit.bptt.dispatch import compiled_library
from rnnkit.bptt.fused import wants_fused
from rnnkit.bptt.recompute import run_recomputed
from rnnkit.bptt.recurrence import run_recurrence
from rnnkit.bptt.tracing import check_tracer, tracing
from rnnkit.cells.amp import computes_in_float32, float32
from rnnkit.cells.base import CellBase
from rnnkit.cells.kernel import Weights
from rnnkit.layers.masking import flip_sequences
from rnnkit.layers.regularization import CellMasks, float32_masks, masked_loop
from rnnkit.types import LSTMState, State

__all__ = ["Recurrent"]


def _float32(
    x: Tensor, states0: tuple[Tensor, ...], weights: Weights, masks: CellMasks | None
) -> tuple[Tensor, tuple[Tensor, ...], Weights, CellMasks | None]:
    """The loop's tensors cast to float32 (differentiable casts: the gradients reach the
    float16/bfloat16 parameters in their own dtype), for a call on float16/bfloat16
    weights (``rnnkit.cells.amp.computes_in_float32``). ``x (T, B, I)``."""
    return (
        x.float(),
        tuple(s.float() for s in states0),
        Weights(*(float32(w) for w in weights)),  # type: ignore[arg-type]
        float32_masks(masks),
    )


class Recurrent(nn.Module):
    """Run ``cell`` forward in time, or backward within each sequence's own length.

    With ``reverse=True`` each sequence is read from ITS OWN last real step down to its
    first, so the output at step t equals running the cell on the reversed
    unpadded sequence; outputs are returned in the original time order.

    Args:
        cell: an ``RNNCell``, ``LSTMCell`` or ``GRUCell``.
        reverse: read each sequence backwards.
    """

    def __init__(self, cell: CellBase, reverse: bool = False) -> None:
        super().__init__()
        self.cell = cell
        self.reverse = reverse

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        state: State | None = None,
        window: int | None = None,
        recompute: int | None = None,
        projected: bool = False,
        masks: CellMasks | None = None,
        reset: Tensor | None = None,
    ) -> tuple[Tensor, State]:
        """``x (T, B, I)``, ``mask (T, B)`` → ``(outputs (T, B, H), final state)``.

        ``recompute=k`` stores only every k-th state and recomputes the rest in the
        backward (``rnnkit.bptt.recompute``); not together with ``window``.
        ``projected``: ``x (T, B, G·H)`` is the input product ``x W_ihᵀ`` (no bias),
        computed by the caller (``rnnkit.bptt.recurrence.run_recurrence``).
        ``masks``: the regularizers' masks of this direction (``rnnkit.layers.regularization``):
        the masked ``weight_hh`` goes to the loop; recurrent dropout and zoneout run in
        the loop (``rnnkit.bptt.regularized``), under a ``window`` or ``recompute`` too.
        ``reset (T, B)``: the state entering step t zero for those rows, forward direction
        only, where ``rnnkit.bptt.recurrence.takes_resets`` says so."""
        check_tracer()
        # a layer-normalised cell's method (looked up on its class: a Module's failed
        # attribute lookup costs an exception, at every call of every other cell)
        input_part = getattr(type(self.cell), "input_part", None)
        if input_part is not None:
            if mask is not None:  # the padding never reaches ν (it may hold NaN)
                x = torch.where(mask[..., None], x, 0.0)
            # ν(x W_xᵀ) γ_x of every step at once, through autograd; its products those of
            # the compiled loop where the layer runs there
            lib = compiled_library(self.cell.kernel, x, self.cell.weight_ih)
            x = input_part(self.cell, x, None if lib is None else lib.matmul)
        B = x.shape[1]
        if state is None:
            state = self.cell.zero_state(B, x)
        states0 = tuple(state) if isinstance(state, LSTMState) else (state,)
        run_mask = mask
        if self.reverse:
            x, run_mask = flip_sequences(x, mask)
        weights = self.cell.weights()
        w_hh = weights.weight_hh
        # float16 on a GPU stays float16 where cuDNN runs the layer (asked only then)
        fused = (
            w_hh.dtype == torch.float16
            and w_hh.device.type != "cpu"
            and wants_fused(self.cell.kernel, x, run_mask, window, projected) is not None
        )
        low = w_hh.dtype if computes_in_float32(w_hh, fused) else None
        if low is not None:  # float16/bfloat16 weights: the loop computes in float32
            x, states0, weights, masks = _float32(x, states0, weights, masks)
        kernel, weights = masked_loop(self.cell.kernel, weights, masks)
        if recompute is not None and not tracing():  # a graph's memory is the compiler's
            if projected:
                raise ValueError("a projected input cannot be recomputed: recompute=None")
            if window is not None:
                raise ValueError("recompute and window cannot be combined: choose one")
            outputs, finals = run_recomputed(kernel, x, weights, states0, run_mask, recompute)
        else:
            outputs, finals = run_recurrence(
                kernel, x, weights, states0, run_mask, window, projected, reset
            )
        if low is not None:  # one rounding to the weights' dtype, as torch's layer returns
            outputs, finals = outputs.to(low), tuple(f.to(low) for f in finals)
        if self.reverse:
            # Flip back with the ORIGINAL mask: the extent [0, L) is that of the input (a
            # leading hole makes the flipped mask's extent shorter).
            outputs, _ = flip_sequences(outputs, mask)
        final: State = LSTMState(*finals) if self.cell.is_lstm else finals[0]
        return outputs, final

    def extra_repr(self) -> str:
        return "reverse=True" if self.reverse else ""
