"""Metrics against values computed by hand (and, where it applies, by a second route)."""

from __future__ import annotations

import math

import pytest

from rnnkit.metrics.labels import (
    accuracy,
    bio_spans,
    confusion_matrix,
    is_bio_tagset,
    macro_f1,
    per_class_prf,
    prf,
    span_prf,
)

GOLD = ["cat", "cat", "cat", "dog", "dog", "eel"]
PRED = ["cat", "cat", "dog", "dog", "eel", "eel"]


def test_accuracy_by_hand():
    assert accuracy(GOLD, PRED) == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="2 gold labels but 1 predictions"):
        accuracy(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="undefined"):
        accuracy([], [])


def test_per_class_by_hand():
    m = per_class_prf(GOLD, PRED)
    # cat: tp 2, fp 0, fn 1 -> P 1, R 2/3, F1 0.8
    assert m["cat"] == pytest.approx({"precision": 1.0, "recall": 2 / 3, "f1": 0.8, "support": 3})
    # dog: tp 1, fp 1 (a cat), fn 1 (an eel) -> 1/2, 1/2, 1/2
    assert m["dog"] == pytest.approx({"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2})
    # eel: tp 1, fp 1, fn 0 -> P 1/2, R 1, F1 2/3
    assert m["eel"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert list(m) == ["cat", "dog", "eel"]
    assert macro_f1(GOLD, PRED) == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)


def test_f1_is_harmonic_mean_and_zero_division_is_zero():
    for tp, fp, fn in [(3, 1, 2), (7, 0, 5), (1, 9, 0)]:
        r = prf(tp, fp, fn)
        assert r["f1"] == pytest.approx(
            2 * r["precision"] * r["recall"] / (r["precision"] + r["recall"])
        )
    # A class never predicted and never gold: all zero, not NaN.
    m = per_class_prf(["a"], ["a"], labels=["a", "ghost"])
    assert m["ghost"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert macro_f1(["a"], ["a"], labels=["a", "ghost"]) == 0.5
    assert not any(math.isnan(v) for v in prf(0, 0, 0).values())


def test_confusion_matrix_rows_gold_cols_pred():
    labels = ["cat", "dog", "eel"]
    assert confusion_matrix(GOLD, PRED, labels) == [[2, 1, 0], [0, 1, 1], [0, 0, 1]]
    # A label outside the list is left out; the diagonal sum is the number correct.
    assert confusion_matrix(["x", "cat"], ["cat", "cat"], labels) == [
        [1, 0, 0],
        [0, 0, 0],
        [0, 0, 0],
    ]
    with pytest.raises(ValueError, match="distinct"):
        confusion_matrix(["a"], ["a"], ["a", "a"])


def test_bio_spans_conlleval_rules():
    tags = ["B-PER", "I-PER", "O", "I-LOC", "I-LOC", "B-LOC", "B-LOC", "I-ORG", "I-PER"]
    assert bio_spans(tags) == [
        (0, 2, "PER"),
        (3, 5, "LOC"),  # I- after O starts a span
        (5, 6, "LOC"),  # B- always starts a new span
        (6, 7, "LOC"),
        (7, 8, "ORG"),  # I- of another type starts a new span
        (8, 9, "PER"),
    ]
    assert bio_spans([]) == [] and bio_spans(["O", "O"]) == []
    assert bio_spans(["B-X", "I-X"]) == [(0, 2, "X")]  # a span running to the end


def test_span_f1_by_hand():
    gold = [
        ["B-PER", "I-PER", "O", "B-LOC", "O"],
        ["B-ORG", "I-ORG", "I-ORG", "O"],
    ]
    pred = [
        ["B-PER", "I-PER", "O", "B-ORG", "O"],  # PER right, LOC typed wrong
        ["B-ORG", "I-ORG", "O", "B-MISC"],  # ORG cut short (wrong), MISC spurious
    ]
    r = span_prf(gold, pred)
    # gold spans 3, predicted 4, correct 1 -> P 1/4, R 1/3, F1 2/7
    assert (r["gold_spans"], r["pred_spans"], r["correct_spans"]) == (3, 4, 1)
    assert r["precision"] == pytest.approx(0.25)
    assert r["recall"] == pytest.approx(1 / 3)
    assert r["f1"] == pytest.approx(2 / 7)
    assert span_prf(gold, gold)["f1"] == 1.0
    with pytest.raises(ValueError, match="sequence 0: 2 gold tags but 1 predicted"):
        span_prf([["O", "O"]], [["O"]])


def test_is_bio_tagset():
    assert is_bio_tagset(["O", "B-A", "I-A"])
    assert not is_bio_tagset(["O"])  # no span type at all
    assert not is_bio_tagset(["B-A", "NOUN"])
    assert not is_bio_tagset(["B-", "O"])


@pytest.mark.parametrize("seed", range(6))
def test_macro_f1_equals_sklearn_with_and_without_labels(seed):
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    import random
    import warnings

    rng = random.Random(seed)
    classes = ["a", "b", "c", "d", "e"]
    n = rng.randint(1, 12)
    gold = [rng.choice(classes[:3]) for _ in range(n)]
    pred = [rng.choice(classes[1:4]) for _ in range(n)]
    with warnings.catch_warnings():  # sklearn warns of classes with no gold or prediction
        warnings.simplefilter("ignore")
        want = sklearn_metrics.f1_score(gold, pred, average="macro")
        want_all = sklearn_metrics.f1_score(
            gold, pred, average="macro", labels=classes, zero_division=0.0
        )
    assert macro_f1(gold, pred) == pytest.approx(want, abs=1e-12)
    assert macro_f1(gold, pred, labels=classes) == pytest.approx(want_all, abs=1e-12)


def test_task_figures_average_over_the_classes_present():
    from rnnkit.app.tasks.figures import per_class_figures

    got = per_class_figures(["pos", "pos"], ["pos", "pos"], ["neg", "pos"], "per_class")
    # accuracy 1 and macro-F1 1: "neg" occurs in neither gold nor predicted labels
    assert got["macro_f1"] == 1.0
    assert got["per_class_support"] == {"neg": 0, "pos": 2}  # every trained class listed
