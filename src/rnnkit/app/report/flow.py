"""The report's gradient-flow section, for any model that reads its input through a
recurrent stack: ‖∂L/∂h_k‖ and ‖∂h_t/∂h_k‖₂ of the first layer (its forward direction
where it has two) against the bound (γλ)^{t−k}, the per-step and per-lag contributions to
∂L/∂W_hh beside the model's own backward pass, and gate saturation.

The diagnostics (``rnnkit.diagnostics.RecordedRun``) run that direction explicitly and
need the model's loss as a function of its outputs ``h``: here the layers above it run
on ``h`` (a bidirectional layer's backward half beside it, as the model computes it), and
the task's :class:`FlowBatch` turns the stack's top outputs into its loss. A task whose
model reads its stack only as ``encoder(x, mask=mask)`` gets that loss from the model's
own code, through a stand-in for the stack (:func:`replaying`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from rnnkit.app.report.html import esc, image, note, section, table
from rnnkit.diagnostics import RecordedRun, plots
from rnnkit.layers.recurrent import Recurrent
from rnnkit.layers.stacked import Bidirectional, stack_states
from rnnkit.types import LSTMState, RecurrentOutput, State

__all__ = ["FlowBatch", "flow_section", "replaying"]

#: ``loss(top, rows, steps)``: the model's loss on the batch's first ``rows`` rows and
#: ``steps`` steps from what the stack returns, ``top`` (a ``RecurrentOutput``: the top
#: outputs ``(rows, steps, D·H)`` and every layer's final state)
TopLoss = Callable[[RecurrentOutput, int, int], Tensor]
#: the steps over which ‖∂h_t/∂h_0‖₂ is drawn (its power method costs O(T²) products)
JACOBIAN_STEPS = 32
# The widest state whose Jacobian norms are exact (the per-step Jacobians multiplied out),
# power iteration's estimate above: exact is also the faster up to here (4 × 32 steps on 2
# CPU threads: 0.44 s against 2.3 s for 10 rounds at 256 wide, 2.1 s against 3.0 s at 512)
EXACT_WIDTH = 512


@dataclass(frozen=True)
class FlowBatch:
    """What the section draws: a model and one batch of a task.

    Attributes:
        model: in ``eval()`` mode, its stack ``model.encoder`` batch-first.
        x: ``(B, T, I)`` what the stack reads (embedded; no dropout).
        mask: ``(B, T)`` bool, True at real steps; None where every step is real.
        loss: the loss from the stack's top outputs (:data:`TopLoss`).
        reference: the model's own loss on the whole batch, run by the model itself (its
            backward pass is what the bars must add up to).
        what: the batch in words ("8 sentences from valid.tsv").
        last_loss: the loss of the last step alone, where the loss is a sum over steps
            (a language model); None otherwise.
        short_steps: the steps of the short run (the lags) where the loss may be cut
            there (a sum over steps); None: every step (a loss that reads the whole
            sequence, as a classifier's).
        state: the stack's initial state ``(L, D, B, H)`` (an ``LSTMState`` of them) as
            the model starts it (a class-conditional language model's); None: zeros.
    """

    model: Any  # an nn.Module with an ``encoder`` (a StackedRecurrent)
    x: Tensor
    mask: Tensor | None
    loss: TopLoss
    reference: Callable[[], Tensor]
    what: str
    last_loss: TopLoss | None = None
    short_steps: int | None = None
    state: State | None = None


@contextmanager
def replaying(model: Any, out: RecurrentOutput) -> Iterator[None]:
    """Inside the block ``model.encoder(...)`` returns ``out``, the stack's outputs and
    final state computed elsewhere: a model's own loss becomes a function of them."""
    encoder = model.encoder
    model.encoder = _Replay(out, encoder)
    try:
        yield
    finally:
        model.encoder = encoder


class _Replay(nn.Module):
    """Returns ``out`` when called; any other attribute is the stack's own (its sizes,
    ``is_lstm``: what a model reads of its stack besides calling it)."""

    def __init__(self, out: RecurrentOutput, stack: nn.Module) -> None:
        super().__init__()
        self.out = out
        object.__setattr__(self, "stack", stack)  # not a submodule: no parameters here

    def forward(self, *args: Any, **kwargs: Any) -> RecurrentOutput:
        return self.out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            stack = self.__dict__.get("stack")  # absent while nn.Module sets itself up
            if stack is None:
                raise
            return getattr(stack, name)


def _layer_masks(encoder: Any, masks: Any) -> list[Any]:
    """The cell masks of each layer as its ``forward`` takes them: a bidirectional layer's
    ``D`` of them, a layer of one direction its one (the stack's own split)."""
    if masks is None:
        return [None] * len(encoder.layers)
    D = encoder.num_directions
    return [
        masks.cells[i * D] if D == 1 else list(masks.cells[i * D : (i + 1) * D])
        for i in range(len(encoder.layers))
    ]


def flow_section(fb: FlowBatch) -> tuple[str, str, str]:
    """The section: the flow figure against its bound, the per-step and per-lag
    contributions to ∂L/∂W_hh, a table of the figures and the gate saturation."""
    encoder = fb.model.encoder
    first = encoder.layers[0]
    direction: Recurrent
    if isinstance(first, Recurrent):
        direction = first
    elif isinstance(first, Bidirectional):
        direction = cast(Recurrent, first.directions[0])
    else:
        return section(
            "gradients",
            "Gradient flow through time",
            note(f"Gradient-flow pictures are not drawn for a {type(first).__name__} layer."),
        )
    zoneout = float(getattr(encoder, "zoneout", 0.0) or 0.0)
    x, mask = fb.x, fb.mask
    B, T = x.shape[0], x.shape[1]
    xt = x.transpose(0, 1)  # (T, B, I)
    # zoneout's constant keep factors, as the model runs at evaluation (drawn in eval mode)
    layer_masks = _layer_masks(encoder, encoder.draw_masks(B, T, x) if zoneout else None)
    # every layer's and direction's initial state [l][d], (B, H) each, or None (zeros)
    init = encoder.split_state(fb.state)

    def start(index: int, rows: int) -> Any:
        """Layer ``index``'s initial state(s) for the first ``rows`` rows, as it takes
        them (a bidirectional layer: one a direction)."""
        if init is None:
            return None
        parts = [_rows(s, rows) for s in init[index]]
        return parts if isinstance(encoder.layers[index], Bidirectional) else parts[0]

    def top_of(h: Tensor, final: Any, rows: int, steps: int) -> RecurrentOutput:
        """The drawn direction's outputs ``(rows, steps, H)`` and final state → what the
        stack returns: its top outputs and every layer's final state."""
        z = h.transpose(0, 1)  # (steps, rows, H)
        m = None if mask is None else mask[:rows, :steps].T
        finals = [[final]]
        if direction is not first:  # the backward half, as the layer computes it
            with torch.no_grad():
                masks = _part(layer_masks[0], rows, steps)
                both, (_, back) = first(
                    xt[:steps, :rows], m, start(0, rows), masks=masks, time_major=True
                )
            z = torch.cat([z, both[..., direction.cell.hidden_size :]], dim=-1)
            finals[0].append(back)
        for index, (layer, cells) in enumerate(
            zip(encoder.layers[1:], layer_masks[1:], strict=True), start=1
        ):
            both_ways = isinstance(layer, Bidirectional)  # time-major as the stack runs it
            layout = {"time_major": True} if both_ways else {}
            z, last = layer(z, m, start(index, rows), masks=_part(cells, rows, steps), **layout)
            finals.append(list(last) if both_ways else [last])
        return RecurrentOutput(z.transpose(0, 1), stack_states(finals, direction.cell.is_lstm))

    def loss_of(loss: TopLoss, rows: int, steps: int) -> Callable[[Tensor, Any], Tensor]:
        return lambda h, final: loss(top_of(h, final, rows, steps), rows, steps)

    # One run of the direction over the batch answers the state gradients and the per-step
    # contributions; one over its first 4 rows (and short_steps), the lags; the Jacobians
    # (which need no loss) over at most 32 steps of those, the same run where it is one.
    Bs, Ts, Tj = min(B, 4), min(T, fb.short_steps or T), min(T, JACOBIAN_STEPS)
    s0 = None if init is None else init[0][0]  # the drawn direction's initial state
    recorded = RecordedRun(direction, x, mask=mask, state=s0, zoneout=zoneout)

    def first_part(steps: int) -> RecordedRun:
        part = None if mask is None else mask[:Bs, :steps]
        own = None if s0 is None else _rows(s0, Bs)
        return RecordedRun(direction, x[:Bs, :steps], mask=part, state=own, zoneout=zoneout)

    short = first_part(Ts)
    jacobians = short if Tj == Ts else first_part(Tj)
    what = r"mean of $\ell_t$ over all steps" if fb.last_loss is not None else "the model's loss"
    norms = recorded.state_gradient_norms(loss_fn=loss_of(fb.loss, B, T), reads_final=True)
    lines = {f"$L$ = {what}": norms.cpu().numpy()}
    if fb.last_loss is not None:
        lines[r"$\ell_T$ only (the last step's loss)"] = (
            recorded.state_gradient_norms(loss_fn=loss_of(fb.last_loss, B, T), reads_final=True)
            .cpu()
            .numpy()
        )
    names = f"{type(direction.cell).__name__}, H = {direction.cell.hidden_size}"
    through = f"the first layer ({names})"
    if direction is not first:
        through = f"the first layer's forward direction ({names})"
    body, figures = _flow_figure(fb.what, through, direction.cell, jacobians, lines)
    if zoneout:
        body = (
            note(
                f"This model was trained with zoneout (p = {zoneout:g}): at evaluation each "
                f"step keeps {zoneout:g} of the previous state, h_t = p h_(t−1) + (1 − p) h̃_t, "
                "so its step Jacobian is p I + (1 − p) J. The figures below are those of "
                "these steps, as the model runs at evaluation."
            )
            + body
        )
    steps = recorded.step_contributions(loss_fn=loss_of(fb.loss, B, T), reads_final=True)
    lags = short.lag_contributions(loss_fn=loss_of(fb.loss, Bs, Ts), reads_final=True)
    contributions, total = _contribution_figures(steps, lags, short.shape)
    reference = _reference_norm(fb, direction.cell)
    body += contributions
    body += _figures_table(figures, total, reference)
    body += _saturation_table(encoder, x, mask)
    return section("gradients", "Gradient flow through time", body)


def _rows(state: State, rows: int) -> State:
    """An initial state ``(B, H)`` (an ``LSTMState`` of them) of the first ``rows`` rows."""
    if isinstance(state, LSTMState):
        return LSTMState(state.h[:rows], state.c[:rows])
    return state[:rows]


def _part(masks: Any, rows: int, steps: int) -> Any:
    """Cell masks for the first ``rows`` rows and ``steps`` steps (zoneout's keep factors
    are ``(T, B, H)``)."""
    if masks is None:
        return None
    if isinstance(masks, list):
        return [_part(m, rows, steps) for m in masks]
    keep = None if masks.keep is None else tuple(k[:steps, :rows] for k in masks.keep)
    return masks._replace(keep=keep)


def _reference_norm(fb: FlowBatch, cell: Any) -> float:
    """‖∂L/∂W_hh‖ of the drawn cell from the model's own backward pass."""
    fb.model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        fb.reference().backward()
    grad = cell.weight_hh.grad
    assert grad is not None  # the backward just ran through this cell
    fb.model.zero_grad(set_to_none=True)
    return float(grad.norm())


def _flow_figure(
    what: str, through: str, cell: Any, short: RecordedRun, lines: dict[str, np.ndarray]
) -> tuple[str, dict[str, Any]]:
    """The figure of ‖∂L/∂h_k‖ (``lines``) and ‖∂h_t/∂h_0‖₂ (on ``short``) against the
    bound (γλ)^(t−k), with its text; and ``{lam, gamma, g_last}`` for the table."""
    from rnnkit.cells.rnn import RNNCell
    from rnnkit.diagnostics import activation_gain, rnn_jacobian_bound, spectral_norm

    lam = spectral_norm(cell.weight_hh)
    rnn = cell if isinstance(cell, RNNCell) else None  # the bound is for the simple cell
    simple = rnn is not None
    gamma = activation_gain(rnn.nonlinearity) if rnn is not None else None
    g_last = list(lines.values())[-1] if len(lines) > 1 else None
    T = len(next(iter(lines.values()))) - 1
    # ‖∂ℓ_T/∂h_k‖ ≤ ‖∂ℓ_T/∂h_T‖ (γλ)^{T−k}: the bound on the last step's gradient.
    last_bound = None
    if gamma is not None and g_last is not None:
        last_bound = g_last[-1] * (gamma * lam) ** np.arange(T, -1, -1.0)
    Bj, Tj = short.shape
    width = cell.hidden_size * (2 if cell.is_lstm else 1)
    method = "exact" if width <= EXACT_WIDTH else "power"
    J = short.jacobian_norms(method=method, iterations=10).cpu().numpy()
    bound = rnn_jacobian_bound(rnn, range(Tj + 1)).cpu().numpy() if rnn is not None else None
    body = (
        f"<p>On {esc(what)}, through {esc(through)}. "
        "∂h_t/∂h_k = Π diag(φ′(a_j)) W_h, so ‖∂h_t/∂h_k‖₂ ≤ (γλ)^(t−k) with λ = ‖W_h‖₂ "
        "and γ = 1 for tanh, ¼ for the logistic (the bound is for the simple cell).</p>"
    )
    flow = plots.plot_gradient_flow(lines, J, bound, weight_norm=lam, state_grad_bound=last_bound)
    body += image(
        flow,
        "gradient norm through time and Jacobian norms against the bound",
        "Left: ‖∂L/∂h_k‖ for every state of the first layer (log scale)"
        + (
            ", dashed: its bound ‖∂ℓ_T/∂h_T‖ (γλ)^(T−k) for the last step's loss"
            if last_bound is not None
            else ""
        )
        + ". Right: "
        f"‖∂h_t/∂h_0‖₂ over the first {Tj} steps of {Bj} rows "
        f"({'exact' if method == 'exact' else 'power-iteration estimate'})"
        + (
            ", dashed: the bound (γλ)^(t−k)."
            if simple
            else "; the (γλ)^(t−k) bound is for the simple cell only."
        ),
    )
    return body, {"lam": lam, "gamma": gamma, "g_last": g_last}


def _contribution_figures(steps: Any, lags: Any, short_shape: tuple[int, int]) -> tuple[str, float]:
    """The per-step and per-lag contributions to ∂L/∂W_hh of the drawn direction, and
    their sum."""
    values, total = plots.projected_contributions(steps.weight_hh)
    body = image(
        plots.plot_contributions(values, total=total),
        "per-step contributions to the gradient of the recurrent weight",
        "Each bar is step k's copy of W_hh: its contribution C_k = ∂L/∂W_hh^(k) "
        "projected on the direction of the total gradient G = Σ_k C_k, so the "
        "bars add up to ‖G‖ (the dark bar). Red bars pull against the update.",
    )
    Bl, Tl = short_shape
    lag_values, lag_total = plots.projected_contributions(lags.weight_hh)
    body += image(
        plots.plot_contributions(lag_values, total=lag_total, axis="lag"),
        "contributions to the gradient of the recurrent weight by time lag",
        f"The same gradient split by how far it travelled (lag t − k, on {Bl} "
        f"rows of {Tl} steps): long lags are what vanish.",
    )
    return body, total


def _figures_table(figures: dict[str, Any], total: float, reference: float) -> str:
    lam, gamma, g_last = figures["lam"], figures["gamma"], figures["g_last"]
    rows: list[list[Any]] = [
        ["λ = ‖W_hh‖₂ (first layer)", lam],
        ["‖∂L/∂W_hh‖: sum of the bars", total],
        ["‖∂L/∂W_hh‖: backward pass of the model", reference],
    ]
    if g_last is not None:
        rows.append(
            [
                "‖∂ℓ_T/∂h_0‖ / ‖∂ℓ_T/∂h_T‖ (how much of the last loss reaches the start)",
                float(g_last[0] / g_last[-1]) if g_last[-1] > 0 else None,
            ]
        )
    if gamma is not None:
        rows += [
            ["γ (activation)", gamma],
            ["γλ", gamma * lam],
            ["bound after 20 steps (γλ)^20", (gamma * lam) ** 20],
        ]
    return table(rows)


def _saturation_table(encoder: Any, x: Tensor, mask: Tensor | None) -> str:
    from rnnkit.diagnostics import layer_statistics

    stats = layer_statistics(encoder, x, mask=mask)
    gates = sorted({g for st in stats.values() for g in st.saturation})
    srows = [
        [name, *(st.saturation.get(g) for g in gates), st.state_norm, st.cell_norm]
        for name, st in stats.items()
    ]
    body = "<p>Gate saturation (share of values within 0.02 of 0 or 1) and state norms:</p>"
    return body + table(
        srows, ["layer", *(f"{g} saturated" for g in gates), "mean ‖h_t‖", "mean ‖c_t‖"]
    )
