"""``∂L/∂h_k`` for every state ``h_k``: how much of the loss's gradient reaches each step.

The library's explicit backward sweep (``rnnkit.bptt.backward``) is run one step at a
time so that the gradient entering every state is kept, not only the one reaching
``h_0``; ``∂L/∂h_k`` includes the loss at step ``k`` and everything after it. For the
LSTM the gradient of ``c_k`` comes too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rnnkit.bptt.backward import backward_sweep
from rnnkit.cells.base import CellBase
from rnnkit.diagnostics.contributions import (
    DirectionRun,
    LossFn,
    output_gradient,
    run_direction,
    sub_record,
)
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import State

__all__ = ["state_gradient_norms", "state_gradients"]


def state_gradients(
    source: CellBase | Recurrent,
    x: Tensor,
    d_outputs: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
    reads_final: bool = False,
) -> tuple[Tensor, ...]:
    """``∂L/∂h_k`` for ``k = 0 … T`` (and ``∂L/∂c_k`` for the LSTM), full BPTT.

    The explicit backward sweep is run one step at a time so the gradient of every state
    can be kept: ``∂L/∂h_k`` includes the loss at step k and everything after it.

    Args: as ``step_contributions`` (``source``, ``x``, ``d_outputs`` or ``loss_fn``, …,
    ``zoneout``, ``reads_final``).

    Returns:
        One tensor per state component, ``(B, T + 1, H)`` (time-major ``(T + 1, B, H)``
        if not ``batch_first``): index 0 is the initial state ``h_0``, index ``k + 1`` the
        state output at position ``k`` (``h_{k+1}`` in the 1-based notation of docs/math.md).

    >>> from rnnkit import LSTMCell
    >>> g_h, g_c = state_gradients(LSTMCell(2, 3), torch.randn(4, 5, 2),
    ...                            loss_fn=lambda h: h[:, -1].sum())
    >>> g_h.shape, bool(g_h[:, -1].eq(1).all())
    (torch.Size([4, 6, 3]), True)
    """
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    return run_state_gradients(run, d_outputs, loss_fn, batch_first, reads_final)


def run_state_gradients(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    batch_first: bool = True,
    reads_final: bool = False,
) -> tuple[Tensor, ...]:
    """:func:`state_gradients` of a direction already run (``gradient_flow`` shares the
    run with the Jacobians' norms)."""
    d_out, d_finals = output_gradient(run, d_outputs, loss_fn, batch_first, reads_final)
    record, T = run.record, run.steps
    grads = [torch.zeros_like(s) for s in record.states]  # (T + 1, B, H) each
    # the final state's gradient enters after the last step (and passes the padding)
    d = [
        torch.zeros_like(s[0]) if f is None else f.clone()
        for s, f in zip(record.states, d_finals, strict=True)
    ]
    with torch.no_grad():
        for t in range(T - 1, -1, -1):
            d[0] = d[0] + d_out[t]
            for g, dk in zip(grads, d, strict=True):
                g[t + 1] = dk
            mask3 = None if run.mask3 is None else run.mask3[t : t + 1]
            sweep = backward_sweep(
                run.kernel, sub_record(record, t, t + 1), run.weights, mask3, None, tuple(d)
            )
            d = list(sweep.d_states0)
        for g, dk in zip(grads, d, strict=True):
            g[0] = dk
    out = []
    for g in grads:
        g = torch.cat([g[:1], run.to_original(g[1:])])  # positions in original order
        out.append(g.transpose(0, 1) if batch_first else g)
    return tuple(out)


def state_gradient_norms(
    source: CellBase | Recurrent,
    x: Tensor,
    d_outputs: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
    reads_final: bool = False,
) -> Tensor:
    """``‖∂L/∂h_k‖`` for ``k = 0 … T``, ``(T + 1,)``: the norm over the whole batch.

    Per sequence: ``state_gradients(...)[0].norm(dim=-1)``.

    >>> from rnnkit import RNNCell
    >>> n = state_gradient_norms(RNNCell(2, 3), torch.randn(4, 5, 2),
    ...                          loss_fn=lambda h: h[:, -1].sum())
    >>> n.shape, bool(n[-1] == 12 ** 0.5)
    (torch.Size([6]), True)
    """
    g = state_gradients(
        source,
        x,
        d_outputs,
        loss_fn=loss_fn,
        lengths=lengths,
        mask=mask,
        state=state,
        batch_first=batch_first,
        zoneout=zoneout,
        reads_final=reads_final,
    )[0]
    return g.norm(dim=(0, 2) if batch_first else (1, 2))
