"""Figures the supervised tasks report alike: loss and perplexity from summed nats, and
macro-F1 with per-class precision, recall and F1."""

from __future__ import annotations

import math
from typing import Any

from rnnkit.metrics.labels import macro_f1, per_class_prf

__all__ = ["loss_figures", "per_class_figures"]


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
    never mentions has no F1 to average.
    """
    if not gold:
        return {"macro_f1": None}
    per = per_class_prf(gold, pred, labels)
    out: dict[str, Any] = {"macro_f1": macro_f1(gold, pred)}
    for key in ("precision", "recall", "f1", "support"):
        out[f"{prefix}_{key}"] = {label: per[label][key] for label in labels}
    return out
