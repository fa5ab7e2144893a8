"""The classification task: ``label<TAB>text`` lines → vocabulary → batches → classifier
→ training → metrics.

Texts are read as characters or words (``--unit``); texts longer than ``--max-len``
tokens keep their first ``--max-len``. Without ``--valid`` a seeded random
``--valid-fraction`` of the examples is held out (a file sorted by label must not lose a
whole class to the tail). The run directory holds ``vocab.json`` (the text units) and
``labels.json`` (the classes, output order) besides the usual files.

Metrics (``evaluate --json``): ``loss_nats`` — mean cross-entropy per EXAMPLE (one
prediction per example); ``tokens`` — the number of scored examples (so that every task
reports what its loss is averaged over), also given as ``examples``; ``perplexity``
(``exp(loss_nats)``); ``accuracy``; ``macro_f1`` (unweighted mean of the per-class F1);
``labels`` and ``confusion_matrix`` (rows gold, columns predicted, in ``labels`` order);
``per_class_precision`` / ``per_class_recall`` / ``per_class_f1`` / ``per_class_support``.
An example whose label the model was never trained on cannot be scored: it is left out
of every figure above and reported as ``unknown_labels`` (count) and
``unknown_label_counts`` (per label).

Baselines, fitted on the training examples and scored beside the model in the summary
and by ``evaluate`` (``baselines``: ``accuracy``, ``macro_f1``): the majority class, and
a bag of n-grams — tf-idf unigram and bigram features of the same tokens the model reads,
and an L2-regularised multinomial logistic regression (:mod:`rnnkit.models.bow`). Word
order beyond a bigram is what the recurrent model has and they lack. Both are kept in
``baseline.safetensors``.

``--inputs vectors`` classifies real-valued sequences instead (JSON lines ``{"seq":
[[...], ...], "label": "walk"}`` or ``LABEL/*.csv``), with the same metrics and its own
baselines: :mod:`rnnkit.app.tasks.classify_vectors`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.classify_vectors import evaluate_vectors, train_vectors, vector_predictor
from rnnkit.app.tasks.figures import (
    loss_figures,
    no_known_label,
    one_label_only,
    per_class_figures,
)
from rnnkit.app.tasks.fitting import check_resume, fit, run_summary
from rnnkit.app.tasks.pretrained import load_pretrained_vectors
from rnnkit.app.tasks.run_config import (
    check_batch_size,
    check_labels,
    load_config,
    refuse_tabbed_line,
    save_config,
)
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.app.tasks.run_outputs import BASELINE_FILE, finish_summary, load_baseline, save_baseline
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import SequenceBatcher, to_device
from rnnkit.data.labelled import LabelledExample, LabelSet, read_labelled, split_holdout
from rnnkit.data.vocab import Vocabulary
from rnnkit.deferred import deferring
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.metrics.labels import confusion_matrix, macro_f1
from rnnkit.models.bow import BagOfNgrams
from rnnkit.models.classifier import Classifier, build_classifier
from rnnkit.models.language_model import LossOutput
from rnnkit.training.checkpoint import load_model_weights

#: What the bag-of-n-grams baseline is, as the summary and the report name it.
BOW_KIND = "bag of n-grams (tf-idf unigrams and bigrams, logistic regression)"

__all__ = [
    "BOW_KIND",
    "Baselines",
    "EncodedExamples",
    "baseline_metrics",
    "classify_metrics",
    "encode_examples",
    "evaluate",
    "evaluate_classify",
    "fit_baselines",
    "load_classifier",
    "predict_labels",
    "predictor",
    "train",
    "train_classify",
]


@dataclass
class EncodedExamples:
    """Examples as id arrays; ``labels[i]`` is ``len(label set)`` for an unknown label."""

    examples: list[LabelledExample]
    inputs: list[np.ndarray]
    labels: np.ndarray


def encode_examples(
    examples: list[LabelledExample],
    vocab: Vocabulary,
    labels: LabelSet,
    max_len: int,
    path: str | None = None,
) -> EncodedExamples:
    """Encode texts (first ``max_len`` tokens) and labels; an empty text is a DataError.

    >>> ex = [LabelledExample("a", "xy", 1), LabelledExample("zz", "y", 2)]
    >>> enc = encode_examples(ex, Vocabulary(["x", "y"]), LabelSet(["a", "b"]), max_len=8)
    >>> [i.tolist() for i in enc.inputs], enc.labels.tolist()
    ([[4, 5], [5]], [0, 2])
    """
    unknown = len(labels)
    inputs, ids = [], []
    for ex in examples:
        # a word spelled <pad>, <s> or </s> is a word of the text, never the special
        x = vocab.encode_array(ex.text, dtype=np.int64, literal_specials=False)[:max_len]
        if len(x) == 0:  # e.g. a word-unit text of only whitespace-like characters
            raise DataError("empty text (no tokens)", path, ex.line)
        inputs.append(x)
        index = labels.get(ex.label)
        ids.append(unknown if index is None else index)
    return EncodedExamples(examples, inputs, np.array(ids, dtype=np.int64))


@torch.no_grad()
def classify_metrics(
    model: Classifier,
    enc: EncodedExamples,
    labels: LabelSet,
    device: torch.device,
    batch_size: int,
    full: bool = True,
) -> dict[str, Any]:
    """Loss per example, accuracy, macro-F1, confusion matrix (``full``: per class too).

    The summed loss and every batch's predictions stay on the device until the end: one
    host read for the whole evaluation (with the model's input checks), not one per batch.
    The predictions kept there are 8 bytes an example (80 MB for ten million)."""
    was_training = model.training
    model.eval()
    K = len(labels)
    predicted = np.zeros(len(enc.inputs), dtype=np.int64)
    nats = torch.zeros((), dtype=torch.float64, device=device)
    best: list[Tensor] = []
    rows: list[np.ndarray] = []
    with deferring() as deferred:
        for batch in SequenceBatcher(enc.inputs, batch_size=batch_size, shuffle=False):
            logits = model(to_device(batch.inputs, device), move_mask(batch.mask, device))
            index = batch.indices.numpy()
            gold = enc.labels[index]  # on the host: which examples count is known here
            known = gold < K
            # an unknown label (K) is no class: scored as 0, then left out of the sum
            safe = to_device(torch.from_numpy(np.where(known, gold, 0)), device)
            each = F.cross_entropy(logits, safe, reduction="none")  # (B,)
            scored = torch.where(to_device(torch.from_numpy(known), device), each, 0.0)
            nats = nats + scored.sum(dtype=torch.float64)
            best.append(logits.argmax(-1))
            rows.append(index)
        total = 0.0
        if best:
            summed, argmax = deferred.fetch(nats, torch.cat(best))
            total = float(summed)
            predicted[np.concatenate(rows)] = argmax.numpy()
    model.train(was_training)
    labelled = enc.labels < K  # examples of a class the model knows
    n = int(labelled.sum())
    gold_names = [labels.labels[i] for i in enc.labels[labelled]]
    pred_names = [labels.labels[i] for i in predicted[labelled]]
    unknown = Counter(ex.label for ex, k in zip(enc.examples, labelled, strict=True) if not k)
    metrics: dict[str, Any] = {
        **loss_figures(total, n),
        "tokens": n,
        "examples": n,
        "accuracy": float((predicted[labelled] == enc.labels[labelled]).mean()) if n else None,
        **per_class_figures(gold_names, pred_names, labels.labels, "per_class"),
        "unknown_labels": sum(unknown.values()),
        "unknown_label_counts": dict(sorted(unknown.items())),
    }
    if full:
        metrics["labels"] = labels.labels
        metrics["confusion_matrix"] = confusion_matrix(gold_names, pred_names, labels.labels)
    else:  # per-class dicts are for the final report, not every validation line
        for key in [k for k in metrics if k.startswith("per_class_")]:
            del metrics[key]
    return metrics


@dataclass
class Baselines:
    """The classify baselines: the majority class of the training data, and the
    bag-of-n-grams logistic regression (:class:`rnnkit.models.bow.BagOfNgrams`)."""

    majority: int
    bow: BagOfNgrams

    def to_state(self) -> dict[str, np.ndarray]:
        return {"majority": np.array([self.majority], dtype=np.int64), **self.bow.to_state()}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray], num_labels: int, where: str) -> Baselines:
        bow = BagOfNgrams.from_state(state, where=where)
        try:
            majority = int(np.asarray(state["majority"]).reshape(-1)[0])
        except (KeyError, IndexError, ValueError, TypeError):
            majority = -1
        if not 0 <= majority < num_labels or bow.num_classes != num_labels:
            raise CheckpointError(f"{where}: the baseline does not match labels.json")
        return cls(majority, bow)


def fit_baselines(train: EncodedExamples, vocab_size: int, num_labels: int) -> Baselines:
    """Both baselines, fitted on the training examples (their first ``--max-len`` tokens,
    as the model reads them)."""
    known = train.labels < num_labels
    # The most frequent label; of equally frequent ones, the first in label order.
    majority = int(np.bincount(train.labels[known], minlength=num_labels).argmax())
    texts = [x for x, k in zip(train.inputs, known, strict=True) if k]
    bow = BagOfNgrams(vocab_size, num_labels).fit(texts, train.labels[known])
    return Baselines(majority, bow)


def baseline_metrics(
    baselines: Baselines, enc: EncodedExamples, labels: LabelSet
) -> dict[str, dict[str, Any]]:
    """Accuracy and macro-F1 of both baselines on ``enc`` (examples of a known label)."""
    K = len(labels)
    known = enc.labels < K
    gold = enc.labels[known]
    texts = [x for x, k in zip(enc.inputs, known, strict=True) if k]
    predicted = {
        "majority": np.full(len(gold), baselines.majority),
        "bag_of_ngrams": baselines.bow.predict(texts),
    }
    kinds = {
        "majority": f"majority class ({labels.labels[baselines.majority]})",
        "bag_of_ngrams": BOW_KIND,
    }
    out = {}
    for name, pred in predicted.items():
        gold_names = [labels.labels[i] for i in gold]
        pred_names = [labels.labels[i] for i in pred]
        out[name] = {
            "kind": kinds[name],
            "accuracy": float((pred == gold).mean()) if len(gold) else None,
            # over the classes present in gold or predicted labels, as for the model
            "macro_f1": macro_f1(gold_names, pred_names) if len(gold) else None,
        }
    return out


def _load_baselines(run_dir: Path, labels: LabelSet) -> Baselines | None:
    arrays = load_baseline(run_dir)
    if arrays is None:
        return None
    return Baselines.from_state(arrays, len(labels), str(run_dir / BASELINE_FILE))


def _read_split(cfg: TrainConfig) -> tuple[list[LabelledExample], list[LabelledExample]]:
    examples = read_labelled(cfg.train)
    if cfg.valid:
        return examples, read_labelled(cfg.valid)
    return split_holdout(examples, cfg.valid_fraction, cfg.seed, cfg.train)


@guarded_run
def train_classify(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks: Any = None
) -> dict[str, Any]:
    """Train a classifier as ``cfg`` says; write the run directory; return the summary."""
    if cfg.inputs == "vectors":  # real-valued sequences: rnnkit.app.tasks.classify_vectors
        if cfg.pretrained_vectors is not None:
            raise ConfigError("--pretrained-vectors needs text inputs (--inputs text)")
        return train_vectors(cfg, resume, quiet, callbacks)
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    train_examples, valid_examples = _read_split(cfg)
    if resume:
        check_resume(cfg, out)
        vocab = Vocabulary.load(out / "vocab.json")
        labels = LabelSet.load(out / "labels.json")
        found = LabelSet.from_data(ex.label for ex in train_examples)
        check_labels(out, labels, found, cfg.train)
    else:
        text = "\n".join(ex.text for ex in train_examples)
        vocab = Vocabulary.from_text(text, unit=cfg.unit, min_freq=cfg.min_freq, source=cfg.train)
        labels = LabelSet.from_data(ex.label for ex in train_examples)
        held = () if cfg.valid else (ex.label for ex in valid_examples)
        one_label_only(cfg.train, labels.labels, "example", "label", held_out=held)
    seed_everything(cfg.seed)
    train_enc = encode_examples(train_examples, vocab, labels, cfg.max_len, cfg.train)
    valid_enc = encode_examples(valid_examples, vocab, labels, cfg.max_len, cfg.valid or cfg.train)
    K = len(labels)
    if not bool((valid_enc.labels < K).any()):
        raise DataError(
            "no validation example has a label seen in training", cfg.valid or cfg.train
        )
    model = build_classifier(model_spec(cfg), len(vocab), K).to(device)
    assert model.embedding is not None  # token inputs: build_classifier embeds them
    pretrained = (
        None
        if resume
        else load_pretrained_vectors(cfg, model.embedding, vocab.itos, literal_specials=False)
    )
    batches = SequenceBatcher(
        train_enc.inputs,
        batch_size=cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        bucket=cfg.batch_order == "length",
    )
    train_labels = torch.from_numpy(train_enc.labels)

    def step(model: Classifier, batch: Any, carry: Any) -> LossOutput:
        return model.loss(
            to_device(batch.inputs, device),
            to_device(train_labels[batch.indices], device),
            move_mask(batch.mask, device),
        )

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        vocab.save(out / "vocab.json")
        labels.save(out / "labels.json")
        save_config(out, cfg, vocab_size=len(vocab), num_labels=K)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    baselines = fit_baselines(train_enc, len(vocab), K)
    save_baseline(out, baselines.to_state())
    result, elapsed = fit(
        cfg,
        model,
        batches,
        step,
        lambda m: classify_metrics(m, valid_enc, labels, device, cfg.batch_size, full=False),
        resume,
        quiet,
        callbacks,
    )
    summary = run_summary(
        "classify",
        result,
        elapsed,
        model,
        labels=labels.labels,
        vocab_size=len(vocab),
        **({"pretrained_vectors": pretrained} if pretrained else {}),
        baselines=baseline_metrics(baselines, valid_enc, labels),
    )
    return finish_summary(cfg, summary, result)


def load_classifier(
    run_dir: str | Path, device: str = "cpu"
) -> tuple[TrainConfig, Vocabulary, LabelSet, Classifier]:
    """Load a trained classifier, its vocabulary and label set (no code is unpickled).

    A run of real-valued sequences (``--inputs vectors``) has no vocabulary: it loads with
    :func:`~rnnkit.app.tasks.classify_vectors.load_vector_classifier`."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="classify")
    if cfg.inputs == "vectors":
        raise CheckpointError(
            f"{run_dir}: a classifier of real-valued sequences (--inputs vectors): "
            "load it with rnnkit.app.tasks.classify_vectors.load_vector_classifier"
        )
    try:
        vocab = Vocabulary.load(run_dir / "vocab.json")
        labels = LabelSet.load(run_dir / "labels.json")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if info.get("vocab_size") != len(vocab) or info.get("num_labels") != len(labels):
        raise CheckpointError(f"{run_dir}: vocab.json/labels.json do not match config.json")
    model = build_classifier(model_spec(cfg), len(vocab), len(labels)).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, vocab, labels, model


def evaluate_classify(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score a ``label<TAB>text`` file (or labelled sequences, ``--inputs vectors``) with a
    trained classifier."""
    check_batch_size(batch_size)
    if load_config(run_dir, task="classify")[0].inputs == "vectors":
        return evaluate_vectors(run_dir, data_path, batch_size, device)
    cfg, vocab, labels, model = load_classifier(run_dir, device)
    enc = encode_examples(read_labelled(data_path), vocab, labels, cfg.max_len, data_path)
    if len(enc.labels) and not bool((enc.labels < len(labels)).any()):
        found = (ex.label for ex in enc.examples)
        raise no_known_label(data_path, found, labels.labels, "example", "label")
    model_device = next(model.parameters()).device
    metrics = classify_metrics(model, enc, labels, model_device, batch_size or cfg.batch_size)
    baselines = _load_baselines(Path(run_dir), labels)
    if baselines is not None and bool((enc.labels < len(labels)).any()):
        metrics["baselines"] = baseline_metrics(baselines, enc, labels)
    return metrics


# The task interface of ``rnnkit.app.tasks.registry``.
train = train_classify
evaluate = evaluate_classify


@torch.no_grad()
def predict_labels(model: Classifier, inputs: list[np.ndarray], batch_size: int = 32) -> np.ndarray:
    """Class probabilities ``(N, K)`` (softmax of the logits) of encoded, non-empty texts."""
    model.eval()
    device = next(model.parameters()).device
    rows: dict[int, np.ndarray] = {}
    for batch in SequenceBatcher(inputs, batch_size=batch_size, shuffle=False):
        probs = F.softmax(
            model(to_device(batch.inputs, device), move_mask(batch.mask, device)), dim=-1
        )
        for i, p in zip(batch.indices.tolist(), probs.double().cpu().numpy(), strict=True):
            rows[i] = p
    return np.stack([rows[i] for i in range(len(inputs))]) if inputs else np.zeros((0, 0))


def predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu", **_: Any
) -> Any:
    """``rnnkit predict`` for a classifier: each input line is one text (the first
    ``--max-len`` tokens are read, as in training); the result is ``{"label": best,
    "probabilities": {label: p, ...}, "tokens": n, "unknown": n}``, ``tokens`` those read
    and ``unknown`` those of them outside the vocabulary (never more than ``tokens``). A
    line without tokens is a DataError naming it. A run of real-valued sequences reads one
    JSON sequence a line (:func:`~rnnkit.app.tasks.classify_vectors.vector_predictor`)."""
    check_batch_size(batch_size)
    if load_config(run_dir, task="classify")[0].inputs == "vectors":
        return vector_predictor(run_dir, batch_size, device)
    cfg, vocab, labels, model = load_classifier(run_dir, device)
    bs = batch_size or cfg.batch_size

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        inputs, unknown = [], []
        for text, (path, line) in zip(lines, where, strict=True):
            refuse_tabbed_line(text, path, line, "text", "label<TAB>text")
            # the unknown tokens the model reads: those past --max-len are never read
            ids, n_unknown = vocab.encode_with_unknown(
                text, max_tokens=cfg.max_len, literal_specials=False
            )
            if not ids:
                raise DataError("empty text (no tokens to classify)", path, line)
            inputs.append(np.array(ids, dtype=np.int64))
            unknown.append(n_unknown)
        probs = predict_labels(model, inputs, bs)
        names = labels.labels
        return [
            {
                "label": names[int(p.argmax())],
                "probabilities": {n: float(v) for n, v in zip(names, p, strict=True)},
                "tokens": len(x),
                "unknown": u,
            }
            for p, x, u in zip(probs, inputs, unknown, strict=True)
        ]

    return run
