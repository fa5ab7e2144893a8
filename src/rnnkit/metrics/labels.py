"""Evaluation metrics for labelling and classification: pure functions of gold and predicted
labels (any hashable labels: strings or ints), no tensors, no state.

Conventions (those of scikit-learn and ``conlleval``):

* precision, recall or F1 with a zero denominator is ``0.0`` (never NaN);
* per-class and macro figures cover the classes given in ``labels``, by default every
  class that occurs in the gold or the predicted labels; macro-F1 is the unweighted mean
  of the per-class F1 values: scikit-learn's ``f1_score(gold, pred, average="macro",
  labels=labels)``, a class in ``labels`` absent from both counting as F1 0 (the tasks
  pass no ``labels``: they average over the classes present);
* the confusion matrix has gold classes as rows and predicted classes as columns;
* BIO spans follow ``conlleval``: a span starts at ``B-X``, or at ``I-X`` that does not
  continue a span of type ``X`` (an ``I-`` after ``O`` or after another type), and runs
  over the following ``I-X``; a span counts as correct only when its start, end and type
  all match a gold span.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

__all__ = [
    "accuracy",
    "bio_spans",
    "confusion_matrix",
    "is_bio_tagset",
    "macro_f1",
    "per_class_prf",
    "prf",
    "span_prf",
]


def _check_pair(gold: Sequence[Any], pred: Sequence[Any]) -> None:
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions (must be equal)")


def prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    """Precision, recall and F1 from counts; a zero denominator gives 0.0.

    >>> prf(3, 1, 2)
    {'precision': 0.75, 'recall': 0.6, 'f1': 0.6666666666666666}
    >>> prf(0, 0, 0)
    {'precision': 0.0, 'recall': 0.0, 'f1': 0.0}
    """
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0  # = 2PR / (P + R), without rounding
    return {"precision": precision, "recall": recall, "f1": f1}


def accuracy(gold: Sequence[Any], pred: Sequence[Any]) -> float:
    """Share of positions where the prediction equals the gold label.

    Raises:
        ValueError: different lengths, or no label at all (the mean would be undefined).

    >>> accuracy(["a", "b", "b", "c"], ["a", "b", "c", "c"])
    0.75
    """
    _check_pair(gold, pred)
    if not gold:
        raise ValueError("accuracy of zero labels is undefined")
    return sum(g == p for g, p in zip(gold, pred, strict=True)) / len(gold)


def _labels(gold: Sequence[Any], pred: Sequence[Any], labels: Iterable[Any] | None) -> list[Any]:
    if labels is not None:
        return list(labels)
    seen = set(gold) | set(pred)
    try:
        return sorted(seen)
    except TypeError:  # mixed types: keep first-seen order
        return list(dict.fromkeys([*gold, *pred]))


def per_class_prf(
    gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Iterable[Hashable] | None = None
) -> dict[Hashable, dict[str, float]]:
    """Precision, recall, F1 and support (number of gold occurrences) of every class.

    Args:
        gold: gold labels, one per item.
        pred: predicted labels, as many.
        labels: the classes to report, in order (default: sorted union of both).

    >>> m = per_class_prf(["a", "a", "b", "c"], ["a", "b", "b", "b"])
    >>> m["a"], m["b"]["precision"], m["c"]["f1"]
    ({'precision': 1.0, 'recall': 0.5, 'f1': 0.6666666666666666, 'support': 2}, \
0.3333333333333333, 0.0)
    """
    _check_pair(gold, pred)
    tp: Counter[Hashable] = Counter()
    fp: Counter[Hashable] = Counter()
    fn: Counter[Hashable] = Counter()
    for g, p in zip(gold, pred, strict=True):
        if g == p:
            tp[g] += 1
        else:
            fp[p] += 1
            fn[g] += 1
    out: dict[Hashable, dict[str, float]] = {}
    for label in _labels(gold, pred, labels):
        out[label] = {**prf(tp[label], fp[label], fn[label]), "support": tp[label] + fn[label]}
    return out


def macro_f1(
    gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Iterable[Hashable] | None = None
) -> float:
    """Unweighted mean of the per-class F1 (every class counts the same, however rare),
    over ``labels`` (default: the classes present in ``gold`` or ``pred``), as
    ``sklearn.metrics.f1_score(gold, pred, average="macro", labels=labels)``.

    >>> round(macro_f1(["a", "a", "b", "c"], ["a", "b", "b", "b"]), 4)  # (2/3 + 1/2 + 0) / 3
    0.3889
    >>> macro_f1(["pos", "pos"], ["pos", "pos"]), macro_f1(["pos"], ["pos"], ["neg", "pos"])
    (1.0, 0.5)
    """
    per = per_class_prf(gold, pred, labels)
    if not per:
        raise ValueError("macro-F1 over zero classes is undefined")
    return sum(v["f1"] for v in per.values()) / len(per)


def confusion_matrix(
    gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Sequence[Hashable]
) -> list[list[int]]:
    """Counts ``M[i][j]`` of items with gold ``labels[i]`` predicted as ``labels[j]``.

    Items whose gold or predicted label is not in ``labels`` are left out.

    >>> confusion_matrix(["a", "a", "b"], ["a", "b", "b"], ["a", "b"])
    [[1, 1], [0, 1]]
    """
    _check_pair(gold, pred)
    index = {label: i for i, label in enumerate(labels)}
    if len(index) != len(labels):
        raise ValueError("labels of a confusion matrix must be distinct")
    matrix = [[0] * len(labels) for _ in labels]
    for g, p in zip(gold, pred, strict=True):
        i, j = index.get(g), index.get(p)
        if i is not None and j is not None:
            matrix[i][j] += 1
    return matrix


def is_bio_tagset(tags: Iterable[str]) -> bool:
    """True when every tag is ``O``, ``B-X`` or ``I-X`` and at least one ``B-`` tag occurs.

    >>> is_bio_tagset(["O", "B-PER", "I-PER"]), is_bio_tagset(["NOUN", "VERB"])
    (True, False)
    """
    has_begin = False
    for tag in tags:
        if tag == "O":
            continue
        if not isinstance(tag, str) or len(tag) < 3 or tag[:2] not in ("B-", "I-"):
            return False
        has_begin = has_begin or tag.startswith("B-")
    return has_begin


def bio_spans(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """The typed spans ``(start, end_exclusive, type)`` of one BIO-tagged sequence.

    An ``I-X`` that does not continue a span of type ``X`` starts a new one (``conlleval``);
    any tag that is not ``B-``/``I-`` (``O`` or anything else) ends the current span.

    >>> bio_spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"])
    [(0, 2, 'PER'), (3, 4, 'LOC'), (4, 5, 'LOC'), (5, 6, 'ORG')]
    """
    spans: list[tuple[int, int, str]] = []
    start: int | None = None
    kind = ""
    for t, tag in enumerate(tags):
        prefix, kind_t = (tag[:2], tag[2:]) if tag[:2] in ("B-", "I-") else ("", "")
        continues = prefix == "I-" and start is not None and kind_t == kind
        if continues:
            continue
        if start is not None:
            spans.append((start, t, kind))
            start = None
        if prefix:
            start, kind = t, kind_t
    if start is not None:
        spans.append((start, len(tags), kind))
    return spans


def span_prf(
    gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]
) -> dict[str, float | int]:
    """Span-level precision, recall and F1 over a corpus of BIO-tagged sequences.

    Args:
        gold: gold tag sequences.
        pred: predicted tag sequences, each as long as its gold sequence.

    Returns:
        ``precision``, ``recall``, ``f1`` and the counts ``gold_spans``, ``pred_spans``,
        ``correct_spans``.

    >>> gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    >>> pred = [["B-PER", "I-PER", "O", "B-ORG"]]
    >>> span_prf(gold, pred)["f1"]
    0.5
    """
    _check_pair(gold, pred)
    n_gold = n_pred = correct = 0
    for i, (g, p) in enumerate(zip(gold, pred, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sequence {i}: {len(g)} gold tags but {len(p)} predicted tags")
        gs, ps = set(bio_spans(g)), set(bio_spans(p))
        n_gold += len(gs)
        n_pred += len(ps)
        correct += len(gs & ps)
    return {
        **prf(correct, n_pred - correct, n_gold - correct),
        "gold_spans": n_gold,
        "pred_spans": n_pred,
        "correct_spans": correct,
    }
