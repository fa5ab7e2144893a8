"""A trained ``params`` run, loaded (:func:`load_params`), and what is done with it: a
verdict record per session (:func:`score_sessions`), metrics on a labelled file
(:func:`evaluate`), ``rnnkit predict`` (:func:`predictor`), and the key-sequence model's
verdict combined with this one's (:func:`combine`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rnnkit.anomaly.thresholds import (
    normal_quantile,
)
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.params.keys import (
    KEYS_FORMAT,
    KeyModel,
    as_matrix,
    collect,
    read_items,
    vector_errors,
)
from rnnkit.app.tasks.params.options import check_confidence
from rnnkit.app.tasks.params.thresholds import THRESHOLDS_FORMAT
from rnnkit.app.tasks.regress import load_regressor
from rnnkit.app.tasks.run_config import check_batch_size, load_config
from rnnkit.data.events import Session, parse_session
from rnnkit.data.vectors import VectorSequence
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.metrics.detection import detection_metrics
from rnnkit.training.checkpoint import read_json

__all__ = [
    "ParamsModel",
    "combine",
    "evaluate",
    "load_params",
    "predictor",
    "score_sessions",
]


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
        """The per-vector bound (in error standard deviations) at a confidence (None: the
        run's); one outside (0, 1) is a ``ConfigError`` naming ``confidence`` (0 was taken
        for the run's, 1.5 failed inside the quantile)."""
        c = self.confidence if confidence is None else check_confidence(confidence)
        return normal_quantile((1 + c) / 2)

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


def _owners(
    items: Sequence[tuple[Session, str, int]],
) -> tuple[dict[str, list[int]], dict[str, list[list[int]]]]:
    """Per key, which session each of its occurrences belongs to (the same order as
    ``collect``'s) and the key's positions in that session."""
    owner: dict[str, list[int]] = {}
    positions: dict[str, list[list[int]]] = {}
    for i, (session, _, _) in enumerate(items):
        seen: dict[str, list[int]] = {}
        for pos, event in enumerate(session.events):
            seen.setdefault(event, []).append(pos)
        for event, where in seen.items():
            owner.setdefault(event, []).append(i)
            positions.setdefault(event, []).append(where)
    return owner, positions


def _empty_record(session: Session) -> dict[str, Any]:
    """A session's record before any of its vectors is judged."""
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
    return record


def score_items(
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
    occ = collect(items, run.widths)
    owner, positions = _owners(items)
    records = [_empty_record(session) for session, _, _ in items]
    for event, occurrences in occ.items():
        key = run.by_key.get(event)
        if key is None:
            for i, rows in zip(owner[event], occurrences.rows, strict=True):
                records[i]["unmodelled"] += len(rows)
            continue
        seqs = []
        for rows, i in zip(occurrences.rows, owner[event], strict=True):
            x, missing = key.normalise(as_matrix(rows))
            records[i]["missing"] += missing
            start = np.zeros((1, x.shape[1]), np.float32)
            seqs.append(VectorSequence(np.concatenate([start, x]), None, "", 0))
        assert key.model is not None
        errors, preds = vector_errors(key.model, seqs, batch_size)
        bound = key.bound(z_limit)
        for n, i in enumerate(owner[event]):
            rec = records[i]
            # A vector the model cannot score (a value beyond float32 once normalised is
            # inf, and the state after it NaN) is anomalous: a NaN error compares false
            # with every bound, and max() drops it, so the session was "normal".
            errors[n] = np.where(np.isfinite(errors[n]), errors[n], np.inf)
            zs = (errors[n] - key.error.mean) / key.error.std
            rec["checked"] += len(zs)
            rec["anomalous_vectors"] += int((errors[n] > bound).sum())
            raw = as_matrix(occurrences.rows[n])[:, key.dims]
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
            for rec in score_items(run, batch, batch_size, top_k, confidence, session_score):
                rec.pop("_score")
                yield rec
            batch = []
    if batch:
        for rec in score_items(run, batch, batch_size, top_k, confidence, session_score):
            rec.pop("_score")
            yield rec


def evaluate(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score a session file: counts of vectors checked and flagged; with labels, ``auc``,
    ``precision``, ``recall``, ``f1``, ``fpr`` of the session verdicts (each None where
    undefined, as ``auc`` without both classes: no recall without anomalous sessions;
    :func:`rnnkit.metrics.detection.precision_recall_f1`)."""
    check_batch_size(batch_size)
    run = load_params(run_dir, device)
    items = read_items(data_path)
    records = score_items(run, items, batch_size or run.cfg.batch_size)
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


def predictor(
    run_dir: str | Path, batch_size: int | None = None, device: str = "cpu", top: int = 3, **_: Any
) -> Any:
    """``rnnkit predict`` for a params run: each input line is a session as JSON with its
    ``"params"``; the answer its record from :func:`score_sessions`."""
    check_batch_size(batch_size, none="64")
    run = load_params(run_dir, device)
    bs = batch_size or 64

    def score(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        items = [
            (parse_session(text, path, line), path, line)
            for text, (path, line) in zip(lines, where, strict=True)
        ]
        return list(score_sessions(run, items, batch_size=bs, top_k=top))

    return score


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
