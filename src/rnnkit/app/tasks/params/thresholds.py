"""The thresholds of a ``params`` run: the per-vector bound ``μ_k + z σ_k`` of each key, the
session score ``t`` picked at the target false-positive rate on the validation sessions
(``thresholds.json``), and ``t`` re-picked later from the stored validation scores
(``valid_scores.safetensors``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from rnnkit.anomaly.thresholds import normal_quantile, pick_threshold
from rnnkit.app.tasks.params.keys import KeyModel
from rnnkit.app.tasks.params.options import check_target_fpr
from rnnkit.errors import CheckpointError
from rnnkit.training.checkpoint import atomic_write_json, load_arrays

__all__ = [
    "THRESHOLDS_FORMAT",
    "read_scores",
    "repick_session_score",
    "session_threshold",
    "write_thresholds",
]


THRESHOLDS_FORMAT = "rnnkit.params_thresholds"


def session_threshold(
    valid_scores: np.ndarray, target_fpr: float, method: str = "quantile"
) -> tuple[float, str]:
    """The session score ``t`` above which at most ``target_fpr`` of the normal validation
    sessions lie (:func:`rnnkit.anomaly.thresholds.pick_threshold`), and how it was found.

    Sessions with no checked vector (score ``−inf``) count as normal sessions below any
    threshold; with none checked at all, ``t = −inf`` (then ``z`` alone decides).

    >>> t, how = session_threshold(np.array([0.5, 3.0, 1.0, -np.inf, 2.0]), 0.2)
    >>> 2.0 < t < 3.0, how  # one of the five above
    (True, 'empirical quantile')
    """
    scores = np.asarray(valid_scores, dtype=np.float64)
    finite = scores[np.isfinite(scores)]
    if not finite.size:
        return -math.inf, "no validation vector was checked"
    # −inf cannot be sorted into a tail fit: below every real score is all that matters.
    floor = float(finite.min()) - 1.0
    return pick_threshold(np.where(np.isfinite(scores), scores, floor), target_fpr, method)


def write_thresholds(
    out: Path,
    confidence: float,
    keys: list[KeyModel],
    valid_sessions: int,
    target_fpr: float,
    method: str,
    t: float,
    how: str,
) -> dict[str, Any]:
    z = normal_quantile((1 + confidence) / 2)
    doc = {
        "format": THRESHOLDS_FORMAT,
        "version": 1,
        "confidence": confidence,
        "z": z,
        "valid_sessions": valid_sessions,
        "bounds": {k.key: k.bound(z) for k in keys},
        "target_fpr": target_fpr,
        "method": method,
        # JSON has no infinity: None when no validation vector was checked.
        "session_score": t if math.isfinite(t) else None,
        "session_how": how,
    }
    atomic_write_json(out / "thresholds.json", doc)
    return doc


def read_scores(run_dir: str | Path) -> dict[str, np.ndarray]:
    """The run's ``valid_scores.safetensors`` (``normal``, ``valid_z``[, ``anomalous``])."""
    path = Path(run_dir) / "valid_scores.safetensors"
    arrays = load_arrays(path)
    if "normal" not in arrays or "valid_z" not in arrays:
        raise CheckpointError(f"{path}: not the validation scores of a params run")
    return arrays


def repick_session_score(run_dir: str | Path, target_fpr: float, method: str = "quantile") -> float:
    """The session score ``t`` re-picked at another target rate from the run's validation
    scores, without retraining (``rnnkit score --target-fpr`` on a params run)."""
    check_target_fpr(target_fpr)
    t, _ = session_threshold(read_scores(run_dir)["normal"], target_fpr, method)
    return t
