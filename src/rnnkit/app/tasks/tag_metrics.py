"""How a tagger is scored: loss, accuracy, OOV accuracy, per-tag and (BIO tag sets) span
figures, with gold tags the model never saw counted apart and left out of every figure;
and the most-frequent-tag baseline, fitted on the training sentences and scored on the
same tokens."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rnnkit.app.tasks.figures import loss_figures, per_class_figures
from rnnkit.app.tasks.run_outputs import BASELINE_FILE, load_baseline
from rnnkit.app.tasks.tag_data import EncodedTags, TagData, _inputs
from rnnkit.data.batching import SequenceBatcher, to_device
from rnnkit.data.vocab import UNK_ID
from rnnkit.deferred import deferring
from rnnkit.metrics.labels import is_bio_tagset, span_prf
from rnnkit.models.lookup import MostFrequentTag
from rnnkit.models.tagger import Tagger

__all__ = [
    "BASELINE_KIND",
    "baseline_metrics",
    "fit_baseline",
    "span_tags",
    "tag_metrics",
]


@torch.no_grad()
def tag_metrics(
    model: Tagger,
    enc: EncodedTags,
    data: TagData,
    device: torch.device,
    batch_size: int,
    full: bool = True,
) -> dict[str, Any]:
    """Loss, accuracy, OOV accuracy and (``full``) per-tag and span figures on ``enc``.

    The summed loss and every batch's predicted tags stay on the device until the end:
    one host read for the whole evaluation (with the model's input checks), not one per
    batch. The predictions kept there are 8 bytes a padded position of each batch."""
    was_training = model.training
    model.eval()
    K = len(data.tags)
    batcher = SequenceBatcher(enc.words, enc.tags, batch_size=batch_size, shuffle=False)
    scored = 0
    nats = torch.zeros((), dtype=torch.float64, device=device)
    best: list[Tensor] = []
    shapes: list[tuple[list[int], int]] = []
    predicted: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(enc.words)
    with deferring() as deferred:
        for batch in batcher:
            words, mask, chars = _inputs(enc, batch, device)
            tags = to_device(batch.targets, device)
            in_tagset = mask & (tags < K)
            # counted on the host, where the batch was made
            scored += int((batch.mask & (batch.targets < K)).sum())
            logits = model(words, mask, chars)  # (B, T, K)
            logp = torch.log_softmax(logits, dim=-1)
            # a padded step or an unknown tag (K) is scored as tag 0, then left out
            picked = logp.gather(-1, torch.where(in_tagset, tags, 0).unsqueeze(-1)).squeeze(-1)
            nats = nats - torch.where(in_tagset, picked, 0.0).sum(dtype=torch.float64)
            best.append(logits.argmax(-1).reshape(-1))
            shapes.append((batch.indices.tolist(), logits.shape[1]))
        total = 0.0
        if best:
            summed, argmax = deferred.fetch(nats, torch.cat(best))
            total = float(summed)
            start = 0
            for indices, T in shapes:
                pred = argmax[start : start + len(indices) * T].view(len(indices), T).numpy()
                start += len(indices) * T
                for row, i in enumerate(indices):
                    predicted[i] = pred[row, : len(enc.words[i])]
    model.train(was_training)
    gold_ids = np.concatenate(enc.tags)
    pred_ids = np.concatenate(predicted)
    oov = np.concatenate(enc.oov)
    known = gold_ids < K
    correct = (gold_ids == pred_ids) & known
    n_oov = int((oov & known).sum())
    metrics: dict[str, Any] = {
        **loss_figures(total, scored),
        "tokens": scored,
        "accuracy": float(correct.sum()) / scored if scored else None,
        "oov_accuracy": float((correct & oov).sum()) / n_oov if n_oov else None,
        "oov_tokens": n_oov,
    }
    unknown = Counter(
        t
        for s, g in zip(enc.sentences, enc.tags, strict=True)
        for t, i in zip(s.tags, g, strict=True)
        if i == K
    )
    metrics["unknown_labels"] = sum(unknown.values())
    metrics["unknown_label_counts"] = dict(sorted(unknown.items()))
    labels = data.tags.labels
    if is_bio_tagset(labels):
        gold_tags, pred_tags = span_tags(enc, predicted, labels)
        spans = span_prf(gold_tags, pred_tags)
        metrics.update({f"span_{k}": spans[k] for k in ("precision", "recall", "f1")})
    if full:
        gold_known = [labels[j] for j in gold_ids[known]]
        pred_known = [labels[j] for j in pred_ids[known]]
        metrics.update(per_class_figures(gold_known, pred_known, labels, "per_tag"))
    return metrics


def span_tags(
    enc: EncodedTags, predicted: list[np.ndarray], labels: list[str]
) -> tuple[list[list[str]], list[list[str]]]:
    """The gold and predicted tag sequences the span figures are counted on: a token whose
    gold tag the model never saw is ``O`` in both, as if it were not in the file (the
    accuracy and the per-tag figures leave it out too). So a gold span of an unseen type
    is no gold span, a predicted span lying on such tokens alone is no predicted span, and
    a predicted span reaching over them is cut there (its part on known tokens is scored
    as conlleval reads it); the spans around them stay as the file has them: an ``O``,
    not a deletion, so no two spans the file keeps apart are joined."""
    K = len(labels)
    gold: list[list[str]] = []
    pred: list[list[str]] = []
    for sentence, ids, best in zip(enc.sentences, enc.tags, predicted, strict=True):
        seen = ids < K
        gold.append([t if k else "O" for t, k in zip(sentence.tags, seen, strict=True)])
        pred.append([labels[j] if k else "O" for j, k in zip(best, seen, strict=True)])
    return gold, pred


BASELINE_KIND = "most frequent tag per word"


def fit_baseline(train: EncodedTags, data: TagData) -> MostFrequentTag:
    """The most-frequent-tag baseline of the training sentences (``<unk>``, which is no
    one word, is not a word of it: unknown words get the most frequent tag overall)."""
    return MostFrequentTag.fit(
        train.words, train.tags, len(data.vocab), len(data.tags), skip=(UNK_ID,)
    )


def baseline_metrics(baseline: MostFrequentTag, enc: EncodedTags, K: int) -> dict[str, Any]:
    """Accuracy and OOV accuracy of the baseline on ``enc``, over the tokens the model
    is scored on (a gold tag the model never saw is left out, as for the model)."""
    gold = np.concatenate(enc.tags) if enc.tags else np.zeros(0, np.int64)
    pred = baseline.predict(np.concatenate(enc.words)) if enc.words else gold
    oov = np.concatenate(enc.oov) if enc.oov else np.zeros(0, bool)
    known = gold < K
    right = (pred == gold) & known
    total, n_oov = int(known.sum()), int((oov & known).sum())
    return {
        "kind": BASELINE_KIND,
        "accuracy": float(right.sum()) / total if total else None,
        "oov_accuracy": float((right & oov).sum()) / n_oov if n_oov else None,
        "oov_tokens": n_oov,
    }


def _load_baseline(run_dir: Path, num_tags: int) -> MostFrequentTag | None:
    arrays = load_baseline(run_dir)
    if arrays is None:
        return None
    return MostFrequentTag.from_state(arrays, num_tags, where=str(run_dir / BASELINE_FILE))
