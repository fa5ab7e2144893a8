"""How a transducer is scored: loss, perplexity and token accuracy under teacher forcing,
greedy or beam decoding of every source and the metrics of its outputs (exact match,
token and character error rates, BLEU), and the copy and nearest-neighbour baselines
scored with the same metrics."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from rnnkit.app.tasks.seq2seq_data import batch_to
from rnnkit.data.pairs import Pair, PairBatcher, make_pair_batch
from rnnkit.data.vocab import Vocabulary
from rnnkit.deferred import deferring
from rnnkit.metrics.losses import sequence_cross_entropy
from rnnkit.metrics.sequences import (
    bleu,
    character_error_rate,
    characters,
    exact_match,
    teacher_forced_accuracy,
    token_error_rate,
)
from rnnkit.models.decoder_only import DecoderOnlyTranslator
from rnnkit.models.lookup import NearestNeighbour
from rnnkit.models.seq2seq import Seq2Seq

__all__ = [
    "COPY_KIND",
    "baseline_metrics",
    "decode_ids",
    "decode_metrics",
    "nearest_kind",
    "output_metrics",
    "teacher_forced_metrics",
]


@torch.no_grad()
def teacher_forced_metrics(
    model: Seq2Seq | DecoderOnlyTranslator,
    sources: list[np.ndarray],
    targets: list[np.ndarray],
    device: torch.device,
    batch_size: int,
) -> dict[str, Any]:
    """Loss (nats per target token), perplexity and token accuracy under teacher forcing.

    The sums stay on the device: one host read for the whole evaluation (with the model's
    checks), not one per batch."""
    was_training = model.training
    model.eval()
    # float64, as the Python sum of each batch's float32 figure it replaces
    summed = torch.zeros((), dtype=torch.float64, device=device)
    hits = torch.zeros((), dtype=torch.int64, device=device)
    counted = torch.zeros((), dtype=torch.int64, device=device)
    # The model with a length mechanism (decoder-only models have none), or None.
    with_length = model if isinstance(model, Seq2Seq) and model.length is not None else None
    with deferring() as deferred:
        for batch in PairBatcher(sources, targets, batch_size=batch_size, shuffle=False):
            batch = batch_to(batch, device)
            if with_length is None:
                logits = model.target_logits(batch)  # (B, T, V_t)
                mask = batch.target_mask
                summed = summed + sequence_cross_entropy(
                    logits, batch.target_out, mask, reduction="sum"
                )
            else:
                # The exact sequence NLL (token terms plus the stop / length terms) over the
                # token steps, as in training; </s> is no token: its step is not scored.
                scored, logits = with_length.scored(batch)
                mask = with_length.token_mask(batch)
                summed = summed + scored.nats
            right, real = teacher_forced_accuracy(logits, batch.target_out, mask)
            hits, counted = hits + right, counted + real
        total, correct, count = deferred.read(summed, hits, counted)
    model.train(was_training)
    tokens = int(count)
    loss = total / max(tokens, 1)
    return {
        "loss_nats": loss,
        "tokens": tokens,
        "perplexity": math.exp(min(loss, 700)),
        "token_accuracy": int(correct) / max(tokens, 1),
    }


@torch.no_grad()
def decode_ids(
    model: Seq2Seq | DecoderOnlyTranslator,
    sources: list[np.ndarray],
    device: torch.device,
    batch_size: int,
    beam: int,
    max_length: int,
) -> list[list[int]]:
    """The best hypothesis for every source, decoded in length-sorted batches."""
    was_training = model.training
    model.eval()
    order = np.argsort([len(s) for s in sources], kind="stable")
    out: list[list[int]] = [[] for _ in sources]
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        batch = batch_to(make_pair_batch([sources[i] for i in idx], None), device)
        results = model.decode(batch.source, batch.source_mask, beam=beam, max_length=max_length)
        for i, hyps in zip(idx.tolist(), results, strict=True):
            out[i] = hyps[0].ids
    model.train(was_training)
    return out


def render_output(vocab: Vocabulary, ids: list[int]) -> str:
    # Specials stay visible (an <unk> in an output is worth seeing); </s> is never in ids.
    return vocab.decode(ids, skip_specials=False)


def decode_metrics(
    model: Seq2Seq | DecoderOnlyTranslator,
    pairs: list[Pair],
    sources: list[np.ndarray],
    target_vocab: Vocabulary,
    device: torch.device,
    batch_size: int,
    beam: int,
    max_length: int,
) -> tuple[dict[str, Any], list[str]]:
    """Exact match, token and character error rates and BLEU of decoded outputs; also the
    rendered outputs."""
    hyp_ids = decode_ids(model, sources, device, batch_size, beam, max_length)
    # max_length steps leave room for </s>: an output that did not end is cut one shorter
    hyp_ids = [ids[: max_length - 1] for ids in hyp_ids]
    hyps = [[target_vocab.itos[i] for i in ids] for ids in hyp_ids]
    rendered = [render_output(target_vocab, ids) for ids in hyp_ids]
    metrics = output_metrics(hyps, pairs, target_vocab)
    metrics["beam"] = beam
    return metrics, rendered


def output_metrics(
    hyps: list[list[str]], pairs: list[Pair], target_vocab: Vocabulary
) -> dict[str, Any]:
    """Exact match, token and character error rates and BLEU of outputs (``hyps``: their
    tokens) against the pairs' targets. The character error rate reads both sides as
    :func:`~rnnkit.metrics.sequences.characters`: a special such as ``<unk>`` is one
    symbol, words are separated by one space."""
    refs = [target_vocab.tokenize(p.target) for p in pairs]
    unit = target_vocab.unit
    return {
        "exact_match": exact_match(hyps, refs),
        "token_error_rate": token_error_rate(hyps, refs),
        "character_error_rate": character_error_rate(
            [characters(h, unit) for h in hyps], [characters(r, unit) for r in refs]
        )
        if any(refs)
        else None,
        "bleu": bleu(hyps, refs),
        "sentences": len(pairs),
    }


COPY_KIND = "copy of the source"


def nearest_kind(nn: NearestNeighbour) -> str:
    """What the nearest-neighbour baseline is, saying so when it searched a subset."""
    if nn.searched < nn.total:
        return (
            f"nearest training source (edit distance; {nn.searched:,} of {nn.total:,} "
            "training pairs searched)"
        )
    return "nearest training source (edit distance)"


def baseline_metrics(
    nn: NearestNeighbour,
    pairs: list[Pair],
    sources: list[np.ndarray],
    target_vocab: Vocabulary,
) -> dict[str, dict[str, Any]]:
    """The two transduction baselines scored like the model's decoded outputs: the source
    copied as the output (``copy``), and the target of the nearest training source
    (``nearest_neighbour``)."""
    copied = [target_vocab.tokenize(p.source) for p in pairs]
    looked_up = [target.tolist() for target in nn.predict(sources)]
    return {
        "copy": {
            "kind": COPY_KIND,
            **output_metrics(copied, pairs, target_vocab),
        },
        "nearest_neighbour": {
            "kind": nearest_kind(nn),
            **output_metrics(
                [[target_vocab.itos[i] for i in ids] for ids in looked_up],
                pairs,
                target_vocab,
            ),
        },
    }
