"""Anomaly detection: ROC and precision–recall curves with each detector's operating
point (:func:`plot_detection_curves`) and the score histograms of normal and anomalous
sessions against the threshold (:func:`plot_score_histograms`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from rnnkit.diagnostics.plots.base import (
    _array,
    _figure,
)

__all__ = ["plot_detection_curves", "plot_score_histograms"]

#: How many times the normal sessions' typical score the largest score may be before the
#: histogram's x-axis is logarithmic (two decades): past it, a linear axis puts the normal
#: sessions and the threshold in the first bin or two.
LOG_SPAN = 100.0


def plot_detection_curves(
    curves: Mapping[str, Mapping[str, Any]],
    *,
    title: str = "Detection on labelled validation sessions",
    width: float = 10.0,
    height: float = 4.2,
) -> Figure:
    """ROC and precision–recall curves of several detectors side by side, each with its
    operating point (the verdicts at its threshold) marked.

    Args:
        curves: per detector name, ``fpr``, ``tpr`` (ROC), ``recall``, ``precision``
            (PR), ``auc``, and ``point``: ``(fpr, recall, precision)`` at the threshold.

    >>> c = {"a": {"fpr": [0, 0, 1], "tpr": [0, 1, 1], "recall": [1, 1], "precision": [1, .5],
    ...            "auc": 1.0, "point": (0.0, 1.0, 1.0)}}
    >>> [ax.get_title() for ax in plot_detection_curves(c).axes]
    ['ROC', 'Precision–recall']
    """
    fig = _figure(width, height)
    roc, pr = fig.subplots(1, 2)
    fig.suptitle(title)
    roc.set_title("ROC")
    pr.set_title("Precision–recall")
    roc.plot([0, 1], [0, 1], color="0.7", lw=1, ls=":")
    for i, (name, c) in enumerate(curves.items()):
        color = f"C{i}"
        fpr, tpr = _array(c["fpr"], "fpr", 1), _array(c["tpr"], "tpr", 1)
        rec, prec = _array(c["recall"], "recall", 1), _array(c["precision"], "precision", 1)
        roc.step(fpr, tpr, where="post", color=color, lw=1.8, label=f"{name} (AUC {c['auc']:.3f})")
        pr.step(rec, prec, where="post", color=color, lw=1.8, label=name)
        p_fpr, p_rec, p_prec = c["point"]
        roc.plot([p_fpr], [p_rec], "o", color=color, ms=7, mec="black")
        pr.plot([p_rec], [p_prec], "o", color=color, ms=7, mec="black")
    roc.set_xlabel("false-positive rate (normal sessions flagged)")
    roc.set_ylabel("true-positive rate (recall)")
    pr.set_xlabel("recall")
    pr.set_ylabel("precision")
    for ax in (roc, pr):
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right" if ax is roc else "lower left", fontsize=9)
    return fig


def plot_score_histograms(
    panels: Sequence[tuple[str, Any, Any, float]],
    *,
    score: str = "score",
    width: float | None = None,
    height: float = 3.6,
    bins: int = 40,
    xlabel: str | None = None,
    counted: str = "sessions",
    threshold_label: str = "threshold",
    lines: Sequence[tuple[float, str]] = (),
) -> Figure:
    """Histograms of session scores, normal against anomalous, with the threshold drawn;
    one panel per detector.

    Scores that span more than :data:`LOG_SPAN` (two decades) past the normal sessions'
    typical score are drawn on a log x-axis (symlog where a score is zero or negative),
    with bins of equal width on it: on a linear axis a few truncated sessions scoring
    20,000 put every normal session and the threshold (3.7) in the first bin. The x label
    then says so.

    Args:
        panels: ``(title, normal scores, anomalous scores, threshold)`` each; the
            anomalous scores may be empty (unlabelled validation).
        score: the score's name (the x label).
        xlabel: the x label instead (default ``session score (score)``).
        counted: what the histograms count (the y label), default ``sessions``.
        threshold_label: the threshold's name in the legend.
        lines: further ``(value, name)`` lines drawn dotted in every panel (another
            threshold).

    >>> fig = plot_score_histograms([("m", [0.1, 0.2, 0.4], [2.0, 3.0], 1.0)])
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_xscale()
    ('session score (score)', 'linear')
    >>> fig = plot_score_histograms([("m", [0.5, 1.0, 2.0], [15000.0], 3.7)])
    >>> fig.axes[0].get_xlabel(), fig.axes[0].get_xscale()
    ('session score (score), log scale', 'log')
    """
    fig = _figure(width or 5.0 * max(1, len(panels)), height)
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    for ax, (title, normal, anomalous, threshold) in zip(axes, panels, strict=False):
        n = _array(normal, "normal", 1)
        a = _array(anomalous, "anomalous", 1)
        marks = [(float(v), name) for v, name in lines]
        finite = np.r_[n, a, threshold, [v for v, _ in marks]]
        finite = finite[np.isfinite(finite)]
        scale, linthresh = _x_scale(n, finite)
        edges = _edges(finite, bins, scale, linthresh)
        ax.hist(n, bins=edges, color="tab:blue", alpha=0.6, label=f"normal ({n.size})")
        if a.size:
            ax.hist(a, bins=edges, color="tab:red", alpha=0.6, label=f"anomalous ({a.size})")
        if math.isfinite(threshold):
            ax.axvline(threshold, color="black", ls="--", lw=1.5, label=threshold_label)
        for value, name in marks:
            if math.isfinite(value):
                ax.axvline(value, color="0.35", ls=":", lw=1.5, label=name)
        if scale == "log":
            ax.set_xscale("log")
        elif scale == "symlog":
            ax.set_xscale("symlog", linthresh=linthresh)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(title)
        label = xlabel or f"session score ({score})"
        ax.set_xlabel(label if scale == "linear" else f"{label}, {scale} scale")
        ax.set_ylabel(counted)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)  # not "best": it scans every bar, slow under load
    return fig


def _x_scale(normal: np.ndarray, finite: np.ndarray) -> tuple[str, float]:
    """``(scale, linthresh)`` of a histogram's x-axis: ``"log"`` (every value positive) or
    ``"symlog"`` (some zero or negative; linear within ``linthresh`` of 0) when the largest
    value is over :data:`LOG_SPAN` times the normal sessions' median magnitude (the
    typical score, which must stay readable), else ``"linear"``.

    The reference is the normal scores' median, not the smallest value: a count score's
    normal sessions all at 0 and a threshold of 1e-4 are no reason for a log axis."""
    typical = np.abs(normal[np.isfinite(normal) & (normal != 0)])
    if not finite.size or not typical.size:
        return "linear", 1.0
    reference = float(np.median(typical))
    if float(np.abs(finite).max()) <= LOG_SPAN * reference:
        return "linear", 1.0
    if float(finite.min()) > 0:
        return "log", 1.0
    # a power of ten: the axis's ticks are then 0, ±10^k, ±10^(k+1) … (not ±0.68)
    return "symlog", float(10 ** round(math.log10(reference)))


def _edges(finite: np.ndarray, bins: int, scale: str, linthresh: float) -> np.ndarray:
    """``bins + 1`` bin edges over the values, of equal width on the axis's scale."""
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if scale == "log":
        return np.geomspace(lo, hi if hi > lo else lo * 10, bins + 1)
    if scale == "symlog":
        # sign(x)·log10(1 + |x|/c): linear near 0, logarithmic past c, as the axis draws
        def forward(x: float) -> float:
            return math.copysign(math.log10(1 + abs(x) / linthresh), x)

        ys = np.linspace(forward(lo), forward(hi), bins + 1)
        edges = np.sign(ys) * linthresh * (10 ** np.abs(ys) - 1)
        edges[[0, -1]] = lo, hi  # exactly: rounding must not leave the largest score out
        return edges
    return np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
