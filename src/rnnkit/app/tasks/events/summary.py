"""The summary of an ``events`` run (``summary.json``): the training figures, both
models' validation loss, the thresholds, what the validation sessions show about the
false-positive rate and, with labelled anomalous validation sessions, the detection
metrics of every score and the highest-scoring sessions with their most surprising events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnkit.anomaly.calibration import top_items
from rnnkit.anomaly.scores import SCORES
from rnnkit.anomaly.surprise import surprise_loss
from rnnkit.anomaly.thresholds import sessions_to_resolve, validation_fpr
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events.data import EventsData
from rnnkit.metrics.detection import detection_metrics
from rnnkit.training.options import TrainResult

__all__ = ["Validation", "summarise"]

PerEvent = list[tuple[np.ndarray, np.ndarray]]


@dataclass
class Validation:
    """Both models on the validation sessions, per model (``"rnn"``, ``"ngram"``).

    Attributes:
        per_event: surprise and rank of every event of the normal sessions.
        scores: every session score of the normal sessions, ``(n,)`` each.
        anomalous_per_event, anomalous_scores: the same for the sessions labelled 1
            (None when there are none).
        thresholds: the run's ``thresholds.json``.
    """

    per_event: dict[str, PerEvent]
    scores: dict[str, dict[str, np.ndarray]]
    anomalous_per_event: dict[str, PerEvent] | None
    anomalous_scores: dict[str, dict[str, np.ndarray]] | None
    thresholds: dict[str, Any]


def summarise(
    cfg: TrainConfig,
    opts: dict[str, Any],
    data: EventsData,
    result: TrainResult,
    elapsed: float,
    parameters: int,
    valid: Validation,
) -> dict[str, Any]:
    """The summary of a run (before :func:`rnnkit.app.tasks.run_outputs.finish_summary`)."""
    thresholds = valid.thresholds
    name = opts["score"]
    summary: dict[str, Any] = {
        "task": "events",
        "steps": result.steps,
        "threads": result.threads,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": result.tokens / max(result.train_seconds, 1e-9),
        "valid": result.best_valid,
        "ngram": {"order": cfg.ngram_order, **surprise_loss(valid.per_event["ngram"])},
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": parameters,
        "vocab_size": len(data.vocab),
        "sessions": {
            "train": len(data.train),
            "valid": len(data.valid),
            "excluded_anomalous": data.excluded,
            "valid_anomalous": len(data.valid_anomalous),
        },
        "unknown_valid_events": data.unknown_valid,
        "thresholds": {
            **{k: thresholds[k] for k in ("target_fpr", "top_g", "window", "score", "method")},
            "rnn": thresholds["rnn"],
            "ngram": thresholds["ngram"],
            "how": thresholds["how"]["rnn"][name],
        },
    }
    fpr = validation_fpr(valid.scores["rnn"][name], thresholds["rnn"][name], opts["target_fpr"])
    summary["validation_fpr"] = fpr
    if not fpr["resolved"]:
        summary["note"] = (
            f"{len(data.valid)} normal validation sessions cannot show a false-positive rate "
            f"of {opts['target_fpr']:g}: even none above the threshold leaves up to "
            f"{fpr['resolvable']:.2%} (95 % Clopper–Pearson); validate on at least "
            f"{sessions_to_resolve(opts['target_fpr'])} normal sessions"
            # the method used: fewer than MIN_THRESHOLD_SESSIONS switch to gpd by themselves
            + ("" if thresholds["method"] == "gpd" else ", or pick it with --threshold-method gpd")
        )
    if valid.anomalous_scores is not None:
        assert valid.anomalous_per_event is not None
        summary.update(_detection(data, valid, name, int(opts["top_g"])))
    return summary


def _detection(data: EventsData, valid: Validation, name: str, g: int) -> dict[str, Any]:
    """Detection metrics of every score of both models on the labelled validation
    sessions, and the highest-scoring of them."""
    assert valid.anomalous_scores is not None and valid.anomalous_per_event is not None
    labels = np.r_[np.zeros(len(data.valid)), np.ones(len(data.valid_anomalous))]
    detection = {
        m: {
            n: detection_metrics(
                np.r_[valid.scores[m][n], valid.anomalous_scores[m][n]],
                labels,
                valid.thresholds[m][n],
            )
            for n in SCORES
        }
        for m in ("rnn", "ngram")
    }
    return {
        "valid_detection": detection["rnn"][name],
        "detection": detection,
        "worst_sessions": _worst_sessions(
            data,
            valid.per_event["rnn"] + valid.anomalous_per_event["rnn"],
            valid.scores["rnn"][name],
            valid.anomalous_scores["rnn"][name],
            g,
        ),
    }


def _worst_sessions(
    data: EventsData,
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    normal: np.ndarray,
    anomalous: np.ndarray,
    top_g: int,
    k: int = 5,
    top: int = 3,
) -> list[dict[str, Any]]:
    """The ``k`` highest-scoring labelled validation sessions with their most surprising
    events (for the report: what the model finds odd, right or wrong)."""
    scores = np.r_[normal, anomalous]
    seqs = data.valid + data.valid_anomalous
    out = []
    for i in np.argsort(-scores, kind="stable")[:k]:
        session = data.valid_sessions[i]
        events = list(session.events)  # as read: an unknown event by its own name
        surprise, rank = per_event[i]
        out.append(
            {
                "index": int(i if i < len(normal) else i - len(normal)),
                "session": session.session,
                "label": int(i >= len(normal)),
                "score": float(scores[i]),
                "events": len(events),
                "top": top_items(surprise, rank, seqs[i], events, top, top_g),
            }
        )
    return out
