"""Heatmaps over tokens: attention weights (:func:`plot_attention`), the next-symbol
distribution along a text (:func:`plot_next_symbol`) and the hidden states
(:func:`plot_hidden_states`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib import colors
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rnnkit.diagnostics.plots.base import (
    _array,
    _figure,
    _token_ticks,
)

__all__ = ["plot_attention", "plot_hidden_states", "plot_next_symbol"]


def _heatmap(ax: Axes, data: np.ndarray, *, cmap: str, norm: colors.Normalize, label: str):
    image = ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, norm=norm)
    bar = ax.figure.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label(label)
    return image


def plot_attention(
    weights: Any,
    source_labels: Sequence[str] | None = None,
    target_labels: Sequence[str] | None = None,
    *,
    title: str = "Attention weights",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of attention: one row per output (target) step, one column per source token.

    Args:
        weights: ``(T_target, T_source)``, each row a distribution over the source.
        source_labels: ``T_source`` tokens; target_labels: ``T_target`` tokens.

    >>> import numpy as np
    >>> fig = plot_attention(np.eye(3), ["a", "b", "c"], ["A", "B", "C"])
    >>> fig.axes[0].get_xlabel(), [t.get_text() for t in fig.axes[0].get_yticklabels()]
    ('source token', ['A', 'B', 'C'])
    """
    W = _array(weights, "weights", 2)
    n_out, n_in = W.shape
    fig = _figure(width or min(14.0, 3.0 + 0.25 * n_in), height or min(12.0, 2.0 + 0.25 * n_out))
    ax = fig.add_subplot()
    top = float(np.nanmax(W)) if W.size else 1.0
    _heatmap(
        ax, W, cmap="viridis", norm=colors.Normalize(0.0, max(top, 1e-12)), label="attention weight"
    )
    _token_ticks(ax, "x", source_labels, n_in)
    _token_ticks(ax, "y", target_labels, n_out)
    ax.set_xlabel("source token")
    ax.set_ylabel("output step (target token)")
    ax.set_title(title)
    return fig


def plot_next_symbol(
    probs: Any,
    symbols: Sequence[str],
    context: Sequence[str] | None = None,
    *,
    targets: Sequence[int] | None = None,
    top: int = 15,
    title: str = "Next-symbol distribution along the text",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of ``P(next symbol | text so far)``: top-N symbols × positions.

    Args:
        probs: ``(T, V)``, row ``t`` the model's distribution after reading position t.
        symbols: ``V`` vocabulary entries (``vocab.itos``).
        context: ``T`` labels of the positions (the symbol read at each).
        targets: ``T`` ids of the symbol that really came next; framed where shown.
        top: how many symbols to show (those with the highest mean probability).

    >>> import numpy as np
    >>> p = np.full((4, 3), 0.1); p[np.arange(4), [0, 1, 2, 0]] = 0.8
    >>> fig = plot_next_symbol(p, ["x", "y", "z"], list("abcd"), targets=[0, 1, 2, 0], top=2)
    >>> fig.axes[0].images[0].get_array().shape
    (2, 4)
    """
    P = _array(probs, "probs", 2)
    T, V = P.shape
    if len(symbols) != V:
        raise ValueError(f"probs has {V} symbols but {len(symbols)} labels were given")
    if top < 1:
        raise ValueError(f"top must be ≥ 1, got {top}")
    rows = np.argsort(-P.mean(0), kind="stable")[: min(top, V)]  # most likely first
    fig = _figure(width or min(16.0, 3.5 + 0.22 * T), height or 1.8 + 0.24 * rows.size)
    ax = fig.add_subplot()
    _heatmap(
        ax,
        P[:, rows].T,
        cmap="magma_r",
        norm=colors.Normalize(0.0, 1.0),
        label="P(next symbol | text so far)",
    )
    _token_ticks(ax, "y", [symbols[i] for i in rows], rows.size)
    _token_ticks(ax, "x", context, T)
    if targets is not None:
        if len(targets) != T:
            raise ValueError(f"expected {T} targets, got {len(targets)}")
        where = {int(s): r for r, s in enumerate(rows)}
        shown = [(t, where[int(s)]) for t, s in enumerate(targets) if int(s) in where]
        if shown:
            xs, ys = zip(*shown, strict=True)
            ax.scatter(
                xs,
                ys,
                s=40,
                marker="s",
                facecolors="none",
                edgecolors="tab:cyan",
                linewidths=1.2,
                label="symbol that came next",
            )
            ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("position t (symbol read)")
    ax.set_ylabel(f"next symbol (top {rows.size} of {V})")
    ax.set_title(title, loc="left")
    return fig


def plot_hidden_states(
    states: Any,
    context: Sequence[str] | None = None,
    *,
    max_units: int = 64,
    title: str = "Hidden-state activations over time",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """Heatmap of hidden activations ``h_t``: units × steps.

    Args:
        states: ``(T, H)`` hidden states of one sequence.
        context: ``T`` labels of the steps (the symbol read at each).
        max_units: above this many units, the ``max_units`` with the largest variance
            over time are shown (in unit order).

    >>> import numpy as np
    >>> fig = plot_hidden_states(np.tanh(np.random.default_rng(0).normal(size=(20, 100))),
    ...                          max_units=16)
    >>> fig.axes[0].images[0].get_array().shape
    (16, 20)
    """
    S = _array(states, "states", 2)
    T, H = S.shape
    units = np.arange(H)
    if max_units < H:
        units = np.sort(np.argsort(-S.var(0), kind="stable")[:max_units])
    fig = _figure(
        width or min(16.0, 3.5 + 0.2 * T), height or min(10.0, max(3.2, 2.0 + 0.08 * units.size))
    )
    ax = fig.add_subplot()
    limit = float(np.nanmax(np.abs(S))) if S.size else 1.0
    _heatmap(
        ax,
        S[:, units].T,
        cmap="RdBu_r",
        norm=colors.Normalize(-max(limit, 1e-12), max(limit, 1e-12)),
        label="activation h_t",
    )
    _token_ticks(ax, "x", context, T)
    step = max(1, math.ceil(units.size / 16))
    ax.set_yticks(range(0, units.size, step), [str(u) for u in units[::step]])
    shown = f"{units.size} of {H} units, largest variance" if units.size < H else f"{H} units"
    ax.set_ylabel(f"hidden unit ({shown})")
    ax.set_xlabel("position t (symbol read)" if context is not None else "time step t")
    ax.set_title(title)
    return fig
