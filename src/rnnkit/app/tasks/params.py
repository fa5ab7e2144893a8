"""The ``params`` task: DeepLog's parameter-value model, one recurrent regressor per log key.

The sessions are those of the ``events`` task with each event's parameter values
(``"params"``, written by ``rnnkit sessions --from log --params``): the numbers of the
log line's variable parts and, first, the seconds since the session's previous line.
The key-sequence model (``--task events``) asks whether the *order* of the events is
normal; this one asks whether each event's *values* are (Du et al., CCS 2017, §3.2): a
request that takes ten times its usual time, a size out of range.

For each key ``k`` (an event: a log template) of the normal training sessions:

1. **dims**: the positions of ``k``'s vectors that hold a number in every training vector
   of ``k`` (an address, a path, a ``-`` for a missing size are not numbers: those
   positions are left out);
2. **normalisation** with the training statistics, per dim: ``x' = (x − m_d) / s_d``
   (mean and standard deviation; a dim that never changes gets ``s_d = max(|m_d|, 1)``:
   any change of it then counts);
3. **sequences**: in each session, ``k``'s vectors in order after a start step of zeros,
   ``[0, v_1, …, v_n]``; a recurrent regressor (the ``regress`` task's model and training,
   ``--target next``) predicts ``v_i`` from ``v_1 … v_{i−1}``: the first from nothing (the
   key's typical vector), later ones from the same key's history in the session;
4. **Gaussian**: the errors ``e = mean_d (v̂_d − v_d)²`` of ``k``'s validation vectors are
   fitted with ``N(μ_k, σ_k²)`` (:func:`rnnkit.anomaly.thresholds.fit_gaussian`, ``σ_k`` at least
   :data:`MIN_ERROR_STD`); a vector is **anomalous** when its error is above the upper end
   of the ``c`` confidence interval, ``e > μ_k + z σ_k``, ``z = Φ⁻¹((1 + c) / 2)``
   (``--confidence``, default 0.99). An error below the interval is a better prediction
   than usual, never an anomaly.

A session's **score** is the largest ``(e − μ_k) / σ_k`` over its checked vectors. The
interval is per vector, and a session has many: with ~10 vectors a session and errors
(squares) skewed to the right, a per-vector ``c`` of 0.99 flags a fifth of normal
sessions. So a session is **anomalous** when its score is above the *session threshold*
``max(z, t)``: ``t`` is picked on the validation sessions' scores at ``--target-fpr``
(default 0.01; ``--threshold-method`` quantile or a generalized Pareto tail fit, as the
``events`` task), and ``z`` keeps the rule that a session with no vector outside its
interval is never anomalous. DeepLog's own rule (any vector outside its interval) is the
record's ``anomalous_vectors > 0``. Events of keys without a
model (unseen in training, or too rare: fewer than :data:`MIN_TRAIN_VECTORS` training or
:data:`MIN_VALID_VECTORS` validation vectors) are counted, not checked: an unseen key is
the key-sequence model's to flag. A value missing (``null``) where training always had a
number is filled with the training mean and counted.

Why one model per key, as DeepLog: every key has its own width, units and dynamics (a
duration in ms, a byte count, a row count), and a model per key sees only its own history,
so an odd value of one key cannot hide behind another's. Unlike DeepLog, a key's sequence
is its vectors *within one session*, not the whole log's stream: sessions are the unit
that is split, labelled and judged here, and a verdict must not depend on the sessions
interleaved with it.

Run directory: ``config.json``, ``keys.json`` (per key: its dims, normalisation, error
Gaussian and sub-run), ``keys/NNN/`` (a ``regress`` run per key), ``thresholds.json``
(confidence, ``z``, each key's error bound, the target rate and the session threshold),
``valid_scores.safetensors`` (the validation
sessions' scores and every validation vector's ``z``: the report's figures),
``summary.json``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file as save_numpy
from torch.nn.utils.rnn import pad_sequence

from rnnkit.anomaly.thresholds import (
    THRESHOLD_METHODS,
    GaussianFit,
    fit_gaussian,
    normal_quantile,
    pick_threshold,
)
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events.thresholds import validation_fpr
from rnnkit.app.tasks.regress import fit_sequences, load_regressor
from rnnkit.app.tasks.run import guarded_run, load_config, save_config
from rnnkit.data.events import Session, iter_sessions, parse_session
from rnnkit.data.files import atomic_write
from rnnkit.data.labelled import split_holdout
from rnnkit.data.vectors import VectorSequence
from rnnkit.errors import CheckpointError, ConfigError, DataError
from rnnkit.metrics.detection import detection_metrics
from rnnkit.models.regressor import Regressor
from rnnkit.training.checkpoint import atomic_write_json, load_arrays, read_json

__all__ = [
    "DEFAULTS",
    "MIN_TRAIN_VECTORS",
    "MIN_VALID_VECTORS",
    "KeyModel",
    "ParamsModel",
    "evaluate",
    "load_params",
    "predictor",
    "repick_session_score",
    "score_sessions",
    "session_threshold",
    "train",
]

#: Options read from ``cfg.extra`` and their defaults.
DEFAULTS: dict[str, Any] = {"confidence": 0.99, "target_fpr": 0.01, "threshold": "quantile"}
#: Fewest training vectors a key is modelled from.
MIN_TRAIN_VECTORS = 10
#: Fewest validation vectors a key's error Gaussian is fitted to.
MIN_VALID_VECTORS = 5
#: Smallest standard deviation of a key's errors (normalised units squared): a key whose
#: errors are all alike would otherwise flag the smallest change.
MIN_ERROR_STD = 0.01
KEYS_FORMAT = "rnnkit.params_keys"
THRESHOLDS_FORMAT = "rnnkit.params_thresholds"


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The params options of ``cfg.extra`` over :data:`DEFAULTS`, validated.

    >>> options(TrainConfig(train="x", extra={"confidence": 0.999}))["confidence"]
    0.999
    """
    unknown = sorted(set(cfg.extra) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown params option(s) {unknown} (known: {sorted(DEFAULTS)})")
    opts = {**DEFAULTS, **cfg.extra}
    check_confidence(opts["confidence"])
    check_target_fpr(opts["target_fpr"])
    if opts["threshold"] not in THRESHOLD_METHODS:
        raise ConfigError(
            f"--threshold-method must be one of {', '.join(THRESHOLD_METHODS)}, "
            f"got {opts['threshold']!r}"
        )
    return opts


def check_confidence(c: Any) -> float:
    """``c`` if it is a confidence in (0, 1), else a ConfigError."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1:
        raise ConfigError(f"--confidence must be in (0, 1), got {c!r}")
    return float(c)


def check_target_fpr(f: Any) -> float:
    """``f`` if it is a rate in (0, 1), else a ConfigError."""
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
        raise ConfigError(f"--target-fpr must be in (0, 1), got {f!r}")
    return float(f)


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


# ---- keys ------------------------------------------------------------------------------


@dataclass
class KeyModel:
    """One key's model: which values it reads, how they are normalised, its errors.

    Attributes:
        key: the event (log template).
        width: how many values the key's events carry.
        dims: the positions modelled (numbers in every training vector).
        mean, scale: per modelled dim, the normalisation ``(x − mean) / scale``.
        error: the Gaussian of the validation errors.
        directory: the key's ``regress`` run, relative to the run directory.
        model: the loaded regressor (None until loaded).
    """

    key: str
    width: int
    dims: list[int]
    mean: np.ndarray
    scale: np.ndarray
    error: GaussianFit
    directory: str
    train_vectors: int = 0
    valid_vectors: int = 0
    model: Regressor | None = None

    def bound(self, z: float) -> float:
        """The error above which a vector is anomalous: ``μ + z σ``."""
        return self.error.mean + z * self.error.std

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "width": self.width,
            "dims": self.dims,
            "mean": self.mean.tolist(),
            "scale": self.scale.tolist(),
            "error": {"mean": self.error.mean, "std": self.error.std, "n": self.error.n},
            "dir": self.directory,
            "train_vectors": self.train_vectors,
            "valid_vectors": self.valid_vectors,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KeyModel:
        error = doc["error"]
        key = cls(
            key=str(doc["key"]),
            width=int(doc["width"]),
            dims=[int(d) for d in doc["dims"]],
            mean=np.asarray(doc["mean"], dtype=np.float64),
            scale=np.asarray(doc["scale"], dtype=np.float64),
            error=GaussianFit(float(error["mean"]), float(error["std"]), int(error["n"])),
            directory=str(doc["dir"]),
            train_vectors=int(doc.get("train_vectors", 0)),
            valid_vectors=int(doc.get("valid_vectors", 0)),
        )
        ok = (
            key.dims
            and len(key.mean) == len(key.scale) == len(key.dims)
            and all(0 <= d < key.width for d in key.dims)
            and np.isfinite(key.mean).all()
            and (key.scale > 0).all()
            and math.isfinite(key.error.mean)
            and key.error.std > 0
            and ".." not in Path(key.directory).parts
            and not Path(key.directory).is_absolute()
        )
        if not ok:
            raise ValueError(f"key {key.key!r} is not valid")
        return key

    def normalise(self, vectors: np.ndarray) -> tuple[np.ndarray, int]:
        """``(normalised (n, |dims|) float32, missing values filled)`` of raw ``(n, width)``
        vectors (NaN = missing: filled with the training mean, i.e. 0)."""
        x = (vectors[:, self.dims] - self.mean) / self.scale
        missing = np.isnan(x)
        return np.where(missing, 0.0, x).astype(np.float32), int(missing.sum())


def _matrix(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """Parameter vectors as a float64 matrix, ``None`` as NaN."""
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=np.float64)


@dataclass
class _Occurrences:
    """One key's vectors in the sessions of one file: per session, its rows in order."""

    rows: list[list[list[float | None]]]
    where: list[tuple[str, int]]  # (path, line) of each session

    def count(self) -> int:
        return sum(len(r) for r in self.rows)


def _collect(
    items: Iterable[tuple[Session, str, int]], widths: dict[str, int] | None = None
) -> dict[str, _Occurrences]:
    """Per key, its vectors per session; widths checked (one line naming file:line)."""
    out: dict[str, _Occurrences] = {}
    seen_width: dict[str, tuple[int, str, int]] = {}
    for session, path, line in items:
        if session.params is None:
            raise DataError(
                f'session {session.session!r} has no "params" (write the sessions with '
                "rnnkit sessions --from log --params)",
                path,
                line,
            )
        per_key: dict[str, list[list[float | None]]] = {}
        for index, (event, values) in enumerate(zip(session.events, session.params, strict=True)):
            want = widths.get(event) if widths is not None else None
            if widths is None:
                first = seen_width.setdefault(event, (len(values), path, line))
                want = first[0]
            if want is not None and len(values) != want:
                raise DataError(
                    f"session {session.session!r}: params[{index}] has {len(values)} values; "
                    f"the event {event!r} had {want} "
                    + ("in training" if widths is not None else f"at {first[1]}:{first[2]}"),
                    path,
                    line,
                )
            per_key.setdefault(event, []).append(values)
        for event, rows in per_key.items():
            occ = out.setdefault(event, _Occurrences([], []))
            occ.rows.append(rows)
            occ.where.append((path, line))
    return out


def _sequences(key: KeyModel, occ: _Occurrences) -> list[VectorSequence]:
    """The regressor's sequences of one key: a zero start step, then its vectors."""
    seqs = []
    for rows, (path, line) in zip(occ.rows, occ.where, strict=True):
        x, _ = key.normalise(_matrix(rows))
        values = np.concatenate([np.zeros((1, x.shape[1]), np.float32), x])
        seqs.append(VectorSequence(values, None, path, line))
    return seqs


@torch.no_grad()
def vector_errors(
    model: Regressor, seqs: Sequence[VectorSequence], batch_size: int = 64
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per sequence ``[0, v_1 … v_n]``: the error ``mean_d (v̂_i − v_i)²`` of each ``v_i``
    ``(n,)`` and the predictions ``(n, D)``, the state carried over the whole sequence."""
    model.eval()
    device = next(model.parameters()).device
    errors: list[np.ndarray] = [np.zeros(0)] * len(seqs)
    preds: list[np.ndarray] = [np.zeros((0, 0))] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].values))
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        xs = [torch.from_numpy(seqs[i].values) for i in idx]
        x = pad_sequence(xs, batch_first=True).to(device)
        lengths = torch.tensor([len(v) for v in xs], device=device)
        mask = torch.arange(x.shape[1], device=device)[None, :] < lengths[:, None]
        mean = model(x, mask).mean.double().cpu().numpy()  # (B, T, D)
        for row, i in enumerate(idx):
            n = len(seqs[i].values)
            pred, target = mean[row, : n - 1], seqs[i].values[1:n].astype(np.float64)
            preds[i] = pred
            errors[i] = ((pred - target) ** 2).mean(axis=1)
    return errors, preds


# ---- training --------------------------------------------------------------------------


def _read(path: str) -> list[tuple[Session, str, int]]:
    with open(path, "rb") as fileobj:
        items = [(s, path, line) for line, s in iter_sessions(fileobj, path)]
    if not items:
        raise DataError("no sessions (the file is empty)", path)
    return items


def _fit_key(
    key: str, width: int, train_occ: _Occurrences, directory: str
) -> tuple[KeyModel | None, str]:
    """The dims and normalisation of a key from its training vectors (no model yet), or
    None and why it is not modelled."""
    n = train_occ.count()
    if n < MIN_TRAIN_VECTORS:
        return None, f"{n} training vector(s), fewer than {MIN_TRAIN_VECTORS}"
    matrix = _matrix([row for rows in train_occ.rows for row in rows]).reshape(n, width)
    dims = [d for d in range(width) if not np.isnan(matrix[:, d]).any()]
    if not dims:
        return None, "no value that is a number in every training vector"
    mean = matrix[:, dims].mean(axis=0)
    std = matrix[:, dims].std(axis=0)
    constant = std <= 1e-12 * np.maximum(np.abs(mean), 1.0)
    scale = np.where(constant, np.maximum(np.abs(mean), 1.0), std)
    placeholder = GaussianFit(0.0, 1.0, 0)
    return KeyModel(key, width, dims, mean, scale, placeholder, directory, n), ""


def _say(message: str, quiet: bool) -> None:
    if not quiet:
        print(f"rnnkit: {message}", file=sys.stderr, flush=True)


def _session_scores(
    per_key_z: dict[str, list[np.ndarray]], occ_index: dict[str, list[int]], n_sessions: int
) -> np.ndarray:
    """Each session's largest z (−inf when none of its vectors was checked)."""
    scores = np.full(n_sessions, -np.inf)
    for key, zs in per_key_z.items():
        for session_index, z in zip(occ_index[key], zs, strict=True):
            if z.size:
                scores[session_index] = max(scores[session_index], float(z.max()))
    return scores


@guarded_run
def train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Fit one regressor per key of the normal training sessions, each key's error
    Gaussian on the validation sessions; write the run directory; return the summary."""
    if resume:
        raise ConfigError("--resume does not apply to --task params: train it again (--overwrite)")
    opts = options(cfg)
    started = time.perf_counter()
    out = Path(cfg.out)
    everything = _read(cfg.train)
    normal = [item for item in everything if item[0].label != 1]
    excluded = len(everything) - len(normal)
    if not normal:
        raise DataError("no normal session to train on (all are labelled 1)", cfg.train)
    valid_anomalous: list[tuple[Session, str, int]] = []
    if cfg.valid:
        valid_all = _read(cfg.valid)
        valid = [item for item in valid_all if item[0].label != 1]
        valid_anomalous = [item for item in valid_all if item[0].label == 1]
        train_items = normal
        if not valid:
            raise DataError("no normal session to validate on (all are labelled 1)", cfg.valid)
    else:
        train_items, valid = split_holdout(normal, cfg.valid_fraction, cfg.seed)
    train_occ = _collect(train_items)
    widths = {k: len(o.rows[0][0]) for k, o in train_occ.items()}
    valid_occ = _collect(valid, widths)
    z = normal_quantile((1 + opts["confidence"]) / 2)

    out.mkdir(parents=True, exist_ok=True)
    save_config(out, cfg, keys=len(train_occ))
    keys: list[KeyModel] = []
    skipped: list[dict[str, Any]] = []
    valid_z: dict[str, list[np.ndarray]] = {}
    order = sorted(train_occ, key=lambda k: -train_occ[k].count())
    parameters = 0
    for key in order:
        directory = f"keys/{len(keys):03d}"
        model_key, why = _fit_key(key, widths[key], train_occ[key], directory)
        occ_valid = valid_occ.get(key, _Occurrences([], []))
        if model_key is not None and occ_valid.count() < MIN_VALID_VECTORS:
            model_key, why = (
                None,
                (f"{occ_valid.count()} validation vector(s), fewer than {MIN_VALID_VECTORS}"),
            )
        if model_key is None:
            skipped.append({"key": key, "reason": why, "train_vectors": train_occ[key].count()})
            continue
        sub = dataclasses.replace(
            cfg, task="regress", out=str(out / directory), target="next", loss="mse", extra={}
        )
        train_seqs = _sequences(model_key, train_occ[key])
        valid_seqs = _sequences(model_key, occ_valid)
        summary = fit_sequences(sub, train_seqs, valid_seqs, quiet=True, data=None, key=key)
        parameters += int(summary["parameters"])
        _, _, model = load_regressor(out / directory)  # the weights best on validation
        errors, _ = vector_errors(model, valid_seqs, cfg.batch_size)
        model_key.error = fit_gaussian(np.concatenate(errors), MIN_ERROR_STD)
        model_key.model = model
        model_key.valid_vectors = occ_valid.count()
        keys.append(model_key)
        valid_z[key] = [(e - model_key.error.mean) / model_key.error.std for e in errors]
        mse = (summary.get("valid") or {}).get("mse", math.nan)
        _say(
            f"key {len(keys)} ({model_key.train_vectors} vectors, {len(model_key.dims)} of "
            f"{model_key.width} values): validation mse {mse:.4g} (persistence "
            f"{summary['baselines']['persistence']['mse']:.4g}), errors "
            f"N({model_key.error.mean:.3g}, "
            f"{model_key.error.std:.3g}²): {key[:60]}",
            quiet,
        )
    if not keys:
        reasons = "; ".join(f"{s['key'][:40]!r}: {s['reason']}" for s in skipped[:3])
        raise DataError(f"no key has enough parameter values to model ({reasons})", cfg.train)

    atomic_write_json(
        out / "keys.json",
        {
            "format": KEYS_FORMAT,
            "version": 1,
            "keys": [k.to_json() for k in keys],
            "skipped": skipped,
        },
    )
    run = ParamsModel(cfg, keys, skipped, opts["confidence"], {})
    valid_scores = np.array([r["_score"] for r in _score_items(run, valid, cfg.batch_size)])
    t, how = session_threshold(valid_scores, opts["target_fpr"], opts["threshold"])
    run.thresholds = _write_thresholds(
        out, opts["confidence"], keys, len(valid), opts["target_fpr"], opts["threshold"], t, how
    )
    limit = run.limit()
    arrays = {
        "normal": valid_scores,
        "valid_z": np.concatenate([np.concatenate(v) for v in valid_z.values()]),
    }
    anomalous_scores = None
    if valid_anomalous:
        anomalous_scores = np.array(
            [r["_score"] for r in _score_items(run, valid_anomalous, cfg.batch_size)]
        )
        arrays["anomalous"] = anomalous_scores
    atomic_write(out / "valid_scores.safetensors", write_path=lambda tmp: save_numpy(arrays, tmp))
    summary_doc: dict[str, Any] = {
        "task": "params",
        "elapsed_s": time.perf_counter() - started,
        "parameters": parameters,
        "confidence": opts["confidence"],
        "z": z,
        "target_fpr": opts["target_fpr"],
        "session_threshold": limit,
        "session_threshold_how": how if t >= z else f"z (above {how}: {t:.4g})",
        "keys": {
            "modelled": len(keys),
            "skipped": len(skipped),
            "vectors_modelled": sum(k.train_vectors for k in keys),
            "vectors_skipped": sum(s["train_vectors"] for s in skipped),
        },
        "sessions": {
            "train": len(train_items),
            "valid": len(valid),
            "excluded_anomalous": excluded,
            "valid_anomalous": len(valid_anomalous),
        },
        "validation_fpr": validation_fpr(valid_scores, limit, opts["target_fpr"]),
        "skipped_keys": skipped[:20],
    }
    if anomalous_scores is not None:
        labels = np.r_[np.zeros(len(valid_scores)), np.ones(len(anomalous_scores))]
        summary_doc["valid_detection"] = detection_metrics(
            np.r_[valid_scores, anomalous_scores], labels, limit
        )
    atomic_write_json(out / "summary.json", summary_doc)
    return summary_doc


def _write_thresholds(
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


# ---- loading and scoring ---------------------------------------------------------------


@dataclass
class ParamsModel:
    """A trained ``params`` run, loaded."""

    cfg: TrainConfig
    keys: list[KeyModel]
    skipped: list[dict[str, Any]]
    confidence: float
    thresholds: dict[str, Any]

    def __post_init__(self) -> None:
        self.by_key = {k.key: k for k in self.keys}
        self.widths = {k.key: k.width for k in self.keys}

    def z(self, confidence: float | None = None) -> float:
        """The per-vector bound (in error standard deviations) at a confidence."""
        return normal_quantile((1 + (confidence or self.confidence)) / 2)

    def limit(self, confidence: float | None = None, session_score: float | None = None) -> float:
        """The session threshold ``max(z, t)``: ``t`` the run's validated session score
        (or ``session_score``); a run written before it had one uses ``z`` alone."""
        t = session_score if session_score is not None else self.thresholds.get("session_score")
        z = self.z(confidence)
        return z if t is None else max(z, float(t))


def load_params(run_dir: str | Path, device: str = "cpu") -> ParamsModel:
    """Load a ``params`` run directory (no code is unpickled); errors name the file."""
    run_dir = Path(run_dir)
    cfg, _ = load_config(run_dir, task="params")
    path = run_dir / "keys.json"
    doc = read_json(path)
    try:
        if doc.get("format") != KEYS_FORMAT or doc.get("version") != 1:
            raise ValueError("not an rnnkit keys file of version 1")
        keys = [KeyModel.from_json(k) for k in doc["keys"]]
        skipped = list(doc.get("skipped", []))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    tpath = run_dir / "thresholds.json"
    thresholds = read_json(tpath)
    try:
        confidence = check_confidence(thresholds["confidence"])
        if thresholds.get("format") != THRESHOLDS_FORMAT:
            raise ValueError("not an rnnkit params thresholds file")
    except (KeyError, TypeError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"{tpath}: {exc}") from None
    for key in keys:
        _, info, key.model = load_regressor(run_dir / key.directory, device)
        if info.get("input_size") != len(key.dims):
            raise CheckpointError(
                f"{run_dir / key.directory / 'config.json'}: input_size "
                f"{info.get('input_size')}, but the key reads {len(key.dims)} values"
            )
    return ParamsModel(cfg, keys, skipped, confidence, thresholds)


def _score_items(
    run: ParamsModel,
    items: Sequence[tuple[Session, str, int]],
    batch_size: int = 64,
    top_k: int = 3,
    confidence: float | None = None,
    session_score: float | None = None,
) -> list[dict[str, Any]]:
    """The verdict record of each session (in order), ``_score`` the float score."""
    z_limit = run.z(confidence)
    limit = run.limit(confidence, session_score)
    occ = _collect(items, run.widths)
    # Which session each key's occurrence belongs to (the same order as _collect's).
    owner: dict[str, list[int]] = {}
    positions: dict[str, list[list[int]]] = {}
    for i, (session, _, _) in enumerate(items):
        seen: dict[str, list[int]] = {}
        for pos, event in enumerate(session.events):
            seen.setdefault(event, []).append(pos)
        for event, where in seen.items():
            owner.setdefault(event, []).append(i)
            positions.setdefault(event, []).append(where)
    records: list[dict[str, Any]] = []
    for session, _, _ in items:
        record: dict[str, Any] = {
            "session": session.session,
            "vectors": len(session.events),
            "checked": 0,
            "unmodelled": 0,
            "missing": 0,
            "anomalous_vectors": 0,
            "_top": [],
            "_score": -math.inf,
        }
        if session.label is not None:
            record["label"] = session.label
        records.append(record)
    for event, occurrences in occ.items():
        key = run.by_key.get(event)
        if key is None:
            for i, rows in zip(owner[event], occurrences.rows, strict=True):
                records[i]["unmodelled"] += len(rows)
            continue
        seqs = []
        for rows, i in zip(occurrences.rows, owner[event], strict=True):
            x, missing = key.normalise(_matrix(rows))
            records[i]["missing"] += missing
            start = np.zeros((1, x.shape[1]), np.float32)
            seqs.append(VectorSequence(np.concatenate([start, x]), None, "", 0))
        assert key.model is not None
        errors, preds = vector_errors(key.model, seqs, batch_size)
        bound = key.bound(z_limit)
        for n, i in enumerate(owner[event]):
            rec = records[i]
            zs = (errors[n] - key.error.mean) / key.error.std
            rec["checked"] += len(zs)
            rec["anomalous_vectors"] += int((errors[n] > bound).sum())
            raw = _matrix(occurrences.rows[n])[:, key.dims]
            expected = preds[n] * key.scale + key.mean
            for j, pos in enumerate(positions[event][n]):
                rec["_top"].append(
                    {
                        "position": pos,
                        "event": event,
                        "error": round(float(errors[n][j]), 6),
                        "bound": round(bound, 6),
                        "z": round(float(zs[j]), 4),
                        "anomalous": bool(errors[n][j] > bound),
                        "dims": key.dims,
                        "values": [None if math.isnan(v) else v for v in raw[j].tolist()],
                        "expected": [round(v, 6) for v in expected[j].tolist()],
                    }
                )
            if zs.size:
                rec["_score"] = max(rec["_score"], float(zs.max()))
    for rec in records:
        top = sorted(rec.pop("_top"), key=lambda t: -t["z"])[:top_k]
        score = rec["_score"]
        rec["score"] = None if score == -math.inf else score
        rec["verdict"] = "anomalous" if score > limit else "normal"
        rec["threshold"] = limit
        rec["top"] = top
    return records


def score_sessions(
    run: ParamsModel,
    items: Iterable[tuple[Session, str, int]],
    *,
    batch_size: int = 64,
    top_k: int = 3,
    confidence: float | None = None,
    session_score: float | None = None,
) -> Iterator[dict[str, Any]]:
    """Score ``(session, path, line)`` items with a loaded run, ``batch_size`` sessions at a
    time; one record per session, in order (``confidence`` re-picks the per-vector bound,
    ``session_score`` the validated session score ``t``, see :func:`repick_session_score`):

    ``{"session", "score" (largest z, None when no vector was checked), "verdict",
    "threshold" (the session threshold max(z, t)), "vectors", "checked", "unmodelled",
    "missing", "anomalous_vectors", "top": [{"position", "event", "error", "bound", "z",
    "anomalous", "dims", "values", "expected"}], ["label"]}``.
    """
    batch: list[tuple[Session, str, int]] = []
    for item in items:
        batch.append(item)
        if len(batch) >= batch_size:
            for rec in _score_items(run, batch, batch_size, top_k, confidence, session_score):
                rec.pop("_score")
                yield rec
            batch = []
    if batch:
        for rec in _score_items(run, batch, batch_size, top_k, confidence, session_score):
            rec.pop("_score")
            yield rec


def evaluate(run_dir: str | Path, data_path: str, batch_size: int | None = None) -> dict[str, Any]:
    """Score a session file: counts of vectors checked and flagged; with labels, ``auc``,
    ``precision``, ``recall``, ``f1``, ``fpr`` of the session verdicts."""
    run = load_params(run_dir)
    items = _read(data_path)
    records = _score_items(run, items, batch_size or run.cfg.batch_size)
    z = run.limit()
    metrics: dict[str, Any] = {
        "sessions": len(records),
        "confidence": run.confidence,
        "threshold": z,
        "vectors": sum(r["vectors"] for r in records),
        "checked": sum(r["checked"] for r in records),
        "unmodelled": sum(r["unmodelled"] for r in records),
        "missing": sum(r["missing"] for r in records),
        "anomalous_vectors": sum(r["anomalous_vectors"] for r in records),
        "anomalous_sessions_flagged": sum(r["verdict"] == "anomalous" for r in records),
    }
    labelled = [r for r in records if "label" in r]
    if labelled:
        scores = np.array([r["_score"] for r in labelled])
        labels = np.array([r["label"] for r in labelled])
        m = detection_metrics(scores, labels, z)
        metrics["labelled"] = len(labelled)
        metrics["anomalous_sessions"] = int(labels.sum())
        metrics["auc"] = m.get("auc")
        for k in ("precision", "recall", "f1", "fpr", "tp", "fp", "fn", "tn"):
            metrics[k] = m[k]
    return metrics


def predictor(run_dir: str | Path, batch_size: int | None = None, top: int = 3, **_: Any) -> Any:
    """``rnnkit predict`` for a params run: each input line is a session as JSON with its
    ``"params"``; the answer its record from :func:`score_sessions`."""
    run = load_params(run_dir)
    bs = batch_size or 64

    def score(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        items = [
            (parse_session(text, path, line), path, line)
            for text, (path, line) in zip(lines, where, strict=True)
        ]
        return list(score_sessions(run, items, batch_size=bs, top_k=top))

    return score


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


def combine(record: dict[str, Any], params_record: dict[str, Any]) -> dict[str, Any]:
    """An ``events`` verdict record with the parameter model's beside it: ``verdict`` is
    anomalous when either model says so, ``keys_verdict`` keeps the key-sequence model's
    own, ``params`` holds the parameter model's record (without session and label).

    >>> r = combine({"session": "a", "verdict": "normal"}, {"session": "a", "verdict":
    ...             "anomalous", "score": 9.1})
    >>> r["verdict"], r["keys_verdict"], r["params"]
    ('anomalous', 'normal', {'verdict': 'anomalous', 'score': 9.1})
    """
    if record.get("session") != params_record.get("session"):
        raise ValueError("the two records are of different sessions")
    params = {k: v for k, v in params_record.items() if k not in ("session", "label")}
    either = "anomalous" in (record["verdict"], params["verdict"])
    return {
        **record,
        "verdict": "anomalous" if either else "normal",
        "keys_verdict": record["verdict"],
        "params": params,
    }
