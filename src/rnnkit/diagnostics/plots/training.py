"""Training curves: the loss of training and validation (:func:`plot_losses`) and the
gradient norm with its clipping (:func:`plot_grad_norms`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from rnnkit.diagnostics.plots.base import (
    _array,
    _empty,
    _figure,
    _log_axis,
    _positive,
)

__all__ = ["plot_grad_norms", "plot_losses"]

LN2 = math.log(2)


def _nats_to_bits(nats: Any) -> Any:
    return np.asarray(nats) / LN2


def _bits_to_nats(bits: Any) -> Any:
    return np.asarray(bits) * LN2


def plot_losses(
    train_steps: Sequence[float],
    train_loss: Sequence[float],
    valid_steps: Sequence[float] = (),
    valid_loss: Sequence[float] = (),
    *,
    bits_per_char: bool = False,
    baseline: float | None = None,
    baseline_label: str = "n-gram baseline",
    title: str = "Training and validation loss",
    width: float = 7.0,
    height: float = 4.0,
    ylabel: str = "loss (nats per token)",
) -> Figure:
    """Training and validation loss (nats per token) against the optimizer step.

    Args:
        train_steps, train_loss: ``(N,)`` steps and mean training loss over the steps
            since the previous point (nats).
        valid_steps, valid_loss: ``(M,)`` the validation evaluations (nats).
        bits_per_char: add a right-hand axis in bits per character (character models).
        baseline: a reference validation loss in nats (the n-gram), drawn dashed.
        ylabel: the loss's unit (a classifier's is per example, a regressor's per value).

    >>> fig = plot_losses([10, 20], [3.0, 2.5], [20], [2.6], bits_per_char=True, baseline=2.7)
    >>> fig.axes[0].get_ylabel()
    'loss (nats per token)'
    """
    ts, tl = _array(train_steps, "train_steps", 1), _array(train_loss, "train_loss", 1)
    vs, vl = _array(valid_steps, "valid_steps", 1), _array(valid_loss, "valid_loss", 1)
    if ts.shape != tl.shape or vs.shape != vl.shape:
        raise ValueError("steps and losses must have the same length")
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ax.set_title(title)
    if not ts.size and not vs.size and baseline is None:
        _empty(ax, "no losses logged")
        return fig
    if ts.size:
        marker = "." if ts.size < 30 else None
        ax.plot(ts, tl, color="tab:blue", lw=1.5, marker=marker, label="training")
    if vs.size:
        ax.plot(vs, vl, color="tab:orange", lw=2, marker="o", ms=4, label="validation")
    if baseline is not None and math.isfinite(baseline):
        ax.axhline(baseline, color="0.3", ls="--", lw=1.2, label=f"{baseline_label}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)
    if bits_per_char:
        right = ax.secondary_yaxis("right", functions=(_nats_to_bits, _bits_to_nats))
        right.set_ylabel("bits per character")
    return fig


def plot_grad_norms(
    steps: Sequence[float],
    norms: Sequence[float],
    *,
    clip_norm: float | None = None,
    title: str = "Gradient norm during training",
    width: float = 7.0,
    height: float = 3.5,
) -> Figure:
    """The global gradient norm (before clipping) at the logged steps, on a log scale.

    Args:
        steps, norms: ``(N,)`` steps and ‖g‖₂ over all parameters before clipping.
        clip_norm: the clipping threshold κ (a dashed line; points above it were clipped).

    >>> fig = plot_grad_norms([1, 2, 3], [0.5, 8.0, 2.0], clip_norm=5.0)
    >>> fig.axes[0].get_yscale(), fig.axes[0].get_xlabel()
    ('log', 'optimizer step')
    """
    s, n = _array(steps, "steps", 1), _positive(_array(norms, "norms", 1))
    if s.shape != n.shape:
        raise ValueError("steps and norms must have the same length")
    fig = _figure(width, height)
    ax = fig.add_subplot()
    ax.set_title(title)
    if not np.isfinite(n).any():
        _empty(ax, "no gradient norms logged")
        return fig
    ax.plot(
        s, n, color="tab:purple", lw=1.2, marker="." if s.size < 50 else None, label=r"$\|g\|_2$"
    )
    if clip_norm is not None:
        ax.axhline(
            clip_norm, color="tab:red", ls="--", lw=1.2, label=f"clip threshold κ = {clip_norm:g}"
        )
        above = n > clip_norm
        if above.any():
            ax.plot(s[above], n[above], "x", color="tab:red", ms=5, label="clipped")
    _log_axis(ax, n)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(r"gradient norm $\|g\|_2$ (before clipping)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=9)  # "best" scans every point: slow on long runs
    return fig
