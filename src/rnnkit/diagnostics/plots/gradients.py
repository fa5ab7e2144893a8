"""Gradient flow through time: ‖∂L/∂h_k‖ and ‖∂h_t/∂h_k‖ against the bound
(:func:`plot_gradient_flow`), and each step's or time lag's share of ∂L/∂W
(:func:`projected_contributions`, :func:`plot_contributions`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from rnnkit.diagnostics.plots.base import (
    _array,
    _figure,
    _focus,
    _log_axis,
    _positive,
)

__all__ = ["plot_contributions", "plot_gradient_flow", "projected_contributions"]


def plot_gradient_flow(
    state_grad_norms: Any,
    jacobian_norms: Any = None,
    bound: Any = None,
    *,
    start: int = 0,
    weight_norm: float | None = None,
    state_grad_bound: Any = None,
    title: str = "Gradient through time",
    width: float = 10.0,
    height: float = 4.0,
) -> Figure:
    """‖∂L/∂h_k‖ for every state, and ‖∂h_t/∂h_k‖₂ against the bound (γλ)^{t−k}; log scale.

    The argument names are the keys of ``GradientFlow.to_dict()``, so
    ``plot_gradient_flow(**gradient_flow(...).to_dict())`` draws a ``GradientFlow``.

    Args:
        state_grad_norms: ``(T + 1,)`` ‖∂L/∂h_k‖ for ``k = 0 … T`` (``h_0`` the initial
            state); or a mapping ``label → (T + 1,)`` to compare losses (e.g. the loss at
            every step against the loss at the last step only).
        jacobian_norms: ``(B, n)`` or ``(n,)`` ‖∂h_{k+j}/∂h_k‖₂ for ``j = 0 … n − 1``, or
            None for the left panel only. Several sequences are drawn as median and range.
        bound: ``(n,)`` ``(γλ)^j`` (simple cell), or ``(B, n)`` per sequence (masked
            steps are no factor, so sequences with holes have their own bound: the
            loosest one is drawn, which every sequence's norm is below), or None.
        start: ``k`` of the Jacobians.  weight_norm: ``λ = ‖W_h‖₂`` for the legend.
        state_grad_bound: ``(T + 1,)`` a bound on the left panel's norms (dashed), e.g.
            ``‖∂ℓ_T/∂h_T‖ (γλ)^{T−k}`` for the loss at the last step only.

    The vertical range follows the measured values: a bound far above them leaves the
    top of the panel (itself a finding: the bound is loose there).

    >>> import numpy as np
    >>> fig = plot_gradient_flow(np.geomspace(1e-6, 1, 11), np.geomspace(1, 1e-3, 11)[None],
    ...                          0.9 ** np.arange(11), weight_norm=0.9)
    >>> [ax.get_yscale() for ax in fig.axes]
    ['log', 'log']
    """
    series = state_grad_norms if isinstance(state_grad_norms, Mapping) else {"": state_grad_norms}
    lines = {label: _positive(_array(v, "state_grad_norms", 1)) for label, v in series.items()}
    panels = 1 if jacobian_norms is None else 2
    fig = _figure(width if panels == 2 else width / 1.7, height)
    fig.suptitle(title)
    ax = fig.add_subplot(1, panels, 1)
    for label, values in lines.items():
        ax.plot(
            np.arange(values.size),
            values,
            marker="." if values.size <= 40 else None,
            label=label or None,
        )
    if state_grad_bound is not None:
        b = _positive(_array(state_grad_bound, "state_grad_bound", 1))
        ax.plot(np.arange(b.size), b, "k--", lw=1.2, label="bound")
    _log_axis(ax, *lines.values())
    _focus(ax, *lines.values())
    ax.set_xlabel("state index k (0 = initial state)")
    ax.set_ylabel(r"$\|\partial L/\partial h_k\|_2$ (whole batch)")
    ax.set_title("gradient reaching each state", fontsize=10)
    ax.grid(True, alpha=0.3)
    if any(lines):
        ax.legend(fontsize=8, loc="best")
    if jacobian_norms is not None:
        _jacobian_panel(fig, jacobian_norms, bound, start, weight_norm)
    return fig


def _jacobian_panel(
    fig: Figure, jacobian_norms: Any, bound: Any, start: int, weight_norm: float | None
) -> None:
    """The right panel of :func:`plot_gradient_flow`: ‖∂h_t/∂h_k‖₂ against the bound."""
    J = _array(jacobian_norms, "jacobian_norms")
    J = J[None] if J.ndim == 1 else J
    if J.ndim != 2:
        raise ValueError(f"jacobian_norms must be (B, n) or (n,), got shape {J.shape}")
    lags = np.arange(J.shape[1])
    right = fig.add_subplot(1, 2, 2)
    median = _positive(np.median(J, axis=0))
    right.plot(lags, median, color="tab:blue", lw=1.8, label="measured (median over batch)")
    if J.shape[0] > 1:
        right.fill_between(
            lags,
            _positive(J.min(0)),
            _positive(J.max(0)),
            color="tab:blue",
            alpha=0.2,
            lw=0,
            label="min–max over batch",
        )
    drawn = [median]
    if bound is not None:
        b = _array(bound, "bound")
        b = _positive(b.max(0) if b.ndim == 2 else b)
        if b.shape != lags.shape:
            raise ValueError(f"bound must have {lags.size} entries per row, got {b.shape}")
        lam = f", λ = {weight_norm:.3g}" if weight_norm is not None else ""
        right.plot(lags, b, "k--", lw=1.5, label=r"bound $(\gamma\lambda)^{t-k}$" + lam)
        drawn.append(b)
    elif weight_norm is not None:
        right.plot([], [], " ", label=rf"$\|W_h\|_2$ = {weight_norm:.3g} (bound: simple cell only)")
    _log_axis(right, *drawn)
    _focus(right, _positive(J))
    right.set_xlabel(f"steps back t − k (k = {start})")
    right.set_ylabel(r"$\|\partial h_t/\partial h_k\|_2$ (spectral norm)")
    right.set_title("Jacobian norm vs the bound", fontsize=10)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=8, loc="best")


def projected_contributions(parts: Any) -> tuple[np.ndarray, float]:
    """Signed scalar shares of a gradient that add up to its norm.

    ``parts`` stacks the contributions ``C_k`` of one parameter (``Contributions.weight_hh``,
    ``(K, …)``) whose sum is the gradient ``G``. Each is projected on the direction of
    ``G``: ``c_k = ⟨C_k, G⟩ / ‖G‖``, so ``Σ_k c_k = ‖G‖`` exactly, and a negative ``c_k``
    is a step that pulls against the update (the contributions can have different
    signs; their sum is what matters).

    Returns:
        ``(values (K,), total)`` in float64; all zeros and ``0.0`` when ``G = 0``.

    >>> import numpy as np
    >>> values, total = projected_contributions(np.array([[3.0, 0.0], [0.0, 4.0]]))
    >>> values.round(6).tolist(), total
    ([1.8, 3.2], 5.0)
    """
    P = _array(parts, "parts")
    if P.ndim < 1 or P.shape[0] == 0:
        raise ValueError(f"parts must stack at least one contribution, got shape {P.shape}")
    flat = P.reshape(P.shape[0], -1)
    G = flat.sum(0)
    norm = float(np.linalg.norm(G))
    if norm == 0.0 or not math.isfinite(norm):
        return np.zeros(flat.shape[0]), 0.0 if norm == 0.0 else norm
    return flat @ (G / norm), norm


def plot_contributions(
    values: Any,
    *,
    total: float | None = None,
    axis: str = "step",
    quantity: str = "∂L/∂W_hh",
    title: str | None = None,
    rtol: float = 1e-6,
    width: float = 8.0,
    height: float = 3.8,
) -> Figure:
    """Bars of each step's (or lag's) share of a gradient, and their sum, the total.

    The step bars are drawn in one container labelled ``"contributions"`` and the total in
    one labelled ``"total"`` (tests read the heights from ``ax.containers``).

    Args:
        values: ``(K,)`` signed shares (``projected_contributions``, or one entry of
            the weight for a one-unit network).
        total: the total they must add up to (e.g. the autograd gradient), or None for
            their sum; a total that the bars do not add up to is a ``ValueError``.
        axis: ``"step"`` (index k of the weight's copy) or ``"lag"`` (t − k).
        quantity: what the shares are of, for the labels.

    >>> fig = plot_contributions([0.5, -0.25, 1.0], total=1.25)
    >>> bars = {c.get_label(): [p.get_height() for p in c] for c in fig.axes[0].containers}
    >>> bool(sum(bars["contributions"]) == bars["total"][0])
    True
    """
    v = _array(values, "values", 1)
    if v.size == 0:
        raise ValueError("values must hold at least one contribution")
    if axis not in ("step", "lag"):
        raise ValueError(f"axis must be 'step' or 'lag', got {axis!r}")
    drawn_total = float(v.sum())
    if total is not None and not math.isclose(
        drawn_total, total, rel_tol=rtol, abs_tol=rtol * max(np.abs(v).max(), 1e-300)
    ):
        raise ValueError(
            f"the contributions add up to {drawn_total:.6g}, not the total {total:.6g}"
        )
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ks = np.arange(v.size)
    colours = np.where(v >= 0, "tab:blue", "tab:red")
    ax.bar(ks, v, color=colours, width=0.8, label="contributions")
    gap = max(2.0, v.size * 0.08)
    ax.bar(
        [v.size - 1 + gap],
        [drawn_total],
        color="0.25",
        width=0.8 * max(1.0, v.size / 25),
        label="total",
    )
    ax.axhline(0, color="k", lw=0.6)
    ax.margins(y=0.12)
    ax.annotate(
        f"Σ = {drawn_total:.4g}",
        (v.size - 1 + gap, drawn_total),
        ha="center",
        va="bottom" if drawn_total >= 0 else "top",
        fontsize=9,
        xytext=(0, 3 if drawn_total >= 0 else -3),
        textcoords="offset points",
    )
    stride = max(1, math.ceil(v.size / 16))
    ticks = [k for k in range(0, v.size, stride) if k <= v.size - 1 + gap - 1.5 * stride]
    ax.set_xticks([*ticks, v.size - 1 + gap], [*map(str, ticks), "total"])
    what = "time step k (copy of the weight used at step k)" if axis == "step" else "time lag t − k"
    ax.set_xlabel(what)
    ax.set_ylabel(f"share of {quantity}")
    ax.set_title(
        title
        or f"Contribution of each {'step' if axis == 'step' else 'lag'} to "
        f"{quantity}: the bars add up to the total"
    )
    ax.grid(True, axis="y", alpha=0.3)
    return fig
