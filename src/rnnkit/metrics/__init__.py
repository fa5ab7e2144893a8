"""Losses and metrics: pure functions of predictions and references.

* ``losses``: masked cross-entropy in nats (per token, per sequence, summed) and the
  training loss of a batch;
* ``labels``: accuracy, per-class precision/recall/F1, macro-F1, confusion matrices and
  BIO spans, for tagging and classification;
* ``sequences``: edit distance, token and character error rates, exact match and BLEU,
  for transduction;
* ``detection``: ROC-AUC, the ROC and precision–recall curves, and the verdict metrics
  (precision, recall, F1, false-positive rate) of anomaly detection.
"""

from rnnkit.metrics.detection import (
    detection_metrics,
    precision_recall_curve,
    precision_recall_f1,
    roc_auc,
    roc_curve,
)
from rnnkit.metrics.labels import (
    accuracy,
    bio_spans,
    confusion_matrix,
    is_bio_tagset,
    macro_f1,
    per_class_prf,
    prf,
    span_prf,
)
from rnnkit.metrics.losses import REDUCTIONS, sequence_cross_entropy, training_loss
from rnnkit.metrics.sequences import (
    bleu,
    character_error_rate,
    characters,
    edit_distance,
    exact_match,
    teacher_forced_accuracy,
    token_error_rate,
)

__all__ = [
    "REDUCTIONS",
    "accuracy",
    "bio_spans",
    "bleu",
    "character_error_rate",
    "characters",
    "confusion_matrix",
    "detection_metrics",
    "edit_distance",
    "exact_match",
    "is_bio_tagset",
    "macro_f1",
    "per_class_prf",
    "precision_recall_curve",
    "precision_recall_f1",
    "prf",
    "roc_auc",
    "roc_curve",
    "sequence_cross_entropy",
    "span_prf",
    "teacher_forced_accuracy",
    "token_error_rate",
    "training_loss",
]
