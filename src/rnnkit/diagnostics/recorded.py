"""One run of a direction, asked several questions: :class:`RecordedRun`.

``state_gradient_norms``, ``step_contributions``, ``lag_contributions`` and
``jacobian_norms`` each run the direction forward over ``x`` (``forward_pass`` with its
record kept) before their own backward sweeps. Several of them over the same input and
state read the same record, so a :class:`RecordedRun` runs it once and answers each from
it: the numbers are those of the separate calls, bit for bit.
"""

from __future__ import annotations

from torch import Tensor

from rnnkit.cells.base import CellBase
from rnnkit.diagnostics.contributions import (
    Contributions,
    LossFn,
    _check_window,
    run_direction,
    run_lag_contributions,
    run_step_contributions,
)
from rnnkit.diagnostics.jacobian import _check_method, _run_jacobian_norms
from rnnkit.diagnostics.loss_gradients import run_state_gradients
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import State

__all__ = ["RecordedRun"]


class RecordedRun:
    """``source`` run forward once over ``x``; its gradients and Jacobians on demand.

    Args: as :func:`~rnnkit.diagnostics.step_contributions` (``source``, ``x``,
    ``lengths``, ``mask``, ``state``, ``batch_first``, ``zoneout``). The methods take the
    other arguments of the functions of their names and return what those return.

    >>> import torch
    >>> from rnnkit import RNNCell
    >>> from rnnkit.diagnostics import state_gradient_norms
    >>> cell, x = RNNCell(2, 3), torch.randn(4, 5, 2)
    >>> recorded = RecordedRun(cell, x)
    >>> last = recorded.state_gradient_norms(loss_fn=lambda h: h[:, -1].sum())
    >>> every = recorded.state_gradient_norms(loss_fn=lambda h: h.sum())
    >>> bool(torch.equal(every, state_gradient_norms(cell, x, loss_fn=lambda h: h.sum())))
    True
    """

    def __init__(
        self,
        source: CellBase | Recurrent,
        x: Tensor,
        *,
        lengths: Tensor | None = None,
        mask: Tensor | None = None,
        state: State | None = None,
        batch_first: bool = True,
        zoneout: float = 0.0,
    ) -> None:
        self.batch_first = batch_first
        #: ``(B, T)``: the sequences and steps of ``x``
        self.shape = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
        self.run = run_direction(
            source,
            x,
            lengths=lengths,
            mask=mask,
            state=state,
            batch_first=batch_first,
            zoneout=zoneout,
        )

    def state_gradient_norms(
        self,
        d_outputs: Tensor | None = None,
        *,
        loss_fn: LossFn | None = None,
        reads_final: bool = False,
    ) -> Tensor:
        """``‖∂L/∂h_k‖`` for ``k = 0 … T``, ``(T + 1,)``, as ``state_gradient_norms``."""
        g = run_state_gradients(self.run, d_outputs, loss_fn, self.batch_first, reads_final)[0]
        return g.norm(dim=(0, 2) if self.batch_first else (1, 2))

    def step_contributions(
        self,
        d_outputs: Tensor | None = None,
        *,
        loss_fn: LossFn | None = None,
        window: int | None = None,
        reads_final: bool = False,
    ) -> Contributions:
        """Each step's share of the weight gradients, as ``step_contributions``."""
        _check_window(window)
        return run_step_contributions(
            self.run, d_outputs, loss_fn, window, self.batch_first, reads_final
        )

    def lag_contributions(
        self,
        d_outputs: Tensor | None = None,
        *,
        loss_fn: LossFn | None = None,
        window: int | None = None,
        reads_final: bool = False,
    ) -> Contributions:
        """Each time lag's share of the weight gradients, as ``lag_contributions``."""
        _check_window(window)
        return run_lag_contributions(
            self.run, d_outputs, loss_fn, window, self.batch_first, reads_final
        )

    def jacobian_norms(
        self,
        *,
        start: int = 0,
        method: str = "exact",
        full_state: bool = False,
        iterations: int = 100,
        tol: float = 1e-8,
        block: int = 4,
        seed: int = 0,
    ) -> Tensor:
        """``‖∂h_t/∂h_k‖₂`` for ``k = start``, ``(B, T + 1 − start)``, as ``jacobian_norms``."""
        _check_method(method, iterations, block)
        return _run_jacobian_norms(
            self.run,
            start,
            method,
            full_state,
            iterations=iterations,
            tol=tol,
            block=block,
            seed=seed,
        )
