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

A layer-normalised cell (``rnnkit.cells.layer_norm``) reads ``ν(W_x x_k) ⊙ γ_x`` where a
plain cell reads ``W_x x_k``, so its input weights' shares pass through the normalisation
(``n_k = ν(v_k)``, ``v_k = W_x x_k``, ``s_k`` its scale):

    ∂L/∂v_k = s_k (δ_k γ_x − mean(δ_k γ_x) − n_k ⊙ mean(δ_k γ_x ⊙ n_k))
    ∂L/∂W_x^(k) = (∂L/∂v_k)ᵀ x_k      ∂L/∂γ_x^(k) = Σ_rows δ_k ⊙ n_k

and its other gains (``γ_h``, ``γ_c``, ``β_c`` / ``b_hn``) have per-step shares of their
own, read off the kernel's ``recurrent_grads`` like ``W_h``'s.

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
from rnnkit.cells.normalization import normalize, normalize_backward
from rnnkit.layers.masking import flip_sequences, resolve_mask
from rnnkit.layers.recurrent import Recurrent
from rnnkit.types import LSTMState, State

__all__ = ["Contributions", "direction_cell", "lag_contributions", "step_contributions"]

# the cells' parameter names (a layer-normalised cell's gains last)
PARAMETERS = (
    *("weight_ih", "weight_hh", "bias", "bias_hn"),
    *("gamma_ih", "gamma_hh", "gamma_c", "beta_c"),
)
#: ``loss_fn(outputs)``, or ``loss_fn(outputs, final)`` with ``reads_final``
LossFn = Callable[..., Tensor]


@dataclass(frozen=True)
class Contributions:
    """Gradient contributions of one direction, stacked along a first axis ``K``.

    ``axis`` says what index ``k`` of that axis is: ``"step"`` (the time step whose copy
    of the weights gets the contribution) or ``"lag"`` (``t − k``, the length of the
    dependency). Summing over the axis gives the total gradient, ``total()``.

    Each field is named after the cell's parameter and has its shape after ``K``: the
    gradient of ``cell.<name>`` is ``total()[name]``.

    Attributes:
        weight_ih: ``(K, G·H, I)``.  weight_hh: ``(K, G·H, H)``.  bias: ``(K, G·H)``.
        bias_hn: ``(K, H)`` for the GRU with ``reset="after"``, else None.
        gamma_ih, gamma_hh: ``(K, G·H)``, the gains of a layer-normalised cell, else None.
        gamma_c, beta_c: ``(K, H)``, the layer-normalised LSTM's cell-state gain and shift.
    """

    axis: str
    weight_ih: Tensor
    weight_hh: Tensor
    bias: Tensor
    bias_hn: Tensor | None = None
    gamma_ih: Tensor | None = None
    gamma_hh: Tensor | None = None
    gamma_c: Tensor | None = None
    beta_c: Tensor | None = None

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
    to map back with ``to_original``. ``inputs`` is what the cell reads at each step;
    ``record.x`` what the time loop reads: the same rows, except for a layer-normalised
    cell, whose loop reads its input part ``ν(x W_xᵀ) γ_x``.
    """

    cell: CellBase
    kernel: Kernel
    weights: Weights
    record: ForwardRecord
    mask3: Tensor | None  # (T, B, 1) in reading order, None when every step is real
    mask: Tensor | None  # (T, B) original order
    reverse: bool
    inputs: Tensor  # (T, B, I) in reading order, zero at masked steps
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


def direction_cell(source: CellBase | Recurrent) -> tuple[CellBase, bool]:
    """The cell of a diagnostics ``source`` and whether it runs in reverse; any other
    module is a ``TypeError`` saying which part of it to give.

    >>> from rnnkit import LSTM
    >>> try:
    ...     direction_cell(LSTM(2, 3, bidirectional=True).layers[0])
    ... except TypeError as exc:
    ...     print(str(exc).split(": ", 1)[1])
    give one of its directions, .directions[0] (forward) or .directions[1] (reverse)
    """
    if isinstance(source, Recurrent):
        return source.cell, source.reverse
    if isinstance(source, CellBase):
        return source, False
    from rnnkit.layers.stacked import Bidirectional, StackedRecurrent

    hint = ""
    if isinstance(source, Bidirectional):
        hint = ": give one of its directions, .directions[0] (forward) or .directions[1] (reverse)"
    elif isinstance(source, StackedRecurrent):
        hint = (
            ": give one direction of one of its layers, .layers[i] "
            "(.layers[i].directions[k] where it is bidirectional)"
        )
    raise TypeError(
        f"expected a cell (RNNCell, LSTMCell, GRUCell) or one direction of a layer "
        f"(Recurrent), got {type(source).__name__}{hint}"
    )


def layer_normalised(cell: CellBase) -> bool:
    """Whether the cell's loop reads its input part (``input_part``) rather than ``x``."""
    return hasattr(type(cell), "input_part")


class _PyTorchLoop:
    """A kernel without its compiled loop (``native_*``), so that the forward and the sweeps
    run the PyTorch loop: everything else is the kernel's."""

    def __init__(self, inner: Kernel) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("native_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


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
    cell, reverse = direction_cell(source)
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
    inputs = xt.detach()
    if layer_normalised(cell):
        # the loop reads the input part; the PyTorch loop's sweep, whose recurrent
        # gradients are per step (the compiled loop sums the gains' inside)
        with torch.no_grad():
            xt = cast(Any, cell).input_part(inputs)
        kernel = cast(Kernel, _PyTorchLoop(kernel))
    if zoneout:
        # the evaluation's constant keep factor, the same for every step: a sweep over a
        # part of the record (sub_record) reads the right factor at any index
        T, H = xt.shape[0], cell.hidden_size
        keep = xt.new_full((1, 1, 1), zoneout).expand(T, B, H)
        n = 2 if cell.is_lstm else 1
        kernel = cast(Kernel, RegularizedKernel(kernel, None, (keep,) * n))
    with torch.no_grad():
        record = forward_pass(kernel, xt.detach(), w, states0, mask3, save=True)
    return DirectionRun(cell, kernel, w, record, mask3, mask_t, reverse, inputs, zoneout)


def output_gradient(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    batch_first: bool = True,
    reads_final: bool = False,
) -> tuple[Tensor, tuple[Tensor | None, ...]]:
    """∂L/∂outputs ``(T, B, H)`` in READING order, from ``d_outputs`` or ``loss_fn``; and
    ∂L/∂(final state), one per state (None where the loss does not read it).

    ``loss_fn`` receives the outputs ``(B, T, H)`` (time-major if not ``batch_first``) in
    original time order and returns a scalar; with ``reads_final`` it receives the
    direction's final state too, ``loss_fn(outputs, final)``: ``(B, H)`` (an
    ``LSTMState`` for the LSTM), each sequence's state after its last real step (a
    reverse direction's after position 0), as the layer returns it.
    """
    n = len(run.record.states)
    if (d_outputs is None) == (loss_fn is None):
        raise ValueError("give exactly one of d_outputs and loss_fn")
    if reads_final and loss_fn is None:
        raise ValueError("reads_final=True takes loss_fn (the loss of the outputs and state)")
    d_finals: tuple[Tensor | None, ...] = (None,) * n
    if loss_fn is not None:
        outputs = run.outputs.transpose(0, 1) if batch_first else run.outputs
        outputs = outputs.detach().requires_grad_(True)
        # held through the padding: the last row of the record is each sequence's final
        finals = [s[-1].detach().requires_grad_(True) for s in run.record.states]
        with torch.enable_grad():
            if reads_final:
                loss = loss_fn(outputs, LSTMState(*finals) if n == 2 else finals[0])
            else:
                loss = loss_fn(outputs)
            if not isinstance(loss, Tensor) or loss.numel() != 1:
                raise ValueError("loss_fn must return a scalar tensor")
            wrt = [outputs, *finals] if reads_final else [outputs]
            grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        d_outputs = grads[0] if grads[0] is not None else torch.zeros_like(outputs)
        if reads_final:
            d_finals = tuple(None if g is None else g.detach() for g in grads[1:])
    assert d_outputs is not None
    d_t = d_outputs.transpose(0, 1) if batch_first else d_outputs  # (T, B, H)
    expected = tuple(run.record.states[0][1:].shape)
    if tuple(d_t.shape) != expected:
        raise ValueError(f"d_outputs must match the outputs {expected}, got {tuple(d_t.shape)}")
    return run.to_original(d_t.detach()), d_finals  # original → reading order (an involution)


def per_step(
    run: DirectionRun,
    record: ForwardRecord,
    x: Tensor,
    d_xp: Tensor,
    d_hp: Tensor,
    to_original: Callable[[Tensor], Tensor] | None = None,
) -> dict[str, Tensor]:
    """Contributions of each step of ``record`` (``(n, ·)`` each, by parameter name) for
    the sweep ``d_xp``; ``x (n, B, I)`` the cell's inputs of those steps.

    ``to_original`` reorders time-major tensors first (a reverse direction's rows)."""
    cell, kernel = run.cell, run.kernel
    h_prev = record.states[0][:-1]  # (n, B, H)
    cache = record.cache
    if to_original is not None:
        d_xp, d_hp, x, h_prev = (to_original(t) for t in (d_xp, d_hp, x, h_prev))
        cache = tuple(to_original(c) for c in cache)
    out: dict[str, Tensor] = {}
    if layer_normalised(cell):  # through ν (module docstring)
        gain = cast(Tensor, cell.gamma_ih).detach()
        n_x, inv = normalize(x @ run.weights.weight_ih.T)  # (n, B, G·H), (n, B, 1)
        d_v = normalize_backward(d_xp * gain, n_x, inv)
        out["weight_ih"] = torch.einsum("kbg,kbi->kgi", d_v, x)
        out["gamma_ih"] = (d_xp * n_x).sum(1)
    else:
        out["weight_ih"] = torch.einsum("kbg,kbi->kgi", d_xp, x)  # (n, G·H, I)
    out["bias"] = d_xp.sum(1)  # (n, G·H)
    hh: list[Tensor] = []
    hn: list[Tensor] = []
    for k in range(d_xp.shape[0]):  # the kernel knows what multiplies W_hh (r ⊙ h: GRU)
        g_hh, g_hn = kernel.recurrent_grads(d_xp[k], d_hp[k], h_prev[k], tuple(c[k] for c in cache))
        hh.append(g_hh)
        if g_hn is not None:
            hn.append(g_hn)
    out["weight_hh"] = torch.stack(hh)
    if hn:
        extra = torch.stack(hn)  # b_hn, or a layer-normalised cell's gains in loop order
        names = getattr(cell, "loop_gains", ("bias_hn",))
        sizes = [getattr(cell, name).numel() for name in names]
        out.update(zip(names, extra.split(sizes, dim=1), strict=True))
    return out


def _shapes(run: DirectionRun) -> dict[str, torch.Size]:
    """The shape of each parameter :func:`per_step` gives a share of, by name."""
    cell, w = run.cell, run.weights
    shapes = {"weight_ih": w.weight_ih.shape, "weight_hh": w.weight_hh.shape, "bias": w.bias.shape}
    if layer_normalised(cell):
        shapes["gamma_ih"] = cast(Tensor, cell.gamma_ih).shape
    if w.bias_hn is not None:
        for name in getattr(cell, "loop_gains", ("bias_hn",)):
            shapes[name] = getattr(cell, name).shape
    return shapes


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
    reads_final: bool = False,
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
        reads_final: ``loss_fn(outputs, final)`` also reads the direction's final state
            (a classifier of the last state, a decoder started from it:
            :func:`output_gradient`).

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
    return run_step_contributions(run, d_outputs, loss_fn, window, batch_first, reads_final)


def run_step_contributions(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    window: int | None = None,
    batch_first: bool = True,
    reads_final: bool = False,
) -> Contributions:
    """:func:`step_contributions` of a direction already run (``RecordedRun`` asks one
    run several questions)."""
    d_out, d_finals = output_gradient(run, d_outputs, loss_fn, batch_first, reads_final)
    with torch.no_grad():
        sweep = backward_sweep(
            run.kernel, run.record, run.weights, run.mask3, d_out, d_finals, window
        )
        parts = per_step(run, run.record, run.inputs, sweep.d_xp, sweep.d_hp, run.to_original)
    return Contributions("step", **parts)


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
    reads_final: bool = False,
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
    return run_lag_contributions(run, d_outputs, loss_fn, window, batch_first, reads_final)


def run_lag_contributions(
    run: DirectionRun,
    d_outputs: Tensor | None,
    loss_fn: LossFn | None,
    window: int | None = None,
    batch_first: bool = True,
    reads_final: bool = False,
) -> Contributions:
    """:func:`lag_contributions` of a direction already run."""
    d_out, d_finals = output_gradient(run, d_outputs, loss_fn, batch_first, reads_final)
    kernel, record, T = run.kernel, run.record, run.steps
    n = len(record.states)
    like = run.inputs
    # by parameter: (T, *its shape), filled lag by lag
    acc = {name: like.new_zeros(T, *shape) for name, shape in _shapes(run).items()}
    none: tuple[Tensor | None, ...] = (None,) * n
    with torch.no_grad():
        for t in range(T):
            # the final state is read after the last step: a loss at step T − 1 of its own
            at_end = d_finals if t == T - 1 else none
            if not bool(d_out[t].any()) and all(d is None for d in at_end):
                continue
            start = 0 if window is None else max(0, t - window)  # steps t − τ … t
            sub = sub_record(record, start, t + 1)
            d_sub = torch.zeros_like(d_out[start : t + 1])
            d_sub[-1] = d_out[t]
            mask3 = None if run.mask3 is None else run.mask3[start : t + 1]
            sweep = backward_sweep(kernel, sub, run.weights, mask3, d_sub, at_end)
            parts = per_step(run, sub, run.inputs[start : t + 1], sweep.d_xp, sweep.d_hp)
            m = t + 1 - start  # lags 0 .. m − 1, step k = t − lag
            for name, part in parts.items():
                acc[name][:m] += part.flip(0)
    return Contributions("lag", **acc)
