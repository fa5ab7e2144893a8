"""``classify --inputs vectors``: one label per real-valued sequence (the activity in a
video: frames ``x_1 … x_T ∈ R^D``, one class), read as the ``regress`` task reads its
sequences (:mod:`rnnkit.data.vectors`): JSON lines ``{"seq": [[...], ...], "label":
"walk"}``, or a directory ``LABEL/*.csv`` of one sequence per file.

The model is the text classifier without its embedding: the stack reads the frames
(the first ``--max-len`` of each), ``--pooling`` turns its states into one vector, the
feed-forward head gives the class (:func:`~rnnkit.models.classifier.build_vector_classifier`).
The metrics are the text classifier's (``loss_nats`` per sequence, ``accuracy``,
``macro_f1``, per-class figures, confusion matrix, ``unknown_labels``).

Baselines, fitted on the training sequences and scored beside the model: the
``majority`` class, and ``mean_last_frame``: an L2-regularised multinomial logistic
regression (C = 10, :func:`~rnnkit.models.bow.fit_logistic`) on ``[mean frame; last
frame]`` (``2D`` features, each standardised by its training mean and standard
deviation) — what a model that ignores the order of the frames, but for the last one,
can do. Both are kept in ``baseline.safetensors``.

Run directory: ``config.json`` (with ``input_size`` and ``num_labels``), ``labels.json``,
``model.safetensors``, ``baseline.safetensors``, ``summary.json``, snapshots and
``metrics.jsonl``; no vocabulary.
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
from torch.nn.utils.rnn import pad_sequence

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.figures import (
    loss_figures,
    no_known_label,
    one_label_only,
    per_class_figures,
)
from rnnkit.app.tasks.fitting import check_resume, fit, run_summary
from rnnkit.app.tasks.run_config import check_batch_size, check_labels, load_config, save_config
from rnnkit.app.tasks.run_outputs import finish_summary, load_baseline, save_baseline
from rnnkit.app.tasks.settings import choose_device, model_spec, seed_everything
from rnnkit.bptt.mask_facts import move_mask
from rnnkit.data.batching import SequenceBatcher, to_device
from rnnkit.data.labelled import LabelSet, split_holdout
from rnnkit.data.limits import loads_json
from rnnkit.data.vectors import VectorSequence, parse_vector_line, read_vector_sequences
from rnnkit.deferred import deferring
from rnnkit.errors import CheckpointError, DataError
from rnnkit.metrics.labels import confusion_matrix, macro_f1
from rnnkit.models.bow import BOW_C, fit_logistic
from rnnkit.models.classifier import Classifier, build_vector_classifier
from rnnkit.models.language_model import LossOutput
from rnnkit.training.checkpoint import load_model_weights

__all__ = [
    "FRAMES_KIND",
    "FrameBaselines",
    "VectorExamples",
    "encode_vectors",
    "evaluate_vectors",
    "label_sequences",
    "load_vector_classifier",
    "train_vectors",
    "vector_predictor",
]

#: What the frame baseline is, as the summary and the report name it.
FRAMES_KIND = "logistic regression on the mean and the last frame"


@dataclass
class VectorExamples:
    """Sequences as ``(T_i, D)`` tensors (the first ``--max-len`` frames); ``labels[i]``
    is ``len(label set)`` for a label the run does not know."""

    sequences: list[VectorSequence]
    inputs: list[Tensor]
    labels: np.ndarray


def encode_vectors(
    seqs: list[VectorSequence], labels: LabelSet, max_len: int, width: int | None = None
) -> VectorExamples:
    """Frames (first ``max_len``) and class ids; ``width``: the ``D`` every frame must have
    (the run's), a DataError naming the file and line otherwise."""
    unknown = len(labels)
    inputs, ids = [], []
    for s in seqs:
        if width is not None and s.values.shape[1] != width:
            raise DataError(
                f"frames have {s.values.shape[1]} values, the run's {width}", s.path, s.line
            )
        inputs.append(torch.from_numpy(s.values[:max_len]))
        index = labels.get(s.label or "")
        ids.append(unknown if index is None else index)
    return VectorExamples(seqs, inputs, np.array(ids, dtype=np.int64))


def _batches(
    inputs: list[Tensor], batch_size: int, shuffle: bool, seed: int = 0, bucket: bool = True
) -> Any:
    lengths = [np.zeros(len(x), dtype=np.int64) for x in inputs]  # only the lengths count
    return SequenceBatcher(
        lengths, batch_size=batch_size, shuffle=shuffle, seed=seed, bucket=bucket
    )


def _frames(inputs: list[Tensor], batch: Any, device: torch.device) -> tuple[Tensor, Tensor]:
    """The padded frames ``(B, T, D)`` of a batch and its mask ``(B, T)``."""
    x = pad_sequence([inputs[i] for i in batch.indices.tolist()], batch_first=True)
    return to_device(x, device), move_mask(batch.mask, device)


@torch.no_grad()
def _probabilities(model: Classifier, inputs: list[Tensor], batch_size: int) -> np.ndarray:
    """Class probabilities ``(N, K)`` of every sequence, read from the device once (with
    the model's checks), not once a batch."""
    model.eval()
    if not inputs:
        return np.zeros((0, model.num_classes))
    device = next(model.parameters()).device
    parts: list[Tensor] = []
    order: list[np.ndarray] = []
    with deferring() as deferred:
        for batch in _batches(inputs, batch_size, shuffle=False):
            parts.append(F.softmax(model(*_frames(inputs, batch, device)), dim=-1).double())
            order.append(batch.indices.numpy())
        (probs,) = deferred.fetch(torch.cat(parts))
    out = np.empty((len(inputs), probs.shape[1]), dtype=np.float64)
    out[np.concatenate(order)] = probs.numpy()
    return out


def vector_metrics(
    model: Classifier, enc: VectorExamples, labels: LabelSet, batch_size: int, full: bool = True
) -> dict[str, Any]:
    """Loss per sequence, accuracy, macro-F1, confusion matrix (``full``: per class too)."""
    was_training = model.training
    probs = _probabilities(model, enc.inputs, batch_size)
    model.train(was_training)
    known = enc.labels < len(labels)
    gold, predicted = enc.labels[known], probs.argmax(1)[known]
    nats = float(-np.log(np.maximum(probs[known, gold], 1e-300)).sum()) if len(gold) else 0.0
    gold_names = [labels.labels[i] for i in gold]
    pred_names = [labels.labels[i] for i in predicted]
    unknown = Counter(s.label for s, k in zip(enc.sequences, known, strict=True) if not k)
    n = int(known.sum())
    metrics: dict[str, Any] = {
        **loss_figures(nats, n),
        "tokens": n,
        "examples": n,
        "accuracy": float((predicted == gold).mean()) if n else None,
        **per_class_figures(gold_names, pred_names, labels.labels, "per_class"),
        "unknown_labels": sum(unknown.values()),
        "unknown_label_counts": dict(sorted((str(k), v) for k, v in unknown.items())),
    }
    if full:
        metrics["labels"] = labels.labels
        metrics["confusion_matrix"] = confusion_matrix(gold_names, pred_names, labels.labels)
    else:
        for key in [k for k in metrics if k.startswith("per_class_")]:
            del metrics[key]
    return metrics


@dataclass
class FrameBaselines:
    """The majority class and the logistic regression on ``[mean frame; last frame]``
    (standardised by ``mean`` and ``std`` of the training features)."""

    majority: int
    mean: np.ndarray
    std: np.ndarray
    weight: np.ndarray
    bias: np.ndarray

    @staticmethod
    def features(inputs: list[Tensor]) -> np.ndarray:
        """``(N, 2D)``: each sequence's mean frame and last frame, float64."""
        return np.stack(
            [np.concatenate([x.double().mean(0).numpy(), x[-1].double().numpy()]) for x in inputs]
        )

    @classmethod
    def fit(cls, enc: VectorExamples, num_labels: int) -> FrameBaselines:
        known = enc.labels < num_labels
        majority = int(np.bincount(enc.labels[known], minlength=num_labels).argmax())
        X = cls.features([x for x, k in zip(enc.inputs, known, strict=True) if k])
        mean, std = X.mean(0), X.std(0)
        std = np.where(std > 0, std, 1.0)  # a constant feature stays 0 after centring
        W, b = fit_logistic(
            torch.from_numpy((X - mean) / std), enc.labels[known], num_labels, C=BOW_C
        )
        return cls(majority, mean, std, W, b)

    def predict(self, inputs: list[Tensor]) -> np.ndarray:
        X = (self.features(inputs) - self.mean) / self.std
        return (X @ self.weight.T + self.bias).argmax(1)

    def to_state(self) -> dict[str, np.ndarray]:
        return {
            "majority": np.array([self.majority], dtype=np.int64),
            "frames/mean": self.mean,
            "frames/std": self.std,
            "frames/weight": self.weight,
            "frames/bias": self.bias,
        }

    @classmethod
    def from_state(
        cls, state: dict[str, np.ndarray], num_labels: int, where: str
    ) -> FrameBaselines:
        try:
            out = cls(
                int(np.asarray(state["majority"]).reshape(-1)[0]),
                *(np.asarray(state[f"frames/{k}"]) for k in ("mean", "std", "weight", "bias")),
            )
        except (KeyError, IndexError, ValueError, TypeError):
            raise CheckpointError(f"{where}: not a baseline of classify --inputs vectors") from None
        if not 0 <= out.majority < num_labels or out.weight.shape[0] != num_labels:
            raise CheckpointError(f"{where}: the baseline does not match labels.json")
        return out


def frame_baseline_metrics(
    baselines: FrameBaselines, enc: VectorExamples, labels: LabelSet
) -> dict[str, dict[str, Any]]:
    """Accuracy and macro-F1 of both baselines on the sequences of a known label."""
    known = enc.labels < len(labels)
    gold = enc.labels[known]
    inputs = [x for x, k in zip(enc.inputs, known, strict=True) if k]
    predicted = {
        "majority": np.full(len(gold), baselines.majority),
        "mean_last_frame": baselines.predict(inputs) if inputs else np.zeros(0, np.int64),
    }
    kinds = {
        "majority": f"majority class ({labels.labels[baselines.majority]})",
        "mean_last_frame": FRAMES_KIND,
    }
    gold_names = [labels.labels[i] for i in gold]
    return {
        name: {
            "kind": kinds[name],
            "accuracy": float((pred == gold).mean()) if len(gold) else None,
            "macro_f1": macro_f1(gold_names, [labels.labels[i] for i in pred])
            if len(gold)
            else None,
        }
        for name, pred in predicted.items()
    }


def _read(path: str) -> list[VectorSequence]:
    return read_vector_sequences(path, labelled=True)


def train_vectors(
    cfg: TrainConfig, resume: bool = False, quiet: bool = False, callbacks: Any = None
) -> dict[str, Any]:
    """Train the classifier of real-valued sequences; write the run; return the summary."""
    out = Path(cfg.out)
    device = choose_device(cfg.device, "--device")
    train_seqs = _read(cfg.train)
    if cfg.valid:
        valid_seqs = _read(cfg.valid)
    else:
        train_seqs, valid_seqs = split_holdout(train_seqs, cfg.valid_fraction, cfg.seed, cfg.train)
    found = LabelSet.from_data(s.label or "" for s in train_seqs)
    if resume:
        check_resume(cfg, out)
        labels = LabelSet.load(out / "labels.json")
        check_labels(out, labels, found, cfg.train)
    else:
        held = () if cfg.valid else (s.label or "" for s in valid_seqs)
        one_label_only(cfg.train, found.labels, "sequence", "label", held_out=held)
        labels = found
    width = int(train_seqs[0].values.shape[1])
    seed_everything(cfg.seed)
    train_enc = encode_vectors(train_seqs, labels, cfg.max_len, width)
    valid_enc = encode_vectors(valid_seqs, labels, cfg.max_len, width)
    K = len(labels)
    if not bool((valid_enc.labels < K).any()):
        raise DataError("no validation sequence has a label seen in training", cfg.valid)
    model = build_vector_classifier(model_spec(cfg), width, K).to(device)
    targets = torch.from_numpy(train_enc.labels)

    def step(model: Classifier, batch: Any, carry: Any) -> LossOutput:
        x, mask = _frames(train_enc.inputs, batch, device)
        return model.loss(x, to_device(targets[batch.indices], device), mask)

    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        labels.save(out / "labels.json")
        save_config(out, cfg, input_size=width, num_labels=K)
        (out / "metrics.jsonl").unlink(missing_ok=True)
    baselines = FrameBaselines.fit(train_enc, K)
    save_baseline(out, baselines.to_state())
    result, elapsed = fit(
        cfg,
        model,
        _batches(
            train_enc.inputs,
            cfg.batch_size,
            shuffle=True,
            seed=cfg.seed,
            bucket=cfg.batch_order == "length",
        ),
        step,
        lambda m: vector_metrics(m, valid_enc, labels, cfg.batch_size, full=False),
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
        input_size=width,
        baselines=frame_baseline_metrics(baselines, valid_enc, labels),
    )
    return finish_summary(cfg, summary, result)


def load_vector_classifier(
    run_dir: str | Path, device: str = "cpu"
) -> tuple[TrainConfig, int, LabelSet, Classifier]:
    """A trained classifier of real-valued sequences, its frame width ``D`` and labels."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="classify")
    try:
        labels = LabelSet.load(run_dir / "labels.json")
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    width = info.get("input_size")
    if not isinstance(width, int) or width < 1 or info.get("num_labels") != len(labels):
        raise CheckpointError(f"{run_dir}: labels.json/input_size do not match config.json")
    model = build_vector_classifier(model_spec(cfg), width, len(labels))
    load_model_weights(model.to(choose_device(device)), run_dir / "model.safetensors")
    model.eval()
    return cfg, width, labels, model


def evaluate_vectors(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score labelled sequences with a trained classifier and its baselines."""
    check_batch_size(batch_size)
    cfg, width, labels, model = load_vector_classifier(run_dir, device)
    enc = encode_vectors(_read(data_path), labels, cfg.max_len, width)
    if len(enc.labels) and not bool((enc.labels < len(labels)).any()):
        found = (str(s.label) for s in enc.sequences)
        raise no_known_label(data_path, found, labels.labels, "sequence", "label")
    metrics = vector_metrics(model, enc, labels, batch_size or cfg.batch_size)
    arrays = load_baseline(run_dir)
    if arrays is not None and bool((enc.labels < len(labels)).any()):
        where = str(Path(run_dir) / "baseline.safetensors")
        baselines = FrameBaselines.from_state(arrays, len(labels), where)
        metrics["baselines"] = frame_baseline_metrics(baselines, enc, labels)
    return metrics


def vector_predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu"
) -> Any:
    """``rnnkit predict``: each line one sequence ``{"seq": [[...], ...]}`` (a ``"label"``
    is allowed and ignored) → ``{"label", "probabilities": {label: p}, "steps"}``."""
    check_batch_size(batch_size)
    cfg, width, labels, model = load_vector_classifier(run_dir, device)
    bs = batch_size or cfg.batch_size

    def run(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        inputs = []
        for text, (path, line) in zip(lines, where, strict=True):
            try:
                # loads_json: deep nesting and 5,000-digit integers are a DataError too
                labelled = "label" in loads_json(text, path, line, only_text=True)
            except (DataError, TypeError):
                labelled = False  # parse_vector_line names what is wrong
            seq = parse_vector_line(text, path, line, labelled=labelled)
            if seq.values.shape[1] != width:
                raise DataError(
                    f"frames have {seq.values.shape[1]} values, the run's {width}", path, line
                )
            inputs.append(seq.values)
        return label_sequences(cfg, labels, model, inputs, bs)

    return run


def label_sequences(
    cfg: TrainConfig,
    labels: LabelSet,
    model: Classifier,
    sequences: list[np.ndarray],
    batch_size: int,
) -> list[dict[str, Any]]:
    """The answers of ``rnnkit predict`` for sequences ``(T, D)`` float32 of the run's
    width (the first ``cfg.max_len`` steps read): ``{"label", "probabilities": {label:
    p}, "steps"}``."""
    # in the weights' dtype: a model made float64 (or bfloat16) computes in it
    dtype = next(model.parameters()).dtype
    inputs = [torch.from_numpy(values[: cfg.max_len]).to(dtype) for values in sequences]
    probs = _probabilities(model, inputs, batch_size)
    names = labels.labels
    return [
        {
            "label": names[int(p.argmax())],
            "probabilities": {n: float(v) for n, v in zip(names, p, strict=True)},
            "steps": len(x),
        }
        for p, x in zip(probs, inputs, strict=True)
    ]
