"""Detection metrics: ROC-AUC, curves and verdict metrics, by hand and against scikit-learn."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.metrics.detection import (
    detection_metrics,
    precision_recall_curve,
    precision_recall_f1,
    roc_auc,
    roc_curve,
)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40))
def test_auc_equals_the_pairwise_probability(rows: list[tuple[int, bool]]) -> None:
    scores = [float(s) for s, _ in rows]  # small integers: many ties
    labels = [int(y) for _, y in rows]
    if len(set(labels)) < 2:
        with pytest.raises(ValueError, match="both"):
            roc_auc(scores, labels)
        return
    assert roc_auc(scores, labels) == pytest.approx(_auc_by_pairs(scores, labels))


def test_perfect_and_inverted_separation() -> None:
    assert roc_auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert roc_auc([4, 3, 2, 1], [0, 0, 1, 1]) == 0.0


def test_precision_recall_f1_edge_cases() -> None:
    nothing = precision_recall_f1([False, False], [1, 0])  # nothing flagged: no precision
    assert (nothing["precision"], nothing["recall"], nothing["f1"]) == (None, 0.0, 0.0)
    perfect = precision_recall_f1([True, False], [1, 0])
    assert (perfect["precision"], perfect["recall"], perfect["f1"], perfect["fpr"]) == (
        1.0,
        1.0,
        1.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("predicted", "labels", "expected"),
    [
        # no anomalous session, one flagged: recall 0/0; F1 2·0 / (0 + 1 + 0) = 0
        ([True, False, False], [0, 0, 0], (0.0, None, 0.0, 1 / 3)),
        # no anomalous session, none flagged: precision, recall and F1 all 0/0
        ([False, False], [0, 0], (None, None, None, 0.0)),
        # only anomalous sessions: no false-positive rate (0/0)
        ([True, False], [1, 1], (1.0, 0.5, 2 / 3, None)),
        ([], [], (None, None, None, None)),
    ],
)
def test_an_undefined_ratio_is_none_not_zero(predicted, labels, expected) -> None:
    """A ratio over 0 is None (JSON null), as scikit-learn's ``zero_division=np.nan``
    gives NaN: 0 read as "no anomaly found" where there was none to find. F1 is
    ``2 tp / (2 tp + fp + fn)``, None only when that is 0 / 0."""
    m = precision_recall_f1(np.array(predicted, dtype=bool), np.array(labels, dtype=int))
    got = tuple(m[k] for k in ("precision", "recall", "f1", "fpr"))
    assert got == pytest.approx(expected)
    assert [v is None for v in got] == [v is None for v in expected]


def test_undefined_ratios_agree_with_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 6))
        y, p = rng.random(n) < rng.random(), rng.random(n) < rng.random()
        m = precision_recall_f1(p, y.astype(int))
        for key, fn in (
            ("precision", metrics.precision_score),
            ("recall", metrics.recall_score),
            ("f1", metrics.f1_score),
        ):
            want = fn(y, p, zero_division=np.nan)
            assert (m[key] is None) == bool(np.isnan(want)), (key, y, p)
            if m[key] is not None:
                assert m[key] == pytest.approx(want)


def test_detection_metrics_without_both_classes_has_no_auc() -> None:
    m = detection_metrics([0.1, 0.9], [1, 1], threshold=0.5)
    assert "auc" not in m
    assert m["recall"] == 0.5 and m["threshold"] == 0.5


def test_curves_match_scikit_learn_and_the_auc() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(4)
    labels = rng.random(200) < 0.3
    scores = np.round(rng.normal(size=200) + labels, 1)  # rounded: many ties
    fpr, tpr, t = roc_curve(scores, labels)
    ref_fpr, ref_tpr, ref_t = metrics.roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(fpr, ref_fpr)
    np.testing.assert_allclose(tpr, ref_tpr)
    np.testing.assert_allclose(t[1:], ref_t[1:])
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc(scores, labels))
    recall, precision, t = precision_recall_curve(scores, labels)
    ref_p, ref_r, ref_t = metrics.precision_recall_curve(labels, scores)
    # scikit-learn lists them from the lowest threshold and stops at full recall, then
    # appends (precision 1, recall 0).
    keep = t >= ref_t[0]
    np.testing.assert_allclose(precision[keep], ref_p[:-1][::-1])
    np.testing.assert_allclose(recall[keep], ref_r[:-1][::-1])
    with pytest.raises(ValueError, match="both normal and anomalous"):
        roc_curve([1.0, 2.0], [0, 0])


def _auc_by_pairs(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        # of two lengths, numpy broadcast them: one label stood for every verdict
        (lambda: precision_recall_f1([True, False], [1]), r"shapes \(2,\) and \(1,\)"),
        (lambda: roc_auc([0.1, 0.2, 0.3], [0, 1]), r"shapes \(3,\) and \(2,\)"),
        (lambda: detection_metrics([0.1, 0.2], [[0, 1]], 0.5), r"shapes \(2,\) and \(1, 2\)"),
        # a label of 2 was counted as anomalous
        (
            lambda: roc_auc([0.1, 0.2], [0, 2]),
            r"^labels must be 0 \(normal\) or 1 .*labels\[1\] = 2$",
        ),
        # a NaN score sorted anywhere: AUC 1.0, a NaN threshold on the curves
        (lambda: roc_auc([0.1, float("nan")], [0, 1]), r"^scores\[1\] is NaN"),
        (lambda: roc_curve([float("nan"), 0.1], [0, 1]), r"^scores\[0\] is NaN"),
        (lambda: precision_recall_curve([0.1, float("nan")], [0, 1]), r"^scores\[1\] is NaN"),
        # no session at all was an IndexError from inside the cumulative counts
        (lambda: roc_curve([], []), "needs both normal and anomalous sessions"),
        (lambda: precision_recall_curve([], []), "needs anomalous sessions"),
    ],
)
def test_hostile_scores_and_labels_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_infinite_scores_still_rank():
    # +inf is a score (a probability of zero); only NaN has no place in the order
    assert roc_auc([0.1, float("inf")], [0, 1]) == 1.0
    assert precision_recall_f1(np.array([], dtype=bool), np.array([], dtype=int))["tp"] == 0
