"""Metrics of transduction: exact match, token error rate, token accuracy (teacher forcing).

* **exact match**: the share of sentences whose hypothesis equals the reference, token
  for token.
* **token error rate**: ``Σ edit_distance(hyp, ref) / Σ len(ref)`` over the corpus (edit
  distance = Levenshtein: insertions, deletions, substitutions, each cost 1). It can
  exceed 1 (hypotheses longer than the references).
* **token accuracy under teacher forcing**: the share of target positions (``</s>``
  included) where the model's most probable next token, given the TRUE prefix, is the
  reference token.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

__all__ = ["edit_distance", "exact_match", "teacher_forced_accuracy", "token_error_rate"]


def edit_distance(hyp: Sequence[Hashable], ref: Sequence[Hashable]) -> int:
    """Levenshtein distance between two token sequences (O(len(hyp)·len(ref)), one row).

    >>> edit_distance("kitten", "sitting")
    3
    >>> edit_distance(["a", "b"], []), edit_distance([], ["a"])
    (2, 1)
    """
    if len(hyp) < len(ref):
        hyp, ref = ref, hyp
    previous = list(range(len(ref) + 1))
    for i, h in enumerate(hyp, start=1):
        current = [i]
        for j, r in enumerate(ref, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (h != r)))
        previous = current
    return previous[-1]


def exact_match(hyps: Sequence[Sequence[Hashable]], refs: Sequence[Sequence[Hashable]]) -> float:
    """Share of hypotheses equal to their reference.

    >>> exact_match([["a"], ["b", "c"]], [["a"], ["b"]])
    0.5
    """
    _same_count(hyps, refs)
    if not refs:
        raise ValueError("exact_match of no sentence is undefined")
    return sum(list(h) == list(r) for h, r in zip(hyps, refs, strict=True)) / len(refs)


def token_error_rate(
    hyps: Sequence[Sequence[Hashable]], refs: Sequence[Sequence[Hashable]]
) -> float:
    """Corpus token error rate: total edit distance over total reference length.

    >>> token_error_rate(["abc", "xy"], ["abd", "xyz"])  # (1 + 1) / (3 + 3)
    0.3333333333333333
    """
    _same_count(hyps, refs)
    total = sum(len(r) for r in refs)
    if total == 0:
        raise ValueError("token_error_rate with empty references is undefined")
    return sum(edit_distance(h, r) for h, r in zip(hyps, refs, strict=True)) / total


def teacher_forced_accuracy(logits: Tensor, targets: Tensor, mask: Tensor) -> tuple[int, int]:
    """``(correct, counted)`` argmax predictions at the real positions of a batch.

    Args:
        logits: ``(B, T, V)``.  targets: ``(B, T)``.  mask: ``(B, T)`` bool.

    >>> logits = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    >>> teacher_forced_accuracy(logits, torch.tensor([[1, 1]]), torch.tensor([[True, True]]))
    (1, 2)
    """
    hits = torch.eq(logits.argmax(dim=-1), targets) & mask
    return int(hits.sum()), int(mask.sum())


def _same_count(hyps: Sequence[object], refs: Sequence[object]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
