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
) -> Figure:
    """Histograms of session scores, normal against anomalous, with the threshold drawn;
    one panel per detector.

    Args:
        panels: ``(title, normal scores, anomalous scores, threshold)`` each; the
            anomalous scores may be empty (unlabelled validation).
        score: the score's name (the x label).
        xlabel: the x label instead (default ``session score (score)``).
        counted: what the histograms count (the y label), default ``sessions``.

    >>> fig = plot_score_histograms([("m", [0.1, 0.2, 0.4], [2.0, 3.0], 1.0)])
    >>> fig.axes[0].get_xlabel()
    'session score (score)'
    """
    fig = _figure(width or 5.0 * max(1, len(panels)), height)
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    for ax, (title, normal, anomalous, threshold) in zip(axes, panels, strict=False):
        n = _array(normal, "normal", 1)
        a = _array(anomalous, "anomalous", 1)
        finite = np.r_[n, a, threshold]
        finite = finite[np.isfinite(finite)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
        ax.hist(n, bins=edges, color="tab:blue", alpha=0.6, label=f"normal ({n.size})")
        if a.size:
            ax.hist(a, bins=edges, color="tab:red", alpha=0.6, label=f"anomalous ({a.size})")
        if math.isfinite(threshold):
            ax.axvline(threshold, color="black", ls="--", lw=1.5, label="threshold")
        ax.set_yscale("symlog", linthresh=1)
        ax.set_title(title)
        ax.set_xlabel(xlabel or f"session score ({score})")
        ax.set_ylabel(counted)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize=8)  # not "best": it scans every bar, slow under load
    return fig
