"""Training a ``params`` run: one ``regress`` run per key of the normal training sessions
(``keys/NNN/``), each key's error Gaussian on the validation sessions (``keys.json``), the
session threshold (``thresholds.json``, ``valid_scores.safetensors``) and the summary.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file as save_numpy

from rnnkit.anomaly.thresholds import fit_gaussian, normal_quantile, validation_fpr
from rnnkit.app.config import EventsOptions, ParamsOptions, TrainConfig
from rnnkit.app.tasks.params.keys import (
    KEYS_FORMAT,
    MIN_ERROR_STD,
    MIN_VALID_VECTORS,
    KeyModel,
    Occurrences,
    check_validation_values,
    collect,
    fit_key,
    key_sequences,
    read_items,
    vector_errors,
)
from rnnkit.app.tasks.params.options import options
from rnnkit.app.tasks.params.scoring import ParamsModel, score_items
from rnnkit.app.tasks.params.thresholds import session_threshold, write_thresholds
from rnnkit.app.tasks.regress import fit_sequences, load_regressor
from rnnkit.app.tasks.run_config import save_config
from rnnkit.app.tasks.run_dir import guarded_run
from rnnkit.data.events import Session
from rnnkit.data.files import atomic_write
from rnnkit.data.labelled import split_holdout
from rnnkit.errors import ConfigError, DataError
from rnnkit.metrics.detection import detection_metrics
from rnnkit.training.checkpoint import atomic_write_json

__all__ = ["train"]

Items = list[tuple[Session, str, int]]


@dataclasses.dataclass
class _Split:
    """The sessions of a run: normal ones to train and validate on, labelled anomalous
    validation sessions (reported only), and the label-1 training sessions left out."""

    train: Items
    valid: Items
    valid_anomalous: Items
    excluded: int


@dataclasses.dataclass
class _Keys:
    """The keys modelled, those skipped and why, each validation vector's z, the weights."""

    models: list[KeyModel]
    skipped: list[dict[str, Any]]
    valid_z: dict[str, list[np.ndarray]]
    parameters: int


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Fit one regressor per key of the normal training sessions, each key's error
    Gaussian on the validation sessions; write the run directory; return the summary."""
    if resume:
        raise ConfigError("--resume does not apply to --task params: train it again (--overwrite)")
    opts = options(cfg)
    started = time.perf_counter()
    out = Path(cfg.out)
    split = _split(cfg)
    train_occ = collect(split.train)
    widths = {k: len(o.rows[0][0]) for k, o in train_occ.items()}
    valid_occ = collect(split.valid, widths)
    out.mkdir(parents=True, exist_ok=True)
    save_config(out, cfg, keys=len(train_occ))
    keys = _fit_keys(cfg, train_occ, valid_occ, widths, quiet)
    atomic_write_json(
        out / "keys.json",
        {
            "format": KEYS_FORMAT,
            "version": 1,
            "keys": [k.to_json() for k in keys.models],
            "skipped": keys.skipped,
        },
    )
    summary = _validate(cfg, opts, split, keys)
    summary = {"task": "params", "elapsed_s": time.perf_counter() - started, **summary}
    atomic_write_json(out / "summary.json", summary)
    return summary


def _split(cfg: TrainConfig) -> _Split:
    """Read the sessions; hold out validation sessions unless ``--valid`` gives them."""
    everything = read_items(cfg.train)
    normal = [item for item in everything if item[0].label != 1]
    excluded = len(everything) - len(normal)
    if not normal:
        raise DataError("no normal session to train on (all are labelled 1)", cfg.train)
    valid_anomalous: Items = []
    if cfg.valid:
        valid_all = read_items(cfg.valid)
        valid = [item for item in valid_all if item[0].label != 1]
        valid_anomalous = [item for item in valid_all if item[0].label == 1]
        train_items = normal
        if not valid:
            raise DataError("no normal session to validate on (all are labelled 1)", cfg.valid)
    else:
        train_items, valid = split_holdout(normal, cfg.valid_fraction, cfg.seed, cfg.train)
    return _Split(train_items, valid, valid_anomalous, excluded)


def _fit_keys(
    cfg: TrainConfig,
    train_occ: dict[str, Occurrences],
    valid_occ: dict[str, Occurrences],
    widths: dict[str, int],
    quiet: bool,
) -> _Keys:
    """Train a regressor per key with enough vectors (most frequent first) and fit the
    Gaussian of its validation errors."""
    out = Path(cfg.out)
    keys: list[KeyModel] = []
    skipped: list[dict[str, Any]] = []
    valid_z: dict[str, list[np.ndarray]] = {}
    order = sorted(train_occ, key=lambda k: -train_occ[k].count())
    parameters = 0
    for key in order:
        directory = f"keys/{len(keys):03d}"
        model_key, why = fit_key(key, widths[key], train_occ[key], directory)
        occ_valid = valid_occ.get(key, Occurrences([], []))
        if model_key is not None and occ_valid.count() < MIN_VALID_VECTORS:
            model_key, why = (
                None,
                (f"{occ_valid.count()} validation vector(s), fewer than {MIN_VALID_VECTORS}"),
            )
        if model_key is None:
            skipped.append({"key": key, "reason": why, "train_vectors": train_occ[key].count()})
            continue
        unset = {**dataclasses.asdict(ParamsOptions()), **dataclasses.asdict(EventsOptions())}
        sub = dataclasses.replace(
            cfg, task="regress", out=str(out / directory), target="next", loss="mse", **unset
        )
        check_validation_values(model_key, occ_valid)
        train_seqs = key_sequences(model_key, train_occ[key])
        valid_seqs = key_sequences(model_key, occ_valid)
        summary = fit_sequences(sub, train_seqs, valid_seqs, quiet=True, data=None, key=key)
        parameters += int(summary["parameters"])
        # the weights best on validation, on the training's device: the error Gaussian
        # and the threshold are those of the errors scoring will compute there
        _, _, model = load_regressor(out / directory, cfg.device)
        errors, _ = vector_errors(model, valid_seqs, cfg.batch_size)
        model_key.error = fit_gaussian(np.concatenate(errors), MIN_ERROR_STD)
        model_key.model = model
        model_key.valid_vectors = occ_valid.count()
        keys.append(model_key)
        valid_z[key] = [(e - model_key.error.mean) / model_key.error.std for e in errors]
        mse = (summary.get("valid") or {}).get("mse", math.nan)
        _say(
            f"{directory} ({model_key.train_vectors} vectors, {len(model_key.dims)} of "
            f"{model_key.width} values): validation mse {mse:.4g} (persistence "
            f"{summary['baselines']['persistence']['mse']:.4g}), errors "
            f"N({model_key.error.mean:.3g}, "
            f"{model_key.error.std:.3g}²): {key[:60]}",
            quiet,
        )
    if not keys:
        reasons = "; ".join(f"{s['key'][:40]!r}: {s['reason']}" for s in skipped[:3])
        raise DataError(f"no key has enough parameter values to model ({reasons})", cfg.train)
    return _Keys(keys, skipped, valid_z, parameters)


def _validate(cfg: TrainConfig, opts: dict[str, Any], split: _Split, keys: _Keys) -> dict[str, Any]:
    """Score the validation sessions, pick the session threshold, write
    ``thresholds.json`` and ``valid_scores.safetensors``; the summary's figures."""
    out = Path(cfg.out)
    z = normal_quantile((1 + opts["confidence"]) / 2)
    run = ParamsModel(cfg, keys.models, keys.skipped, opts["confidence"], {})
    valid_scores = np.array([r["_score"] for r in score_items(run, split.valid, cfg.batch_size)])
    t, how = session_threshold(valid_scores, opts["target_fpr"], opts["threshold"])
    run.thresholds = write_thresholds(
        out,
        opts["confidence"],
        keys.models,
        len(split.valid),
        opts["target_fpr"],
        opts["threshold"],
        t,
        how,
    )
    limit = run.limit()
    arrays = {
        "normal": valid_scores,
        "valid_z": np.concatenate([np.concatenate(v) for v in keys.valid_z.values()]),
    }
    anomalous_scores = None
    if split.valid_anomalous:
        anomalous_scores = np.array(
            [r["_score"] for r in score_items(run, split.valid_anomalous, cfg.batch_size)]
        )
        arrays["anomalous"] = anomalous_scores
    atomic_write(out / "valid_scores.safetensors", write_path=lambda tmp: save_numpy(arrays, tmp))
    skipped = keys.skipped
    summary: dict[str, Any] = {
        "parameters": keys.parameters,
        "confidence": opts["confidence"],
        "z": z,
        "target_fpr": opts["target_fpr"],
        "session_threshold": limit,
        "session_threshold_how": how if t >= z else f"z (above {how}: {t:.4g})",
        "keys": {
            "modelled": len(keys.models),
            "skipped": len(skipped),
            "vectors_modelled": sum(k.train_vectors for k in keys.models),
            "vectors_skipped": sum(s["train_vectors"] for s in skipped),
        },
        "sessions": {
            "train": len(split.train),
            "valid": len(split.valid),
            "excluded_anomalous": split.excluded,
            "valid_anomalous": len(split.valid_anomalous),
        },
        "validation_fpr": validation_fpr(valid_scores, limit, opts["target_fpr"]),
        "skipped_keys": skipped[:20],
    }
    if anomalous_scores is not None:
        labels = np.r_[np.zeros(len(valid_scores)), np.ones(len(anomalous_scores))]
        summary["valid_detection"] = detection_metrics(
            np.r_[valid_scores, anomalous_scores], labels, limit
        )
    return summary


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"rnnkit: {message}", file=sys.stderr, flush=True)
