"""The thresholds of an ``events`` run: picked per model and score at the target
false-positive rate from the normal validation sessions' scores, written to
``thresholds.json`` (and the scores to ``valid_scores.safetensors``, so that they can be
re-picked at another rate without retraining), read back and checked; and what the
validation sessions can show about the false-positive rate (Clopper–Pearson)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file as save_numpy

from rnnkit.anomaly.scores import NONNEGATIVE_SCORES, SCORES
from rnnkit.anomaly.thresholds import (
    clopper_pearson,
    pick_threshold,
    resolvable_fpr,
)
from rnnkit.app.tasks.events.data import MIN_THRESHOLD_SESSIONS
from rnnkit.data.files import atomic_write
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.training.checkpoint import (
    atomic_write_json,
    load_arrays,
    read_json,
)

__all__ = [
    "THRESHOLDS_FORMAT",
    "read_thresholds",
    "repick_thresholds",
    "save_arrays",
    "sessions_to_resolve",
    "validation_fpr",
    "write_thresholds",
]


THRESHOLDS_FORMAT = "rnnkit.anomaly.thresholds"


def save_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """safetensors (numpy) written to a temporary name, then renamed: never half a file."""
    atomic_write(path, write_path=lambda tmp: save_numpy(arrays, tmp))


def _thresholds(
    scores: dict[str, np.ndarray], target_fpr: float, method: str
) -> tuple[dict[str, float], dict[str, str]]:
    picked = {name: pick_threshold(values, target_fpr, method) for name, values in scores.items()}
    return {k: v[0] for k, v in picked.items()}, {k: v[1] for k, v in picked.items()}


def write_thresholds(
    out: Path,
    opts: dict[str, Any],
    valid_scores: dict[str, dict[str, np.ndarray]],
    anomalous_scores: dict[str, dict[str, np.ndarray]] | None,
) -> dict[str, Any]:
    fpr = float(opts["target_fpr"])
    n_valid = len(valid_scores["rnn"]["max"])
    method = opts["threshold"]
    if method == "quantile" and n_valid < MIN_THRESHOLD_SESSIONS:
        # Too few normal sessions for an empirical quantile to mean much: the tail fit
        # (which says so and falls back where even it is impossible).
        method = "gpd"
    rnn, rnn_how = _thresholds(valid_scores["rnn"], fpr, method)
    ngram, ngram_how = _thresholds(valid_scores["ngram"], fpr, method)
    if method != opts["threshold"]:
        why = f"{n_valid} normal validation sessions, fewer than {MIN_THRESHOLD_SESSIONS}: "
        rnn_how = {k: why + v for k, v in rnn_how.items()}
        ngram_how = {k: why + v for k, v in ngram_how.items()}
    doc = {
        "format": THRESHOLDS_FORMAT,
        "version": 2,
        "target_fpr": fpr,
        "top_g": int(opts["top_g"]),
        "window": opts["window"],
        "score": opts["score"],
        "method": method,
        "valid_sessions": n_valid,
        "rnn": rnn,
        "ngram": ngram,
        "how": {"rnn": rnn_how, "ngram": ngram_how},
    }
    arrays = {f"{m}/{k}": v for m, scores in valid_scores.items() for k, v in scores.items()}
    if anomalous_scores:
        # Labelled anomalous validation sessions: the report's ROC and PR curves.
        arrays.update(
            {f"anomalous/{m}/{k}": v for m, sc in anomalous_scores.items() for k, v in sc.items()}
        )
    save_arrays(arrays, out / "valid_scores.safetensors")
    atomic_write_json(out / "thresholds.json", doc)
    return doc


def _scores_of_version(version: int) -> tuple[str, ...]:
    return ("max", "mean", "count") if version == 1 else SCORES


def read_thresholds(run_dir: str | Path) -> dict[str, Any]:
    """``thresholds.json`` of a run, checked; errors name the file.

    Version 1 (runs from before the ``end``, ``norm`` and ``combined`` scores) holds
    thresholds for ``max``, ``mean`` and ``count`` only; version 2 for every score.
    """
    path = Path(run_dir) / "thresholds.json"
    doc = read_json(path)
    try:
        names = _scores_of_version(doc["version"]) if doc["version"] in (1, 2) else ()
        ok = (
            doc["format"] == THRESHOLDS_FORMAT
            and bool(names)
            and doc["score"] in names
            and all(_finite_number(doc[m][s]) for m in ("rnn", "ngram") for s in names)
            and isinstance(doc["top_g"], int)
            and 0 < doc["target_fpr"] < 1
        )
        window = doc.get("window")
        ok = ok and (window is None or (isinstance(window, int) and window >= 1))
    except (KeyError, TypeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path}: not an rnnkit thresholds file of version 1 or 2")
    for m in ("rnn", "ngram"):
        for s in names:
            if s in NONNEGATIVE_SCORES and doc[m][s] < 0:
                raise CheckpointError(
                    f"{path}: the {m} threshold of the {s} score is {doc[m][s]}, below 0; "
                    f"that score is never negative, so every session would be anomalous"
                )
    doc.setdefault("window", None)
    doc.setdefault("method", "quantile")
    return doc


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def repick_thresholds(
    run_dir: str | Path, target_fpr: float, method: str = "quantile"
) -> dict[str, dict[str, float]]:
    """Thresholds at another false-positive rate (and method), from the stored validation
    scores."""
    if not 0 < target_fpr < 1:
        raise ConfigError(f"--target-fpr must be in (0, 1), got {target_fpr}")
    path = Path(run_dir) / "valid_scores.safetensors"
    arrays = load_arrays(path)
    try:
        return {
            m: {
                s: pick_threshold(arrays[f"{m}/{s}"], target_fpr, method)[0]
                for s in SCORES
                if f"{m}/{s}" in arrays
            }
            for m in ("rnn", "ngram")
        }
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None


def validation_fpr(
    normal_scores: np.ndarray, threshold: float, target_fpr: float
) -> dict[str, Any]:
    """What the validation sessions show about the false-positive rate at a threshold:
    the count above it, its 95 % Clopper–Pearson interval, and the smallest rate these
    sessions could show (:func:`rnnkit.anomaly.thresholds.resolvable_fpr`).

    >>> v = validation_fpr(np.array([0.1, 0.2, 0.3]), 0.25, 0.01)
    >>> v["false_positives"], v["sessions"], v["resolved"]
    (1, 3, False)
    """
    n = len(normal_scores)
    k = int(np.sum(np.asarray(normal_scores) > threshold))
    lo, hi = clopper_pearson(k, n)
    smallest = resolvable_fpr(n)
    return {
        "false_positives": k,
        "sessions": n,
        "rate": k / n,
        "interval95": [lo, hi],
        "resolvable": smallest,
        "resolved": bool(smallest <= target_fpr),
    }


def sessions_to_resolve(target_fpr: float, confidence: float = 0.95) -> int:
    """Fewest clean sessions whose Clopper–Pearson upper end reaches ``target_fpr``:
    ``⌈ln((1−c)/2) / ln(1−α)⌉``.

    >>> sessions_to_resolve(0.01)
    368
    """
    return math.ceil(math.log((1 - confidence) / 2) / math.log1p(-target_fpr))
