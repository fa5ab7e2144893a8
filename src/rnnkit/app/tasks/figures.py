"""Figures the supervised tasks report alike: loss and perplexity from summed nats, and
macro-F1 with per-class precision, recall and F1; the error of a file with nothing to
score."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rnnkit.errors import DataError
from rnnkit.metrics.labels import macro_f1, per_class_prf

__all__ = ["loss_figures", "no_known_label", "one_label_only", "per_class_figures"]


def loss_figures(nats: float, count: int) -> dict[str, Any]:
    """``loss_nats`` and ``perplexity`` from summed nats (None for nothing scored)."""
    if count == 0:
        return {"loss_nats": None, "perplexity": None}
    loss = nats / count
    return {"loss_nats": loss, "perplexity": math.exp(min(loss, 700))}


def per_class_figures(
    gold: list[str], pred: list[str], labels: list[str], prefix: str
) -> dict[str, Any]:
    """Macro-F1 and flat per-class dicts ``{prefix}_precision`` … (one number per class).

    The per-class dicts list every class of ``labels`` (support 0 for one absent here);
    macro-F1 averages over the classes present in ``gold`` or ``pred`` only, as
    scikit-learn's ``f1_score(gold, pred, average="macro")`` does: a class the data
    never mentions has no F1 to average, and its precision, recall and F1 are None (0 of
    0; a 0 there read as a class got wrong).

    >>> f = per_class_figures(["a", "a"], ["a", "b"], ["a", "b", "c"], "per_class")
    >>> f["per_class_f1"], f["per_class_support"]
    ({'a': 0.6666666666666666, 'b': 0.0, 'c': None}, {'a': 2, 'b': 0, 'c': 0})
    """
    if not gold:
        return {"macro_f1": None}
    per = per_class_prf(gold, pred, labels)
    out: dict[str, Any] = {"macro_f1": macro_f1(gold, pred)}
    present = set(gold) | set(pred)
    for key in ("precision", "recall", "f1"):
        out[f"{prefix}_{key}"] = {c: per[c][key] if c in present else None for c in labels}
    out[f"{prefix}_support"] = {c: per[c]["support"] for c in labels}
    return out


def no_known_label(
    path: str | Path, found: Iterable[str], known: list[str], item: str, label: str
) -> DataError:
    """The error of ``evaluate`` on a file where no ``item`` has a ``label`` the model
    knows: every figure would be None (it was printed so, with exit status 0). It names
    the file, the model's labels (``known``) and the most frequent of ``found`` (the
    file's labels, all unknown), five of each at most.

    >>> print(no_known_label("x.tsv", ["q", "zz", "zz"], ["a", "b"], "token", "tag"))
    ... # doctest: +NORMALIZE_WHITESPACE
    x.tsv: no token has a tag the model knows (a, b); 3 tokens have tags it was not
    trained on: zz (2), q (1)
    """
    counts = sorted(Counter(found).items(), key=lambda kv: (-kv[1], kv[0]))
    n = sum(c for _, c in counts)
    named = ", ".join(f"{name} ({c})" for name, c in counts[:5]) + (", …" if counts[5:] else "")
    knows = ", ".join(known[:5]) + (", …" if known[5:] else "")
    have = f"{n} {item} has a {label}" if n == 1 else f"{n} {item}s have {label}s"
    return DataError(
        f"no {item} has a {label} the model knows ({knows}); {have} it was not trained on: "
        + named,
        path,
    )


def one_label_only(
    path: str | Path | None,
    labels: list[str],
    item: str,
    label: str,
    *,
    held_out: Iterable[str] = (),
    empty_field: bool = False,
) -> None:
    """A ``DataError`` where the training ``item``s of a classifier or tagger have one
    ``label`` alone: it would learn to say it always, and report a perfect accuracy
    (every baseline too). ``held_out``: the labels of the validation part split off the
    file (the others, if any, are named: the split took them). ``empty_field``: the file
    is CoNLL-U, whose ``_`` is an empty field (a column the file leaves unfilled).

    >>> one_label_only("t.conllu", ["_"], "token", "tag", empty_field=True)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: t.conllu: every training token has the tag '_' (CoNLL-U's \
empty field: choose a column the file fills, --tag-column); a tagger needs two tags or more
    >>> one_label_only("t.tsv", ["a"], "example", "label", held_out=["b", "a"])
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: t.tsv: every training example has the label 'a': the \
validation part held out of the file took every other label ('b'); give a validation \
file of its own (--valid)
    """
    if len(labels) >= 2:
        return
    which = f"the {label} {labels[0]!r}" if labels else f"no {label}"
    others = sorted(set(held_out) - set(labels))
    if others:
        shown = ", ".join(repr(o) for o in others[:5]) + (", …" if others[5:] else "")
        raise DataError(
            f"every training {item} has {which}: the validation part held out of the file "
            f"took every other {label} ({shown}); give a validation file of its own (--valid)",
            path,
        )
    hint = ""
    if empty_field and labels == ["_"]:
        hint = " (CoNLL-U's empty field: choose a column the file fills, --tag-column)"
    learner = "a tagger" if item == "token" else "a classifier"
    raise DataError(
        f"every training {item} has {which}{hint}; {learner} needs two {label}s or more", path
    )
