"""Per-step and per-lag contributions to the weight gradients, from the explicit BPTT.

A shared weight is used at every step, so its gradient is the sum of the gradients of
its per-step copies (the "dummy variables" ``W^(k)`` of Goodfellow et al., *Deep Learning*,
§10.2.2). For step ``k`` (0-based position, ``x[:, k]``; step ``k + 1`` in the 1-based
notation of docs/math.md) the copy's gradient is read off the explicit backward sweep of
``rnnkit.bptt.backward``:

    ∂L/∂W_h^(k) = kernel.recurrent_grads(rows of step k)     (δ_k h_{k-1}ᵀ for the RNN)
    ∂L/∂W_x^(k) = δ_kᵀ x_k          ∂L/∂b^(k) = Σ_rows δ_k

where ``δ_k`` is ``Sweep.d_xp[k]`` (``d_hp`` for the recurrent matrix). The library itself
computes the same sums as one matrix product over all steps (``weight_grads``); here they
are kept apart so that they can be shown, and their sum is the total gradient.

By time lag: the loss at step ``t`` reaches the copy at step ``k ≤ t`` through the path
``h_k → … → h_t``, ``t − k`` transitions long. Sweeping each step's loss separately
(O(T²) steps, fine for diagnostics) splits the gradient by ``lag = t − k``; lag 0 is the
direct term with no Jacobian factor, the long lags are what vanish. Lags are
counted in positions, masked steps included; for a reverse direction, in reading order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor

from rnnkit.bptt.backward import backward_sweep
from rnnkit.bptt.forward import forward_pass
from rnnkit.bptt.record import ForwardRecord
from rnnkit.bptt.regularized import RegularizedKernel
from rnnkit.cells.base import CellBase
from rnnkit.cells.kernel import Kernel, Weights
from rnnkit.layers.masking import flip_sequences, resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState, State

__all__ = ["Contributions", "lag_contributions", "step_contributions"]

PARAMETERS = ("weight_ih", "weight_hh", "bias", "bias_hn")
LossFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Contributions:
    """Gradient contributions of one direction, stacked along a first axis ``K``.

    ``axis`` says what index ``k`` of that axis is: ``"step"`` (the time step whose copy
    of the weights gets the contribution) or ``"lag"`` (``t − k``, the length of the
    dependency). Summing over the axis gives the total gradient, ``total()``.

    Attributes:
        weight_ih: ``(K, G·H, I)``.  weight_hh: ``(K, G·H, H)``.  bias: ``(K, G·H)``.
        bias_hn: ``(K, H)`` for the GRU with ``reset="after"``, else None.
    """

    axis: str
    weight_ih: Tensor
    weight_hh: Tensor
    bias: Tensor
    bias_hn: Tensor | None = None

    def parameters(self) -> dict[str, Tensor]:
        """The contribution tensors by parameter name (``bias_hn`` only where present)."""
        out = {name: getattr(self, name) for name in PARAMETERS}
        return {k: v for k, v in out.items() if v is not None}

    def total(self) -> dict[str, Tensor]:
        """The sum over the axis: the gradient of each parameter."""
        return {name: t.sum(0) for name, t in self.parameters().items()}

    def norms(self) -> dict[str, Tensor]:
        """Frobenius norm of each contribution by ``k``: ``(K,)`` per parameter."""
        return {name: t.flatten(1).norm(dim=1) for name, t in self.parameters().items()}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the axis, the norms by ``k`` and the norm of the total."""
        return {
            "axis": self.axis,
            "norms": {name: n.tolist() for name, n in self.norms().items()},
            "total_norms": {name: float(t.norm()) for name, t in self.total().items()},
        }


class DirectionRun(NamedTuple):
    """One direction run forward with the explicit-BPTT record kept (internal plumbing).

    Everything is time-major and in READING order (reversed within each sequence's extent
    for a reverse direction); ``mask`` (``(T, B)``, original order) and ``reverse`` say how
    to map back with ``to_original``.
    """

    cell: CellBase
    kernel: Kernel
    weights: Weights
    record: ForwardRecord
    mask3: Tensor | None  # (T, B, 1) in reading order, None when every step is real
    mask: Tensor | None  # (T, B) original order
    reverse: bool
    zoneout: float = 0.0  # each step keeps this share of the previous state (evaluation)

    def to_original(self, t: Tensor) -> Tensor:
        """A ``(T, B, ·)`` tensor in reading order → original time order (an involution)."""
        if not self.reverse:
            return t
        return flip_sequences(t, self.mask)[0]

    @property
    def outputs(self) -> Tensor:
        """``(T, B, H)`` outputs in original time order."""
        return self.to_original(self.record.states[0][1:])

    @property
    def steps(self) -> int:
        return self.record.states[0].shape[0] - 1


def _split(source: CellBase | Recurrent) -> tuple[CellBase, bool]:
    if isinstance(source, Recurrent):
        return source.cell, source.reverse
    if isinstance(source, CellBase):
        return source, False
    raise TypeError(
        f"expected a cell (RNNCell, LSTMCell, GRUCell) or one direction of a layer "
        f"(Recurrent), got {type(source).__name__}"
    )


def detached_weights(cell: CellBase) -> Weights:
    """The cell's ``Weights`` detached (they share storage: in-place edits show)."""
    w = cell.weights()
    hn = None if w.bias_hn is None else w.bias_hn.detach()
    return Weights(w.weight_ih.detach(), w.weight_hh.detach(), w.bias.detach(), hn)


def run_direction(
    source: CellBase | Recurrent,
    x: Tensor,
    *,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
) -> DirectionRun:
    """Run one direction forward over ``x`` and keep what the explicit backward needs.

    Args:
        source: a cell, or one direction of a layer (``Recurrent``, possibly reverse).
        x: ``(B, T, I)`` (``(T, B, I)`` with ``batch_first=False``).
        lengths: ``(B,)`` or None.  mask: ``(B, T)`` bool (``(T, B)`` time-major) or None.
        state: initial ``(B, H)`` state (``LSTMState`` for the LSTM), None for zeros.
        zoneout: ``p`` of a layer built with ``zoneout=p``, run as it runs at evaluation:
            every real step ``s_t = p s_{t−1} + (1 − p) s̃_t`` (``c`` too), ``s̃_t`` the
            cell's own step. 0: the cell's step.
    """
    if not 0.0 <= zoneout < 1.0:
        raise ValueError(f"zoneout must be in [0, 1), got {zoneout!r}")
    cell, reverse = _split(source)
    if hasattr(type(cell), "input_part"):
        # its loop reads ν(x W_xᵀ) γ_x, and ∂L/∂W_x passes through the normalisation: the
        # per-step weight shares here (d_xp ⊗ x) would be wrong (was an error from inside
        # the compiled loop, "xp has … elements")
        raise ValueError(
            f"the gradient-flow diagnostics take cells without layer normalisation, got a "
            f"{type(cell).__name__}"
        )
    if x.dim() != 3 or x.shape[2] != cell.input_size:
        layout = "(B, T, I)" if batch_first else "(T, B, I)"
        raise ValueError(
            f"x must have shape {layout} with I = {cell.input_size}, got {tuple(x.shape)}"
        )
    if x.shape[0] == 0 or x.shape[1] == 0:  # was a reshape error from inside torch
        B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
        raise ValueError(f"x holds {B} sequences of {T} steps: give at least one step of one")
    p = cell.weight_ih
    if x.dtype != p.dtype or x.device != p.device:
        raise TypeError(
            f"x is {x.dtype} on {x.device} but the cell's parameters are {p.dtype} on "
            f"{p.device}; convert one of them (e.g. cell.to(x))"
        )
    mask_bt = resolve_mask(x, lengths, mask, batch_first=batch_first)  # (B, T) or None
    xt = x.transpose(0, 1) if batch_first else x  # (T, B, I)
    mask_t = mask_bt.T if mask_bt is not None else None  # (T, B)
    B = xt.shape[1]
    if state is None:
        state = cell.zero_state(B, xt)
    states0 = tuple(s.detach() for s in (state if isinstance(state, LSTMState) else (state,)))
    run_mask = mask_t
    if reverse:
        xt, run_mask = flip_sequences(xt, mask_t)
    mask3 = None
    if run_mask is not None:
        mask3 = run_mask.unsqueeze(-1)  # (T, B, 1)
        xt = torch.where(mask3, xt, 0.0)  # padding may hold anything; it never leaks
        if bool(run_mask.all()):
            mask3 = None
    w = detached_weights(cell)
    kernel = cast(Kernel, cell.kernel)
    if zoneout:
        # the evaluation's constant keep factor, the same for every step: a sweep over a
        # part of the record (sub_record) reads the right factor at any index
        T, H = xt.shape[0], cell.hidden_size
        keep = xt.new_full((1, 1, 1), zoneout).expand(T, B, H)
        n = 2 if cell.is_lstm else 1
        kernel = cast(Kernel, RegularizedKernel(kernel, None, (keep,) * n))
    with torch.no_grad():
        record = forward_pass(kernel, xt.detach(), w, states0, mask3, save=True)
    return DirectionRun(cell, kernel, w, record, mask3, mask_t, reverse, zoneout)


def output_gradient(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    batch_first: bool = True,
) -> Tensor:
    """∂L/∂outputs ``(T, B, H)`` in READING order, from ``d_outputs`` or ``loss_fn``.

    ``loss_fn`` receives the outputs ``(B, T, H)`` (time-major if not ``batch_first``) in
    original time order and returns a scalar.
    """
    if (d_outputs is None) == (loss_fn is None):
        raise ValueError("give exactly one of d_outputs and loss_fn")
    if loss_fn is not None:
        outputs = run.outputs.transpose(0, 1) if batch_first else run.outputs
        outputs = outputs.detach().requires_grad_(True)
        with torch.enable_grad():
            loss = loss_fn(outputs)
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise ValueError("loss_fn must return a scalar tensor")
            (d_outputs,) = torch.autograd.grad(loss, outputs, allow_unused=True)
        if d_outputs is None:
            d_outputs = torch.zeros_like(outputs)
    assert d_outputs is not None
    d_t = d_outputs.transpose(0, 1) if batch_first else d_outputs  # (T, B, H)
    expected = tuple(run.record.states[0][1:].shape)
    if tuple(d_t.shape) != expected:
        raise ValueError(f"d_outputs must match the outputs {expected}, got {tuple(d_t.shape)}")
    return run.to_original(d_t.detach())  # original → reading order (an involution)


def per_step(
    kernel: Kernel,
    record: ForwardRecord,
    d_xp: Tensor,
    d_hp: Tensor,
    to_original: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Contributions of each step of ``record`` (``(n, ·)`` each) for the sweep ``d_xp``.

    ``to_original`` reorders time-major tensors first (a reverse direction's rows)."""
    n, B = d_xp.shape[0], d_xp.shape[1]
    x = record.x.view(n, B, -1)  # (n, B, I)
    h_prev = record.states[0][:-1]  # (n, B, H)
    cache = record.cache
    if to_original is not None:
        d_xp, d_hp, x, h_prev = (to_original(t) for t in (d_xp, d_hp, x, h_prev))
        cache = tuple(to_original(c) for c in cache)
    d_w_ih = torch.einsum("kbg,kbi->kgi", d_xp, x)  # (n, G·H, I)
    d_bias = d_xp.sum(1)  # (n, G·H)
    hh: list[Tensor] = []
    hn: list[Tensor] = []
    for k in range(n):  # the kernel knows what multiplies W_hh (e.g. r ⊙ h for the GRU)
        g_hh, g_hn = kernel.recurrent_grads(d_xp[k], d_hp[k], h_prev[k], tuple(c[k] for c in cache))
        hh.append(g_hh)
        if g_hn is not None:
            hn.append(g_hn)
    d_bias_hn = torch.stack(hn) if hn else None
    return d_w_ih, torch.stack(hh), d_bias, d_bias_hn


def step_contributions(
    source: CellBase | Recurrent,
    x: Tensor,
    d_outputs: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    window: int | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
) -> Contributions:
    """The contribution of each time step to ∂L/∂W_h, ∂L/∂W_x and ∂L/∂b.

    Runs ``forward_pass`` and ONE ``backward_sweep`` (the library's explicit BPTT, exact
    ``window`` truncation included) and splits each weight gradient by step. Masked steps
    contribute exactly zero (the state is held there). For a reverse direction index ``k``
    is still the position ``x[:, k]``.

    Args:
        source: a cell or one direction of a layer (``Recurrent``).
        x: ``(B, T, I)`` input (time-major with ``batch_first=False``).
        d_outputs: ∂L/∂outputs ``(B, T, H)``; or instead
        loss_fn: ``loss_fn(outputs (B, T, H)) -> scalar``.
        lengths / mask: which steps are real (as for layers); state: initial state.
        window: None for full BPTT, τ for BPTT(τ).
        zoneout: ``p`` of a layer built with ``zoneout=p``: its steps as at evaluation
            (:func:`run_direction`).

    Returns:
        ``Contributions(axis="step")`` with ``K = T``.

    >>> from rnnkit import RNNCell
    >>> cell = RNNCell(2, 3)
    >>> c = step_contributions(cell, torch.randn(4, 5, 2), loss_fn=lambda h: h.sum())
    >>> c.weight_hh.shape, c.norms()["weight_hh"].shape
    (torch.Size([5, 3, 3]), torch.Size([5]))
    """
    _check_window(window)
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    return run_step_contributions(run, d_outputs, loss_fn, window, batch_first)


def run_step_contributions(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    window: int | None = None,
    batch_first: bool = True,
) -> Contributions:
    """:func:`step_contributions` of a direction already run (``RecordedRun`` asks one
    run several questions)."""
    d_out = output_gradient(run, d_outputs, loss_fn, batch_first)
    n = len(run.record.states)
    with torch.no_grad():
        sweep = backward_sweep(
            run.kernel, run.record, run.weights, run.mask3, d_out, (None,) * n, window
        )
        parts = per_step(run.kernel, run.record, sweep.d_xp, sweep.d_hp, run.to_original)
    return Contributions("step", *parts)


def _check_window(window: object) -> None:
    """A ``ValueError`` unless ``window`` is None or τ ≥ 1, as the layers take it (0 and
    negative windows gave other or all-zero contributions without a word)."""
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int) or window < 1
    ):
        raise ValueError(f"window must be a positive integer or None, got {window!r}")


def sub_record(record: ForwardRecord, start: int, stop: int) -> ForwardRecord:
    """Steps ``start .. stop − 1`` of a record (states from the one before ``start``)."""
    B = record.states[0].shape[1]
    return ForwardRecord(
        record.x[start * B : stop * B],
        tuple(s[start : stop + 1] for s in record.states),
        tuple(c[start:stop] for c in record.cache),
    )


def lag_contributions(
    source: CellBase | Recurrent,
    x: Tensor,
    d_outputs: Tensor | None = None,
    *,
    loss_fn: LossFn | None = None,
    lengths: Tensor | None = None,
    mask: Tensor | None = None,
    state: State | None = None,
    window: int | None = None,
    batch_first: bool = True,
    zoneout: float = 0.0,
) -> Contributions:
    """How much of each weight gradient comes from dependencies ``lag = t − k`` long.

    The loss at every step ``t`` is swept back on its own (through the steps it reaches:
    all of them, or ``window`` with BPTT(τ)); the copy of the weights at step ``k`` then
    gets the part of the gradient that travelled ``t − k`` transitions. Index ``k`` of the
    result is the lag (0 … T − 1); the lags sum to the same total as
    ``step_contributions``. Arguments as there.

    >>> from rnnkit import RNNCell
    >>> cell = RNNCell(2, 3)
    >>> x = torch.randn(4, 6, 2)
    >>> lags = lag_contributions(cell, x, loss_fn=lambda h: h[:, -1].sum())  # last step only
    >>> bool(lags.bias[0].abs().sum() > 0), lags.bias.shape
    (True, torch.Size([6, 3]))
    """
    _check_window(window)
    run = run_direction(
        source, x, lengths=lengths, mask=mask, state=state, batch_first=batch_first, zoneout=zoneout
    )
    return run_lag_contributions(run, d_outputs, loss_fn, window, batch_first)


def run_lag_contributions(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    window: int | None = None,
    batch_first: bool = True,
) -> Contributions:
    """:func:`lag_contributions` of a direction already run."""
    d_out = output_gradient(run, d_outputs, loss_fn, batch_first)
    kernel, record, T = run.kernel, run.record, run.steps
    n = len(record.states)
    like = record.x
    G, H, I = kernel.gates, record.states[0].shape[2], record.x.shape[1]
    w_ih = like.new_zeros(T, G * H, I)
    w_hh = like.new_zeros(T, G * H, H)
    bias = like.new_zeros(T, G * H)
    bias_hn = like.new_zeros(T, H) if run.weights.bias_hn is not None else None
    with torch.no_grad():
        for t in range(T):
            if not bool(d_out[t].any()):
                continue
            start = 0 if window is None else max(0, t - window)  # steps t − τ … t
            sub = sub_record(record, start, t + 1)
            d_sub = torch.zeros_like(d_out[start : t + 1])
            d_sub[-1] = d_out[t]
            mask3 = None if run.mask3 is None else run.mask3[start : t + 1]
            sweep = backward_sweep(kernel, sub, run.weights, mask3, d_sub, (None,) * n)
            parts = per_step(kernel, sub, sweep.d_xp, sweep.d_hp)
            m = t + 1 - start  # lags 0 .. m − 1, step k = t − lag
            w_ih[:m] += parts[0].flip(0)
            w_hh[:m] += parts[1].flip(0)
            bias[:m] += parts[2].flip(0)
            if bias_hn is not None and parts[3] is not None:
                bias_hn[:m] += parts[3].flip(0)
    return Contributions("lag", w_ih, w_hh, bias, bias_hn)
