"""How far one state reaches the later ones: ``‖∂h_t/∂h_k‖₂``, and gradient flow at once.

The measured norms come from the cell's own step (``cell(x, state)``, plain differentiable
ops): ``method="exact"`` multiplies the per-step Jacobians (``H × H``, or ``2H × 2H`` for
the LSTM state ``(h, c)``) and takes the spectral norm of the product; ``method="power"``
never forms a matrix and runs (block) power iteration on ``PᵀP`` with vector products (``Pᵀu``
by backward mode, ``Pv`` by differentiating that once more — no forward-mode AD), for
large ``H``. Its estimate ``σ_max(P V)`` (orthonormal ``V``) is never above the true norm.

For the LSTM and GRU the Jacobian of ``h_t`` w.r.t. ``h_k`` goes through the full state
(``c`` too); ``full_state=True`` reports the norm of the whole state Jacobian instead.
Masked steps hold the state, so their Jacobian is the identity.

``gradient_flow`` bundles these norms with ``‖∂L/∂h_k‖`` (``loss_gradients``) and the bound
``(γλ)^{t−k}`` they are compared with (``bound``) for plots and reports; the names of those
two modules are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rnnkit.cells.base import CellBase
from rnnkit.cells.rnn import RNNCell
from rnnkit.diagnostics.bound import (
    DerivativeSize,
    activation_gain,
    jacobian_bound,
    real_steps,
    rnn_jacobian_bound,
    spectral_norm,
    weight_derivative_size,
)
from rnnkit.diagnostics.contributions import DirectionRun, LossFn, direction_cell, run_direction
from rnnkit.diagnostics.loss_gradients import (
    run_state_gradients,
    state_gradient_norms,
    state_gradients,
)
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState, State

__all__ = [
    "DerivativeSize",
    "GradientFlow",
    "activation_gain",
    "gradient_flow",
    "jacobian_bound",
    "jacobian_norms",
    "real_steps",
    "rnn_jacobian_bound",
    "spectral_norm",
    "state_gradient_norms",
    "state_gradients",
    "step_jacobians",
    "weight_derivative_size",
]

METHODS = ("exact", "power")


# ---- ∂h_t/∂h_k ------------------------------------------------------------------------
def _step_function(cell: CellBase, x_t: Tensor, zoneout: float = 0.0) -> Callable[[Tensor], Tensor]:
    """One step of the cell as a map of the flat state ``s (B, S)`` (``S = 2H`` for LSTM);
    with ``zoneout = p``, the step at evaluation ``p s + (1 − p) step(s)``."""
    H = cell.hidden_size

    def step(s: Tensor) -> Tensor:
        if cell.is_lstm:
            new = cell(x_t, LSTMState(s[:, :H], s[:, H:]))
            out = torch.cat([new.h, new.c], dim=1)
        else:
            out = cell(x_t, s)
        return out if not zoneout else torch.lerp(out, s, zoneout)

    return step


def _flat_states(run: DirectionRun) -> Tensor:
    return torch.cat(run.record.states, dim=-1)  # (T + 1, B, S)


def step_jacobians(
    source: CellBase | Recurrent,
    x: Tensor,
    *,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
) -> Tensor:
    """The Jacobian of each step, ``∂s_{t+1}/∂s_t`` per sequence: ``(T, B, S, S)``.

    ``s`` is the state (``h``, or ``[h; c]`` for the LSTM, ``S = 2H``); the identity at
    masked steps. For a reverse direction, in reading order. With ``zoneout = p`` (a layer
    built with it, as at evaluation) each real step's ``p I + (1 − p) J``, along that
    run's states.

    >>> from rnnkit import RNNCell
    >>> cell = RNNCell(2, 3)
    >>> J = step_jacobians(cell, torch.randn(1, 4, 2), mask=torch.tensor([[1, 1, 0, 1]]))
    >>> J.shape, bool(torch.equal(J[2, 0], torch.eye(3)))
    (torch.Size([4, 1, 3, 3]), True)
    """
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    return _run_jacobians(run)


_ROWS_AT_ONCE = 1 << 22  # numbers in the repeated batch of one backward pass
# Multiply-adds of one row of the repeated batch, B·(I + S)·G·H, up to which repeating the
# batch pays: above it, one backward pass per row of J_t over one forward costs less. Per
# row, the repeated batch computes the step again (the input's product included); a pass
# of its own costs a row ~0.15–0.35 ms of autograd's overhead, about 6M multiply-adds on
# one CPU thread. Measured there (one step, J_t of every row): LSTM S 128, B 16, I 512:
# 12.6 ms repeated, 32 ms a pass per row; I 2048: 41 ms against 35; GRU S 256, B 16,
# I 256: 94 ms against 91; B 4, I 1024: 33 ms against 73.
_REPEAT_WORK = 6_000_000


def _step_jacobian(
    cell: CellBase, x_t: Tensor, state: Tensor, zoneout: float, eye: Tensor
) -> Tensor:
    """The Jacobian of one step from ``state (B, S)`` with input ``x_t``, ``(B, S, S)``:
    ``[b, i, :]`` is the gradient of the new state's ``[b, i]``."""
    B, S = state.shape
    GH, I = cell.weight_ih.shape
    if B * (I + S) * GH > _REPEAT_WORK:  # one forward, a backward pass per row
        with torch.enable_grad():
            s_prev = state.detach().requires_grad_(True)
            new = _step_function(cell, x_t, zoneout)(s_prev)  # (B, S)
            # Rows are independent: the gradient of column i summed over the batch holds
            # row i of every sequence's own Jacobian.
            rows = [
                torch.autograd.grad(new[:, i].sum(), s_prev, retain_graph=i < S - 1)[0]
                for i in range(S)
            ]
        return torch.stack(rows, dim=1)
    # Rows come k at a time from one backward pass: the batch repeated k times, copy j
    # asked for row i + j (each sequence's and each copy's step reads only its own state);
    # k bounds the repeated batch to ~2²² numbers. (Plain autograd: torch.func's first
    # call costs seconds.)
    k = max(1, min(S, _ROWS_AT_ONCE // max(1, B * (S + I))))
    parts = []
    for i in range(0, S, k):
        n = min(k, S - i)
        with torch.enable_grad():
            s_prev = state.detach().repeat(n, 1).requires_grad_(True)  # row j·B + b
            new = _step_function(cell, x_t.repeat(n, 1), zoneout)(s_prev)
            pick = eye[i : i + n].repeat_interleave(B, dim=0)  # copy j: row i + j
            # a scalar's gradient: autograd given grad_outputs of a tensor imports sympy
            # (torch.fx's symbolic shapes) the first time, ~0.7 s of a report's process
            (grad,) = torch.autograd.grad((new * pick).sum(), s_prev)
        parts.append(grad.reshape(n, B, S))
    return torch.cat(parts).transpose(0, 1)


def _run_jacobians(run: DirectionRun) -> Tensor:
    """:func:`step_jacobians` of a direction already run (``jacobian_norms`` shares it)."""
    s, xs = _flat_states(run), run.inputs
    T, B, S = run.steps, s.shape[1], s.shape[2]
    eye = torch.eye(S, dtype=s.dtype, device=s.device)
    out = s.new_empty(T, B, S, S)
    for t in range(T):
        J = _step_jacobian(run.cell, xs[t], s[t], run.zoneout, eye)
        if run.mask3 is not None:
            J = torch.where(run.mask3[t].unsqueeze(-1), J, eye)
        out[t] = J.detach()
    return out


class _LinearSteps:
    """``v ↦ J_t v`` and ``u ↦ J_tᵀ u`` of every step without forming ``J_t``.

    The batch is repeated ``copies`` times (rows ``i·B + b``) so that a block of vectors
    per sequence goes through in one call.
    """

    def __init__(self, run: DirectionRun, start: int, copies: int = 1) -> None:
        s, xs = _flat_states(run), run.inputs
        self.mask3 = None if run.mask3 is None else run.mask3.repeat(1, copies, 1)
        self.graphs: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        with torch.enable_grad():
            for t in range(start, run.steps):
                s_prev = s[t].detach().repeat(copies, 1).requires_grad_(True)
                new = _step_function(run.cell, xs[t].repeat(copies, 1), run.zoneout)(s_prev)
                u = torch.zeros_like(new, requires_grad=True)
                (vjp,) = torch.autograd.grad(new, s_prev, u, create_graph=True)  # Jᵀu, linear
                self.graphs.append((s_prev, new, u, vjp))
        self.start = start

    def _hold(self, t: int, new: Tensor, old: Tensor) -> Tensor:
        return new if self.mask3 is None else torch.where(self.mask3[t], new, old)

    def forward(self, v: Tensor, stop: int) -> Tensor:
        """``P v`` for ``P = J_{stop−1} ⋯ J_start`` (steps ``start … stop − 1``)."""
        for t in range(self.start, stop):
            _, _, u, vjp = self.graphs[t - self.start]
            (jv,) = torch.autograd.grad(vjp, u, v, retain_graph=True)
            v = self._hold(t, jv, v)
        return v

    def backward(self, u: Tensor, stop: int) -> Tensor:
        """``Pᵀ u``."""
        for t in range(stop - 1, self.start - 1, -1):
            s_prev, new, _, _ = self.graphs[t - self.start]
            (ju,) = torch.autograd.grad(new, s_prev, u, retain_graph=True)
            u = self._hold(t, ju, u)
        return u


def jacobian_norms(
    source: CellBase | Recurrent,
    x: Tensor,
    *,
    start: int = 0,
    method: str = "exact",
    full_state: bool = False,
    iterations: int = 100,
    tol: float = 1e-8,
    block: int = 4,
    seed: int = 0,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
) -> Tensor:
    """``‖∂h_t/∂h_k‖₂`` for ``k = start`` and every ``t = k … T``, per sequence.

    Args:
        source, x, lengths, mask, state, batch_first, zoneout: as ``step_contributions``.
        start: ``k``, the state index (0 = initial state ``h_0``).
        method: ``"exact"`` (product of the per-step Jacobians, small ``H``) or
            ``"power"`` (power iteration with vector products, large ``H``).
        full_state: LSTM: the norm of the Jacobian of the whole state ``(h, c)``.
        iterations, tol, block, seed: power method: subspace iteration on ``PᵀP`` with
            ``block`` vectors (converges like ``(σ_{block+1}/σ_1)²`` per round, so close
            top singular values do not stall it); at most ``iterations`` rounds per
            ``t``, stopping when the estimate moves less than ``tol`` (relative; at
            least a few units of the dtype's rounding); random start from ``seed``. The
            estimate, ``σ_max(P V)`` for orthonormal ``V``, never exceeds the true norm.

    Returns:
        ``(B, T + 1 − start)``: column ``j`` is ``‖∂h_{k+j}/∂h_k‖₂`` (column 0 is 1).

    >>> from rnnkit import RNNCell
    >>> cell = RNNCell(3, 4)
    >>> x = torch.randn(2, 10, 3)
    >>> exact = jacobian_norms(cell, x)
    >>> power = jacobian_norms(cell, x, method="power")
    >>> bool(torch.allclose(exact, power, rtol=1e-4)), exact.shape
    (True, torch.Size([2, 11]))
    >>> bound = rnn_jacobian_bound(cell, range(11))
    >>> bool((exact <= bound.float() * (1 + 1e-5)).all())
    True
    """
    _check_method(method, iterations, block)
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    return _run_jacobian_norms(
        run, start, method, full_state, iterations=iterations, tol=tol, block=block, seed=seed
    )


def _check_method(method: str, iterations: int = 100, block: int = 4) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    for name, count in (("iterations", iterations), ("block", block)):
        # iterations ≤ 0 returned the random start's estimate, below the true norm
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be a positive integer, got {count!r}")


def _run_jacobian_norms(
    run: DirectionRun,
    start: int,
    method: str,
    full_state: bool = False,
    *,
    iterations: int = 100,
    tol: float = 1e-8,
    block: int = 4,
    seed: int = 0,
) -> Tensor:
    """:func:`jacobian_norms` of a direction already run (``gradient_flow`` shares the
    run with the loss's state gradients)."""
    T, H = run.steps, run.cell.hidden_size
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= T:
        raise ValueError(f"start must be an integer in [0, T] = [0, {T}], got {start!r}")
    s = _flat_states(run)
    B, S = s.shape[1], s.shape[2]
    width = S if full_state else H  # the block measured: h → h, or the whole state
    norms = s.new_ones(B, T + 1 - start)
    if method == "exact":
        J = _run_jacobians(run)  # the same run's steps: the direction runs once
        P = torch.eye(S, dtype=s.dtype, device=s.device).expand(B, S, S)
        for j, t in enumerate(range(start, T), start=1):
            P = J[t] @ P
            norms[:, j] = torch.linalg.matrix_norm(P[:, :width, :width], ord=2)
        return norms
    tol = max(tol, 8 * torch.finfo(s.dtype).eps)
    gen = torch.Generator(device=s.device).manual_seed(seed)
    k = max(1, min(block, width))
    steps = _LinearSteps(run, start, copies=k)
    V = torch.randn(B, width, k, generator=gen, dtype=s.dtype, device=s.device)
    V = torch.linalg.qr(V).Q  # (B, width, k) orthonormal columns

    def apply(V: Tensor, stop: int, transpose: bool = False) -> Tensor:
        f = steps.backward if transpose else steps.forward
        rows = V.permute(2, 0, 1).reshape(k * B, width)  # column i of row b → row i·B + b
        rows = torch.cat([rows, rows.new_zeros(k * B, S - width)], dim=1)
        return f(rows, stop)[:, :width].reshape(k, B, width).permute(1, 2, 0)

    for j, stop in enumerate(range(start + 1, T + 1), start=1):
        sigma = s.new_zeros(B)
        for _ in range(max(1, iterations)):  # warm start: the previous t's subspace
            W = apply(V, stop)  # P V, (B, width, k)
            new_sigma = torch.linalg.matrix_norm(W, ord=2)  # σ_max(P V) ≤ ‖P‖₂
            V = torch.linalg.qr(apply(W, stop, transpose=True)).Q  # PᵀP V, orthonormalised
            done = bool(((new_sigma - sigma).abs() <= tol * new_sigma.clamp_min(1e-300)).all())
            sigma = new_sigma
            if done:
                break
        norms[:, j] = torch.linalg.matrix_norm(apply(V, stop), ord=2)
    return norms


# ---- everything at once, for the report -----------------------------------------------
@dataclass(frozen=True)
class GradientFlow:
    """Gradient flow of one direction over one batch (plain data for plots and reports).

    Attributes:
        state_grad_norms: ``(T + 1,)`` ``‖∂L/∂h_k‖`` over the batch, ``k = 0 … T``.
        jacobian_norms: ``(B, T + 1 − start)`` ``‖∂h_{start+j}/∂h_start‖₂``.
        start: ``k`` of the Jacobians.  weight_norm: ``λ = ‖W_h‖₂`` (all gate blocks).
        real_steps: ``(B, T + 1 − start)`` how many real steps lie between ``h_k`` and
            ``h_{k+j}`` (masked steps hold the state: their Jacobian is the identity, so
            they are no factor of the product).
        bound: ``(B, T + 1 − start)`` ``(γλ)^{real_steps}`` for the simple cell, None for
            LSTM/GRU (the bound is for the simple cell).
    """

    state_grad_norms: Tensor
    jacobian_norms: Tensor
    start: int
    weight_norm: float
    real_steps: Tensor
    bound: Tensor | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists of floats (``None`` for the bound of LSTM/GRU).

        The keys are the arguments of ``plots.plot_gradient_flow``; ``real_steps`` is left
        out (the per-sequence ``bound`` already carries it).
        """
        return {
            "state_grad_norms": self.state_grad_norms.tolist(),
            "jacobian_norms": self.jacobian_norms.tolist(),
            "start": self.start,
            "weight_norm": self.weight_norm,
            "bound": None if self.bound is None else self.bound.tolist(),
        }


def gradient_flow(
    source: CellBase | Recurrent,
    x: Tensor,
    d_outputs: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    start: int = 0,
    method: str | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
    reads_final: bool = False,
) -> GradientFlow:
    """``state_gradient_norms``, ``jacobian_norms`` and the bound in one call.

    ``method`` None picks ``"exact"`` up to a state width of 64, else ``"power"``;
    ``reads_final``: ``loss_fn(outputs, final)`` reads the final state too, as in
    ``step_contributions``.

    >>> from rnnkit import RNNCell
    >>> flow = gradient_flow(RNNCell(2, 3), torch.randn(4, 6, 2), loss_fn=lambda h: h.sum())
    >>> flow.state_grad_norms.shape, flow.jacobian_norms.shape, flow.bound.shape
    (torch.Size([7]), torch.Size([4, 7]), torch.Size([4, 7]))
    """
    cell = direction_cell(source)[0]  # a whole layer: the TypeError naming its directions
    if method is None:
        method = "exact" if cell.hidden_size * (2 if cell.is_lstm else 1) <= 64 else "power"
    _check_method(method)
    # One run of the direction for both: the state gradients' sweep and the Jacobians
    # read the same record (it ran once for each before, the same numbers twice).
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    g = run_state_gradients(run, d_outputs, loss_fn, batch_first, reads_final)[0]
    grads = g.norm(dim=(0, 2) if batch_first else (1, 2))  # as state_gradient_norms
    norms = _run_jacobian_norms(run, start, method)
    counts = real_steps(source, x, start=start, lengths=lengths, mask=mask, batch_first=batch_first)
    bound = rnn_jacobian_bound(cell, counts) if isinstance(cell, RNNCell) else None
    return GradientFlow(grads, norms, start, spectral_norm(cell.weight_hh), counts, bound)
