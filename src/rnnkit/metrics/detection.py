"""Detection metrics of anomaly verdicts: ROC-AUC, the ROC and precision–recall curves,
precision, recall, F1 and false-positive rate (None where undefined). Pure functions of
scores (higher = more anomalous) and labels (1 anomalous, 0 normal); a session is flagged
when its score is at or above a curve's threshold ``t``, and strictly above a verdict's
threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "detection_metrics",
    "precision_recall_curve",
    "precision_recall_f1",
    "roc_auc",
    "roc_curve",
]


def _checked(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray, what: str = "scores"
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores as float64, labels as bool)``, both ``(n,)`` of one length, or a
    ``ValueError`` naming what is wrong. Lists of two lengths were broadcast (verdicts
    counted twice), a label of 2 counted as anomalous, a NaN score sorted anywhere."""
    s = np.asarray(scores, dtype=np.float64)
    raw = np.asarray(labels)
    if s.ndim != 1 or raw.ndim != 1 or s.shape != raw.shape:
        raise ValueError(
            f"{what} and labels must be (n,) arrays of one length, got shapes "
            f"{s.shape} and {raw.shape}"
        )
    if raw.size and not np.isin(raw, (0, 1)).all():
        bad = int(np.flatnonzero(~np.isin(raw, (0, 1)))[0])
        raise ValueError(
            f"labels must be 0 (normal) or 1 (anomalous), got labels[{bad}] = {raw[bad].item()!r}"
        )
    if what == "scores" and np.isnan(s).any():
        bad = int(np.flatnonzero(np.isnan(s))[0])
        raise ValueError(f"scores[{bad}] is NaN: a NaN score has no rank")
    return s, raw.astype(bool)


def roc_auc(scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """Area under the ROC curve: the probability that a random anomalous session scores
    above a random normal one, ties counting one half (Mann–Whitney U over mid-ranks).

    Args:
        scores: ``(n,)`` anomaly scores.
        labels: ``(n,)`` 1 anomalous, 0 normal; both classes must be present.

    >>> roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    0.75
    >>> roc_auc([1, 1, 1], [0, 1, 1])
    0.5
    """
    s, y = _checked(scores, labels)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("ROC-AUC needs both normal and anomalous sessions")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size, dtype=np.float64)
    sorted_s = s[order]
    # Mid-ranks: every member of a run of equal scores gets the run's mean rank.
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], s.size]
    mid = (starts + ends + 1) / 2.0  # mean of the 1-based ranks start+1 .. end
    ranks[order] = np.repeat(mid, ends - starts)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def _cumulative_counts(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """``(thresholds, tp, fp, n_pos, n_neg)``: for each distinct score ``t``, highest first,
    the true and false positives when every session scoring ``≥ t`` is flagged."""
    s, y = _checked(scores, labels)
    if not s.size:  # no point: the callers name what a curve needs
        none = np.zeros(0, dtype=np.int64)
        return s, none, none, 0, 0
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[s[1:] != s[:-1], True]  # the last of each run of equal scores
    tp = np.cumsum(y)[last]
    fp = np.cumsum(~y)[last]
    return s[last], tp, fp, int(y.sum()), int((~y).sum())


def roc_curve(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ROC curve: ``(fpr, tpr, thresholds)`` when every session scoring ``≥ t`` is
    flagged, ``t`` each distinct score from the highest down, after a first point
    ``(0, 0)`` at ``t = +inf``. The trapezoids under it sum to :func:`roc_auc`.

    >>> fpr, tpr, t = roc_curve([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    >>> fpr.tolist(), tpr.tolist(), t.tolist()
    ([0.0, 0.0, 0.5, 0.5, 1.0], [0.0, 0.5, 0.5, 1.0, 1.0], [inf, 0.8, 0.4, 0.35, 0.1])
    """
    t, tp, fp, n_pos, n_neg = _cumulative_counts(scores, labels)
    if n_pos == 0 or n_neg == 0:
        raise ValueError("a ROC curve needs both normal and anomalous sessions")
    return np.r_[0.0, fp / n_neg], np.r_[0.0, tp / n_pos], np.r_[np.inf, t]


def precision_recall_curve(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The precision–recall curve: ``(recall, precision, thresholds)`` when every session
    scoring ``≥ t`` is flagged, ``t`` each distinct score from the highest down.

    >>> r, p, t = precision_recall_curve([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    >>> r.tolist(), p.round(3).tolist(), t.tolist()
    ([0.5, 0.5, 1.0, 1.0], [1.0, 0.5, 0.667, 0.5], [0.8, 0.4, 0.35, 0.1])
    """
    t, tp, fp, n_pos, _ = _cumulative_counts(scores, labels)
    if n_pos == 0:
        raise ValueError("a precision–recall curve needs anomalous sessions")
    return tp / n_pos, tp / (tp + fp), t


def precision_recall_f1(
    predicted: Sequence[bool] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> dict[str, float | int | None]:
    """Precision, recall, F1 and false-positive rate of anomaly verdicts, with the counts.

    A ratio whose denominator is 0 is undefined and reported as None (JSON null), never
    as 0: a file without anomalous sessions has no recall (0 of 0 found is not "none
    found"). ``precision = tp / (tp + fp)``, None when nothing is flagged; ``recall =
    tp / (tp + fn)``, None without anomalous sessions; ``f1 = 2 tp / (2 tp + fp + fn)``
    (``2PR / (P + R)`` wherever that is defined), None only when there is neither an
    anomalous session nor a flagged one; ``fpr = fp / (fp + tn)``, None without normal
    sessions.

    >>> precision_recall_f1([True, True, False, False], [1, 0, 1, 0])
    {'precision': 0.5, 'recall': 0.5, 'f1': 0.5, 'fpr': 0.5, 'tp': 1, 'fp': 1, 'fn': 1, 'tn': 1}
    >>> m = precision_recall_f1([True, False], [0, 0])  # no anomalous session
    >>> m["precision"], m["recall"], m["f1"], m["fpr"]
    (0.0, None, 0.0, 0.5)
    """
    verdicts, y = _checked(np.asarray(predicted, dtype=bool), labels, what="predicted")
    p = verdicts.astype(bool)
    tp, fp = int(np.sum(p & y)), int(np.sum(p & ~y))
    fn, tn = int(np.sum(~p & y)), int(np.sum(~p & ~y))
    return {
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        # 2PR / (P + R) without its undefined parts: defined whenever anything is
        # anomalous or flagged (flagging only normal sessions is an F1 of 0)
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "fpr": _ratio(fp, fp + tn),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def detection_metrics(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray, threshold: float
) -> dict[str, float | int | None]:
    """ROC-AUC (when both classes are present; absent otherwise) and the verdict metrics at
    ``threshold`` (:func:`precision_recall_f1`: None for an undefined ratio).

    >>> m = detection_metrics([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], threshold=0.37)
    >>> m["auc"], m["precision"], m["recall"]
    (0.75, 0.5, 0.5)
    """
    s, y = _checked(scores, labels)
    out: dict[str, float | int | None] = {}
    if y.any() and not y.all():
        out["auc"] = roc_auc(s, y)
    out.update(precision_recall_f1(s > threshold, y))
    out["threshold"] = float(threshold)
    return out
