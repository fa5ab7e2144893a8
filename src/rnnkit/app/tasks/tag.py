"""The tagging task: tagged sentences → vocabularies → batches → tagger → training → metrics.

Input is CoNLL-U (tag column ``--tag-column``, UPOS by default) or ``token<TAB>tag``
lines, detected per file (:mod:`rnnkit.data.tagged`). Without ``--valid`` a seeded random
``--valid-fraction`` of the sentences is held out. The run directory holds, besides
``config.json``, ``model.safetensors`` and the snapshots: ``vocab.json`` (the words),
``labels.json`` (the tag set, output order) and, with ``--char-rnn``, ``chars.json``.

Metrics (``evaluate --json``): ``loss_nats`` (mean per scored token), ``tokens`` (scored
tokens), ``perplexity`` (``exp(loss_nats)``), ``accuracy``; ``oov_accuracy`` over
``oov_tokens``, the tokens whose word is not in the training vocabulary (None when there
is none); ``macro_f1`` and per-tag ``per_tag_precision`` / ``per_tag_recall`` /
``per_tag_f1`` / ``per_tag_support``; for a BIO tag set ``span_precision``,
``span_recall``, ``span_f1`` (``conlleval`` rules). A gold tag the model was never
trained on cannot be scored: those tokens are left out of the loss, the accuracy and the
per-tag figures and reported as ``unknown_labels`` (their number) and
``unknown_label_counts`` (per tag); span F1 keeps them in the gold spans (a span of an
unknown type is a miss — the honest figure). Beside the model, the summary and
``evaluate`` give a baseline that gives every known word its most frequent training tag
and unknown words the most frequent tag overall (``baselines["most_frequent_tag"]``:
``accuracy``, ``oov_accuracy``, ``oov_tokens``; :class:`rnnkit.models.lookup.MostFrequentTag`,
kept in ``baseline.safetensors``), to show what the recurrence buys.

Also the helpers that the classification task shares (resume check, optimizer, the fit
and the summary).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.figures import loss_figures, per_class_figures
from rnnkit.app.tasks.fitting import check_resume, fit, run_summary
from rnnkit.app.tasks.run import (
    BASELINE_FILE,
    choose_device,
    finish_summary,
    guarded_run,
    load_baseline,
    load_config,
    load_pretrained_vectors,
    model_spec,
    save_baseline,
    save_config,
    seed_everything,
)
from rnnkit.data.batching import SequenceBatcher
from rnnkit.data.labelled import LabelSet, split_holdout
from rnnkit.data.tagged import TaggedSentence, read_tagged
from rnnkit.data.vocab import PAD_ID, UNK_ID, Vocabulary
from rnnkit.errors import CheckpointError, DataError
from rnnkit.metrics.labels import is_bio_tagset, span_prf
from rnnkit.models.language_model import LossOutput
from rnnkit.models.lookup import MostFrequentTag
from rnnkit.models.tagger import Tagger, build_tagger
from rnnkit.training.checkpoint import load_model_weights

__all__ = [
    "BASELINE_KIND",
    "MAX_WORD_CHARS",
    "EncodedTags",
    "TagData",
    "baseline_metrics",
    "encode_tagged",
    "evaluate",
    "evaluate_tag",
    "fit_baseline",
    "load_tagger",
    "predict_tags",
    "predictor",
    "tag_metrics",
    "train",
    "train_tag",
    "word_key",
]

# Words longer than this keep their first 2/3 and last 1/3 of characters: prefixes (a
# quote, a digit, "#") and suffixes (morphology) carry the signal, and compute stays
# bounded for long string literals and comments.
MAX_WORD_CHARS = 24
_WHITESPACE = re.compile(r"\s")


# -- data ----------------------------------------------------------------------------------


def word_key(token: str) -> str:
    """The vocabulary key of a token: whitespace inside it (CoNLL-U allows words with
    spaces) becomes ``␣``, so every word is one whitespace-free vocabulary entry.

    >>> word_key("New York")
    'New␣York'
    """
    return _WHITESPACE.sub("\u2423", token)


def _clip_word(token: str) -> str:
    if len(token) <= MAX_WORD_CHARS:
        return token
    head = 2 * MAX_WORD_CHARS // 3
    return token[:head] + token[-(MAX_WORD_CHARS - head) :]


@dataclass
class TagData:
    """The vocabularies of a tagging run."""

    vocab: Vocabulary  # words (unit "word", keys from word_key)
    tags: LabelSet
    chars: Vocabulary | None = None  # characters of the words (with --char-rnn)

    @classmethod
    def from_sentences(cls, sentences: list[TaggedSentence], cfg: TrainConfig) -> TagData:
        words = Counter(word_key(t) for s in sentences for t in s.tokens)
        vocab = Vocabulary.from_counts(words, unit="word", min_freq=cfg.min_freq, source=cfg.train)
        tags = LabelSet.from_data(t for s in sentences for t in s.tags)
        chars = None
        if cfg.char_rnn:
            counts = Counter(c for s in sentences for t in s.tokens for c in _clip_word(t))
            chars = Vocabulary.from_counts(counts, unit="char")
        return cls(vocab, tags, chars)

    def save(self, out: Path) -> None:
        self.vocab.save(out / "vocab.json")
        self.tags.save(out / "labels.json")
        if self.chars is not None:
            self.chars.save(out / "chars.json")

    @classmethod
    def load(cls, run_dir: Path, char_rnn: bool) -> TagData:
        chars = Vocabulary.load(run_dir / "chars.json") if char_rnn else None
        return cls(
            Vocabulary.load(run_dir / "vocab.json"), LabelSet.load(run_dir / "labels.json"), chars
        )


@dataclass
class EncodedTags:
    """Sentences as id arrays. ``tags`` holds ``len(tag set)`` for a tag the model does not
    know (never a target); ``chars[i]`` is ``(n_words, max_chars)`` with 0 padding."""

    sentences: list[TaggedSentence]
    words: list[np.ndarray]
    tags: list[np.ndarray]
    oov: list[np.ndarray]
    chars: list[np.ndarray] | None


def encode_tagged(
    sentences: list[TaggedSentence], data: TagData, max_len: int | None = None
) -> EncodedTags:
    """Encode sentences, cutting those longer than ``max_len`` into pieces (training)."""
    if max_len is not None:
        pieces = []
        for s in sentences:
            for lo in range(0, len(s.tokens), max_len):
                pieces.append(
                    TaggedSentence(s.tokens[lo : lo + max_len], s.tags[lo : lo + max_len], s.line)
                )
        sentences = pieces
    stoi, unknown_tag = data.vocab.stoi, len(data.tags)
    words, tags, oov, chars = [], [], [], []
    for s in sentences:
        w = np.array([stoi.get(word_key(t), UNK_ID) for t in s.tokens], dtype=np.int64)
        words.append(w)
        oov.append(w == UNK_ID)
        g = data.tags.get
        tags.append(
            np.array([unknown_tag if g(t) is None else g(t) for t in s.tags], dtype=np.int64)
        )
        if data.chars is not None:
            clipped = [_clip_word(t) for t in s.tokens]
            arr = np.full((len(clipped), max(len(t) for t in clipped)), PAD_ID, dtype=np.int64)
            for i, t in enumerate(clipped):
                arr[i, : len(t)] = data.chars.encode(t)
            chars.append(arr)
    return EncodedTags(sentences, words, tags, oov, chars if data.chars is not None else None)


def _char_batch(enc: EncodedTags, indices: Tensor, T: int) -> Tensor:
    assert enc.chars is not None
    arrays = [enc.chars[i] for i in indices.tolist()]
    width = max(a.shape[1] for a in arrays)
    out = np.full((len(arrays), T, width), PAD_ID, dtype=np.int64)  # (B, T, C)
    for row, a in enumerate(arrays):
        out[row, : a.shape[0], : a.shape[1]] = a
    return torch.from_numpy(out)


def _inputs(
    enc: EncodedTags, batch: Any, device: torch.device
) -> tuple[Tensor, Tensor, Tensor | None]:
    words, mask = batch.inputs.to(device), batch.mask.to(device)
    chars = None
    if enc.chars is not None:
        chars = _char_batch(enc, batch.indices, words.shape[1]).to(device)
    return words, mask, chars


# -- metrics -------------------------------------------------------------------------------


@torch.no_grad()
def tag_metrics(
    model: Tagger,
    enc: EncodedTags,
    data: TagData,
    device: torch.device,
    batch_size: int,
    full: bool = True,
) -> dict[str, Any]:
    """Loss, accuracy, OOV accuracy and (``full``) per-tag and span figures on ``enc``."""
    was_training = model.training
    model.eval()
    K = len(data.tags)
    batcher = SequenceBatcher(enc.words, enc.tags, batch_size=batch_size, shuffle=False)
    nats, scored = 0.0, 0
    predicted: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(enc.words)
    for batch in batcher:
        words, mask, chars = _inputs(enc, batch, device)
        tags = batch.targets.to(device)
        known = mask & (tags < K)
        logits = model(words, mask, chars)  # (B, T, K)
        if bool(known.any()):
            logp = torch.log_softmax(logits[known], dim=-1)
            nats -= float(logp.gather(1, tags[known].unsqueeze(1)).sum())
            scored += int(known.sum())
        pred = logits.argmax(-1).cpu().numpy()
        for row, i in enumerate(batch.indices.tolist()):
            predicted[i] = pred[row, : len(enc.words[i])]
    model.train(was_training)
    gold_ids = np.concatenate(enc.tags)
    pred_ids = np.concatenate(predicted)
    oov = np.concatenate(enc.oov)
    known = gold_ids < K
    correct = (gold_ids == pred_ids) & known
    n_oov = int((oov & known).sum())
    metrics: dict[str, Any] = {
        **loss_figures(nats, scored),
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
    pred_tags = [[labels[j] for j in p] for p in predicted]
    if is_bio_tagset(labels):
        spans = span_prf([s.tags for s in enc.sentences], pred_tags)
        metrics.update({f"span_{k}": spans[k] for k in ("precision", "recall", "f1")})
    if full:
        gold_known = [labels[j] for j in gold_ids[known]]
        pred_known = [labels[j] for j in pred_ids[known]]
        metrics.update(per_class_figures(gold_known, pred_known, labels, "per_tag"))
    return metrics


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


# -- train / evaluate ----------------------------------------------------------------------


def _word_dropout(cfg: TrainConfig) -> float:
    return float(cfg.word_dropout)


@guarded_run
def train_tag(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks: Any = None
) -> dict[str, Any]:
    """Train a tagger as ``cfg`` says; write the run directory; return the summary."""
    out = Path(cfg.out)
    device = choose_device(cfg.device)
    sentences, _ = read_tagged(cfg.train, cfg.tag_column)
    if cfg.valid:
        valid_sentences, _ = read_tagged(cfg.valid, cfg.tag_column)
    else:
        sentences, valid_sentences = split_holdout(sentences, cfg.valid_fraction, cfg.seed)
    if resume:
        check_resume(cfg, out)
        data = TagData.load(out, cfg.char_rnn)
    else:
        data = TagData.from_sentences(sentences, cfg)
    seed_everything(cfg.seed)
    train_enc = encode_tagged(sentences, data, cfg.max_len)
    valid_enc = encode_tagged(valid_sentences, data)
    K = len(data.tags)
    if not any(bool((t < K).any()) for t in valid_enc.tags):
        raise DataError("no validation token has a tag seen in training", cfg.valid or cfg.train)
    model = build_tagger(
        model_spec(cfg),
        len(data.vocab),
        K,
        len(data.chars) if data.chars is not None else None,
        word_dropout=_word_dropout(cfg),
    ).to(device)
    model.loss_reduction = cfg.loss_reduction
    pretrained = None if resume else load_pretrained_vectors(cfg, model.embedding, data.vocab.itos)
    batches = SequenceBatcher(
        train_enc.words, train_enc.tags, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed
    )

    def step(model: Tagger, batch: Any, carry: Any) -> LossOutput:
        words, mask, chars = _inputs(train_enc, batch, device)
        return model.loss(words, batch.targets.to(device), mask, chars)

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        data.save(out)
        save_config(out, cfg, vocab_size=len(data.vocab), num_labels=K)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    baseline = fit_baseline(train_enc, data)
    save_baseline(out, baseline.to_state())
    result, elapsed = fit(
        cfg,
        model,
        batches,
        step,
        lambda m: tag_metrics(m, valid_enc, data, device, cfg.batch_size, full=False),
        resume,
        quiet,
        callbacks,
    )
    summary = run_summary(
        "tag",
        result,
        elapsed,
        model,
        tags=data.tags.labels,
        vocab_size=len(data.vocab),
        **({"pretrained_vectors": pretrained} if pretrained else {}),
        baselines={"most_frequent_tag": baseline_metrics(baseline, valid_enc, K)},
    )
    return finish_summary(cfg, summary)


def load_tagger(run_dir: str | Path, device: str = "cpu") -> tuple[TrainConfig, TagData, Tagger]:
    """Load a trained tagger and its vocabularies (no code is unpickled)."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="tag")
    try:
        data = TagData.load(run_dir, cfg.char_rnn)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if info.get("vocab_size") != len(data.vocab) or info.get("num_labels") != len(data.tags):
        raise CheckpointError(f"{run_dir}: vocab.json/labels.json do not match config.json")
    model = build_tagger(
        model_spec(cfg),
        len(data.vocab),
        len(data.tags),
        len(data.chars) if data.chars is not None else None,
    ).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, data, model


def evaluate_tag(
    run_dir: str | Path, data_path: str, batch_size: int | None = None
) -> dict[str, Any]:
    """Score a tagged file (either format) with a trained tagger."""
    cfg, data, model = load_tagger(run_dir)
    sentences, _ = read_tagged(data_path, cfg.tag_column)
    enc = encode_tagged(sentences, data)
    device = next(model.parameters()).device
    metrics = tag_metrics(model, enc, data, device, batch_size or cfg.batch_size, full=True)
    baseline = _load_baseline(Path(run_dir), len(data.tags))
    if baseline is not None:
        metrics["baselines"] = {
            "most_frequent_tag": baseline_metrics(baseline, enc, len(data.tags))
        }
    return metrics


# The task interface of ``rnnkit.app.tasks.registry``.
train = train_tag
evaluate = evaluate_tag


# -- prediction on untagged text ----------------------------------------------------------


@torch.no_grad()
def predict_tags(
    model: Tagger, data: TagData, sentences: list[list[str]], batch_size: int = 32
) -> list[list[str]]:
    """The most probable tag of every token of every sentence (an empty sentence gets
    none). Tokens are as in the training file (one word each)."""
    model.eval()
    device = next(model.parameters()).device
    rows = [i for i, s in enumerate(sentences) if s]
    tagged = [TaggedSentence(sentences[i], [""] * len(sentences[i])) for i in rows]
    out: list[list[str]] = [[] for _ in sentences]
    if not tagged:
        return out
    enc = encode_tagged(tagged, data)
    labels = data.tags.labels
    for batch in SequenceBatcher(enc.words, batch_size=batch_size, shuffle=False):
        words, mask, chars = _inputs(enc, batch, device)
        pred = model.predict(words, mask, chars).cpu().numpy()
        for row, i in enumerate(batch.indices.tolist()):
            out[rows[i]] = [labels[j] for j in pred[row, : len(enc.words[i])]]
    return out


def predictor(run_dir: str | Path, batch_size: int | None = None, **_: Any) -> Any:
    """``rnnkit predict`` for a tagger: each input line is one sentence, tokens separated by
    whitespace; the result is ``{"tokens": [...], "tags": [...], "unknown": n}`` (``n``
    tokens outside the vocabulary)."""
    cfg, data, model = load_tagger(run_dir)
    bs = batch_size or cfg.batch_size

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sentences = [line.split() for line in lines]
        tags = predict_tags(model, data, sentences, bs)
        stoi = data.vocab.stoi
        return [
            {
                "tokens": s,
                "tags": t,
                "unknown": sum(word_key(w) not in stoi for w in s),
            }
            for s, t in zip(sentences, tags, strict=True)
        ]

    return run
