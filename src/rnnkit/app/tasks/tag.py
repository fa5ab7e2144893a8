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
trained on cannot be scored: those tokens are left out of every figure (the loss, the
accuracy, the per-tag and the span figures) and reported as ``unknown_labels`` (their
number) and ``unknown_label_counts`` (per tag); for the spans such a token is ``O`` in
the gold and the predicted tags alike (:func:`~rnnkit.app.tasks.tag_metrics.span_tags`).
A tag with no gold token and no prediction has ``None`` precision, recall and F1 (support
0), and ``macro_f1`` leaves it out. Beside the model, the summary and
``evaluate`` give a baseline that gives every known word its most frequent training tag
and unknown words the most frequent tag overall (``baselines["most_frequent_tag"]``:
``accuracy``, ``oov_accuracy``, ``oov_tokens``; :class:`rnnkit.models.lookup.MostFrequentTag`,
kept in ``baseline.safetensors``), to show what the recurrence buys.

A word's vocabulary key, the run's vocabularies and the encoded sentences are in
:mod:`rnnkit.app.tasks.tag_data`; the metrics and the baseline in
:mod:`rnnkit.app.tasks.tag_metrics`. This module trains, evaluates, loads and predicts,
and exports their names as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.figures import no_known_label, one_label_only
from rnnkit.app.tasks.fitting import check_resume, fit, run_summary
from rnnkit.app.tasks.pretrained import load_pretrained_vectors
from rnnkit.app.tasks.run_config import check_batch_size, load_config, save_config
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import finish_summary, save_baseline
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything
from rnnkit.app.tasks.tag_data import (
    MAX_WORD_CHARS,
    EncodedTags,
    TagData,
    _inputs,
    encode_tagged,
    unknown_words,
    word_key,
)
from rnnkit.app.tasks.tag_metrics import (
    BASELINE_KIND,
    _load_baseline,
    baseline_metrics,
    fit_baseline,
    tag_metrics,
)
from rnnkit.data.batching import SequenceBatcher, to_device
from rnnkit.data.labelled import split_holdout
from rnnkit.data.tagged import TaggedSentence, check_tag_column, read_tagged
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.models.language_model import LossOutput
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
    "sentence_tokens",
    "tag_metrics",
    "train",
    "train_tag",
    "word_key",
]

# -- train / evaluate ----------------------------------------------------------------------


def _word_dropout(cfg: TrainConfig) -> float:
    return float(cfg.word_dropout)


@guarded_run
def train_tag(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks: Any = None
) -> dict[str, Any]:
    """Train a tagger as ``cfg`` says; write the run directory; return the summary."""
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    check_tag_column(cfg.tag_column, "--tag-column")  # the readers name their column=
    sentences, form = read_tagged(cfg.train, cfg.tag_column)
    if form == "tsv" and cfg.tag_column != "upos":  # it would be read past, unused
        raise ConfigError(
            f"--tag-column {cfg.tag_column}: {cfg.train} is token<TAB>tag, not CoNLL-U: it "
            "has no columns to choose from (leave --tag-column out)"
        )
    if cfg.valid:
        valid_sentences, _ = read_tagged(cfg.valid, cfg.tag_column)
    else:
        sentences, valid_sentences = split_holdout(
            sentences, cfg.valid_fraction, cfg.seed, cfg.train
        )
    if resume:
        check_resume(cfg, out)
        data = TagData.load(out, cfg.char_rnn)
    else:
        data = TagData.from_sentences(sentences, cfg)
        held = () if cfg.valid else (t for s in valid_sentences for t in s.tags)
        one_label_only(
            cfg.train, data.tags.labels, "token", "tag", held_out=held, empty_field=form == "conllu"
        )
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
    pretrained = (
        None
        if resume
        else load_pretrained_vectors(cfg, model.embedding, data.vocab.itos, literal_specials=False)
    )
    batches = SequenceBatcher(
        train_enc.words,
        train_enc.tags,
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        bucket=cfg.batch_order == "length",
    )

    def step(model: Tagger, batch: Any, carry: Any) -> LossOutput:
        words, mask, chars = _inputs(train_enc, batch, device)
        return model.loss(words, to_device(batch.targets, device), mask, chars)

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
    return finish_summary(cfg, summary, result)


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
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score a tagged file (either format) with a trained tagger."""
    check_batch_size(batch_size)
    cfg, data, model = load_tagger(run_dir, device)
    sentences, _ = read_tagged(data_path, cfg.tag_column)
    enc = encode_tagged(sentences, data)
    K = len(data.tags)
    if enc.tags and not any(bool((t < K).any()) for t in enc.tags):
        found = (tag for s in enc.sentences for tag in s.tags)
        raise no_known_label(data_path, found, data.tags.labels, "token", "tag")
    model_device = next(model.parameters()).device
    metrics = tag_metrics(model, enc, data, model_device, batch_size or cfg.batch_size, full=True)
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


def sentence_tokens(text: str, path: str | None = None, line: int | None = None) -> list[str]:
    """The tokens of one line to tag: separated by tabs where the line holds a tab (a token
    may then hold spaces, as a token of a ``token<TAB>tag`` file may: ``' '``, the Python
    string of one space), else by whitespace; a blank line (whitespace, tabs too) is a
    sentence of no tokens. Each tab-separated token is read as a ``token<TAB>tag`` file's
    is, without the spaces around it, and a blank one is a ``DataError`` naming it.

    >>> sentence_tokens("John met  Mary"), sentence_tokens("print\\t' '\\t 'a b' \\r\\n")
    (['John', 'met', 'Mary'], ['print', "' '", "'a b'"])
    >>> sentence_tokens(" \\t ")
    []
    """
    if "\t" not in text or not text.strip():
        return text.split()
    tokens = [t.strip() for t in text.rstrip("\r\n").split("\t")]
    for i, token in enumerate(tokens, 1):
        if not token:
            raise DataError(
                f"token {i} of {len(tokens)} is empty (tab-separated tokens: two tabs "
                "together, a tab at an end of the line, or only spaces between tabs)",
                path,
                line,
            )
    return tokens


def predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu", **_: Any
) -> Any:
    """``rnnkit predict`` for a tagger: each input line is one sentence, tokens separated by
    whitespace, or by tabs where the line holds one (:func:`sentence_tokens`); the result
    is ``{"tokens": [...], "tags": [...], "unknown": n}`` (``n`` tokens outside the
    vocabulary, words spelled ``<pad>``, ``<s>`` or ``</s>`` among them:
    :func:`~rnnkit.app.tasks.tag_data.unknown_words`)."""
    check_batch_size(batch_size)
    cfg, data, model = load_tagger(run_dir, device)
    bs = batch_size or cfg.batch_size

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sentences = [sentence_tokens(t, p, n) for t, (p, n) in zip(lines, where, strict=True)]
        tags = predict_tags(model, data, sentences, bs)
        return [
            {"tokens": s, "tags": t, "unknown": unknown_words(data.vocab, s)}
            for s, t in zip(sentences, tags, strict=True)
        ]

    return run
