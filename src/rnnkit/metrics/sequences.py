"""Metrics of transduction: exact match, token error rate, token accuracy (teacher forcing).

* **exact match**: the share of sentences whose hypothesis equals the reference, token
  for token.
* **token error rate**: ``Σ edit_distance(hyp, ref) / Σ len(ref)`` over the corpus (edit
  distance = Levenshtein: insertions, deletions, substitutions, each cost 1). It can
  exceed 1 (hypotheses longer than the references).
* **character error rate**: the same on the rendered outputs, character by character
  (``Σ edit_distance / Σ len(reference)``), whatever the target unit; a special symbol
  such as ``<unk>`` is ONE symbol, not the five characters of its name, and words are
  separated by one space (:func:`characters`).
* **BLEU** (Papineni et al. 2002, corpus level, 0–100): the geometric mean of the clipped
  1- to 4-gram precisions times the brevity penalty ``min(1, exp(1 − r/c))``, with
  sacreBLEU's default ``exp`` smoothing of a zero count (the k-th zero precision becomes
  ``1 / (2^k · total)``; no n-gram right at all is 0), on the given tokens (no further
  tokenisation): the figure of
  ``sacrebleu.corpus_bleu(hyps, [refs], tokenize="none")`` on space-joined tokens.
* **token accuracy under teacher forcing**: the share of target positions (``</s>``
  included) where the model's most probable next token, given the TRUE prefix, is the
  reference token.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from rnnkit.data.vocab import SPECIALS
from rnnkit.deferred import count_of

__all__ = [
    "bleu",
    "character_error_rate",
    "characters",
    "edit_distance",
    "exact_match",
    "teacher_forced_accuracy",
    "token_error_rate",
]


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


def characters(tokens: Sequence[str], unit: str) -> list[str]:
    """The symbols a character error rate counts in a token sequence: each character of a
    regular token, a special (``<pad> <unk> <s> </s>``) as one symbol, and one space
    between words (``unit="word"``).

    >>> characters(["ab", "<unk>", "c"], "word")
    ['a', 'b', ' ', '<unk>', ' ', 'c']
    >>> characters(["a", "<unk>"], "char")
    ['a', '<unk>']
    """
    out: list[str] = []
    for i, token in enumerate(tokens):
        if unit == "word" and i:
            out.append(" ")
        if token in SPECIALS:
            out.append(token)
        else:
            out.extend(token)
    return out


def character_error_rate(
    hyps: Sequence[Sequence[Hashable]], refs: Sequence[Sequence[Hashable]]
) -> float:
    """Corpus character error rate (see the module doc) of strings, or of symbol lists
    (:func:`characters`, where a special is one symbol).

    >>> character_error_rate(["the cat", "a"], ["the bat", "ab"])  # (1 + 1) / (7 + 2)
    0.2222222222222222
    >>> character_error_rate([characters(["<unk>", "b"], "char")], ["ab"])  # one substitution
    0.5
    """
    _same_count(hyps, refs)
    return token_error_rate([list(h) for h in hyps], [list(r) for r in refs])


def bleu(
    hyps: Sequence[Sequence[Hashable]], refs: Sequence[Sequence[Hashable]], max_order: int = 4
) -> float:
    """Corpus BLEU (0–100) of token sequences against one reference each (module doc).

    >>> round(bleu([list("abcde")], [list("abcde")]), 6)
    100.0
    >>> round(bleu([list("abcd")], [list("abcde")]), 4)  # all n-grams right, too short
    77.8801
    """
    _same_count(hyps, refs)
    if not refs:
        raise ValueError("bleu of no sentence is undefined")
    correct = [0] * max_order
    total = [0] * max_order
    hyp_len = ref_len = 0
    for h, r in zip(hyps, refs, strict=True):
        h, r = list(h), list(r)
        hyp_len, ref_len = hyp_len + len(h), ref_len + len(r)
        for n in range(1, max_order + 1):
            h_grams = Counter(tuple(h[i : i + n]) for i in range(len(h) - n + 1))
            r_grams = Counter(tuple(r[i : i + n]) for i in range(len(r) - n + 1))
            correct[n - 1] += sum(min(c, r_grams[g]) for g, c in h_grams.items())
            total[n - 1] += max(len(h) - n + 1, 0)
    if hyp_len == 0 or not any(correct):  # nothing right: 0, as sacreBLEU, not smoothed
        return 0.0
    log_precision = 0.0
    zeros = 1.0
    for c, t in zip(correct, total, strict=True):
        if t == 0:  # no n-gram of this order in any hypothesis: BLEU is 0 (as sacreBLEU)
            return 0.0
        if c == 0:
            zeros *= 2.0
            log_precision += math.log(1.0 / (zeros * t))
        else:
            log_precision += math.log(c / t)
    brevity = 0.0 if hyp_len >= ref_len else 1.0 - ref_len / hyp_len
    return 100.0 * math.exp(brevity + log_precision / max_order)


def teacher_forced_accuracy(
    logits: Tensor, targets: Tensor, mask: Tensor
) -> tuple[int | Tensor, int | Tensor]:
    """``(correct, counted)`` argmax predictions at the real positions of a batch (0-dim
    tensors inside :func:`rnnkit.deferred.deferring`, read with its figures).

    Args:
        logits: ``(B, T, V)``.  targets: ``(B, T)``.  mask: ``(B, T)`` bool.

    >>> logits = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    >>> teacher_forced_accuracy(logits, torch.tensor([[1, 1]]), torch.tensor([[True, True]]))
    (1, 2)
    """
    hits = torch.eq(logits.argmax(dim=-1), targets) & mask
    return count_of(hits.sum()), count_of(mask.sum())


def _same_count(hyps: Sequence[object], refs: Sequence[object]) -> None:
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses for {len(refs)} references")
