"""The thresholds of an ``events`` run: picked per model and score at the target
false-positive rate from the normal validation sessions' scores, written to
``thresholds.json`` (and the scores to ``valid_scores.safetensors``, so that they can be
re-picked at another rate without retraining), read back and checked. What they are
picked by, and what the validation sessions show about the false-positive rate, is in
:mod:`rnnkit.anomaly.thresholds`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file as save_numpy

from rnnkit.anomaly.scores import NONNEGATIVE_SCORES, SCORES
from rnnkit.anomaly.thresholds import pick_threshold, pick_thresholds
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
    "repick_thresholds_explained",
    "save_arrays",
    "write_thresholds",
]


THRESHOLDS_FORMAT = "rnnkit.anomaly.thresholds"


def save_arrays(arrays: dict[str, np.ndarray], path: Path) -> None:
    """safetensors (numpy) written to a temporary name, then renamed: never half a file."""
    atomic_write(path, write_path=lambda tmp: save_numpy(arrays, tmp))


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
    rnn, rnn_how = pick_thresholds(valid_scores["rnn"], fpr, method)
    ngram, ngram_how = pick_thresholds(valid_scores["ngram"], fpr, method)
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
    return repick_thresholds_explained(run_dir, target_fpr, method)[0]


def repick_thresholds_explained(
    run_dir: str | Path, target_fpr: float, method: str = "quantile"
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, str]]]:
    """:func:`repick_thresholds`, and how each threshold was found (per model and score:
    ``gpd`` may fall back to the empirical quantile, and says why)."""
    if (
        isinstance(target_fpr, bool)
        or not isinstance(target_fpr, (int, float))
        or not 0 < target_fpr < 1
    ):
        # the Python argument: `rnnkit score` checks --target-fpr before reading the run
        raise ConfigError(f"target_fpr must be in (0, 1), got {target_fpr!r}")
    path = Path(run_dir) / "valid_scores.safetensors"
    arrays = load_arrays(path)
    for key, values in arrays.items():
        # a NaN score sorts nowhere: the threshold became nan and every session "normal"
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            raise CheckpointError(f"{path}: {key} holds a value that is not finite")
    try:
        picked = {
            m: {
                s: pick_threshold(arrays[f"{m}/{s}"], target_fpr, method)
                for s in SCORES
                if f"{m}/{s}" in arrays
            }
            for m in ("rnn", "ngram")
        }
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None
    limits = {m: {s: v[0] for s, v in by.items()} for m, by in picked.items()}
    how = {m: {s: v[1] for s, v in by.items()} for m, by in picked.items()}
    return limits, how
