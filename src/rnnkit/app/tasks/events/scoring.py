"""A trained ``events`` run, loaded (:func:`load_events`, with its calibration:
:func:`read_calibration`), and what is done with it:
verdicts on sessions (:func:`score_sessions`, ``rnnkit score``), metrics on a labelled
file (:func:`evaluate`) and ``rnnkit predict`` (:func:`predictor`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rnnkit.anomaly.calibration import Calibration, all_scores, score_row, top_items
from rnnkit.anomaly.scores import RUNNING_SCORES, SCORES
from rnnkit.anomaly.surprise import event_surprises, ngram_surprises, surprise_loss
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events.data import EventVocabulary
from rnnkit.app.tasks.events.thresholds import read_thresholds
from rnnkit.app.tasks.run_config import check_batch_size, check_count, load_config
from rnnkit.app.tasks.settings import choose_device, model_spec
from rnnkit.data.events import Session, read_sessions
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.metrics.detection import detection_metrics
from rnnkit.models.builders import build_language_model
from rnnkit.models.language_model import LanguageModel
from rnnkit.models.ngram import NGramModel
from rnnkit.training.checkpoint import (
    load_arrays,
    load_model_weights,
)

__all__ = [
    "EventsModel",
    "evaluate",
    "load_event_model",
    "load_events",
    "predictor",
    "read_calibration",
    "score_sessions",
]


@dataclass
class EventsModel:
    """A trained ``events`` run, loaded: what scoring needs."""

    cfg: TrainConfig
    vocab: EventVocabulary
    model: LanguageModel
    thresholds: dict[str, Any]
    ngram: NGramModel | None
    calibration: dict[str, Calibration] | None = None

    @property
    def scores(self) -> tuple[str, ...]:
        """The session scores this run has thresholds for (every one, unless the run
        predates the calibration)."""
        complete = self.calibration is not None and self.thresholds["version"] >= 2
        return SCORES if complete else RUNNING_SCORES

    def check_score(self, name: str, argument: str = "score") -> None:
        """ConfigError unless this run can give the score ``name``, naming ``argument``:
        the Python argument (``score``, the default) or the command line's option
        (``--score``), whichever the user gave: ``score='norm'`` or ``--score norm``."""
        if name not in SCORES:
            raise ConfigError(f"{argument} must be one of {', '.join(SCORES)}, got {name!r}")
        if name not in self.scores:
            given = f"{argument} {name}" if argument.startswith("--") else f"{argument}={name!r}"
            raise ConfigError(
                f"{given} needs calibration.safetensors, which this run predates "
                f"(retrain it; scores here: {', '.join(self.scores)})"
            )

    def surprises(self, seqs: Sequence[np.ndarray], batch_size: int) -> list[Any]:
        """:func:`event_surprises` with the run's window."""
        return event_surprises(self.model, seqs, batch_size, self.thresholds.get("window"))


def read_calibration(
    run_dir: str | Path, vocab_size: int | None = None
) -> dict[str, Calibration] | None:
    """``calibration.safetensors`` of a run per model, or None (a run from before it);
    ``vocab_size``: the run's vocabulary, which the per-event statistics must cover."""
    path = Path(run_dir) / "calibration.safetensors"
    if not path.is_file():
        return None
    arrays = load_arrays(path)
    try:
        return {m: Calibration.from_arrays(arrays, m, vocab_size) for m in ("rnn", "ngram")}
    except (KeyError, ValueError, OSError) as exc:
        raise CheckpointError(f"{path}: not valid ({exc})") from None


def load_event_model(
    run_dir: str | Path, device: str = "cpu"
) -> tuple[TrainConfig, EventVocabulary, LanguageModel]:
    """The configuration, vocabulary and model (in ``eval()`` mode) of an ``events`` run,
    without its thresholds and calibration; errors name the file."""
    run_dir = Path(run_dir)
    cfg, info = load_config(run_dir, task="events")
    vocab = EventVocabulary.load(run_dir / "vocab.json")
    check_count(run_dir / "vocab.json", len(vocab), "events", info, "vocab_size")
    model = build_language_model(model_spec(cfg), len(vocab)).to(choose_device(device))
    load_model_weights(model, run_dir / "model.safetensors")
    model.eval()
    return cfg, vocab, model


def load_events(run_dir: str | Path, device: str = "cpu") -> EventsModel:
    """Load an ``events`` run directory (no code is unpickled); errors name the file."""
    run_dir = Path(run_dir)
    cfg, vocab, model = load_event_model(run_dir, device)
    thresholds = read_thresholds(run_dir)
    ngram = None
    ngram_path = run_dir / "ngram.safetensors"
    if ngram_path.is_file():
        ngram = NGramModel.from_state(load_arrays(ngram_path), where=str(ngram_path))
    calibration = read_calibration(run_dir, len(vocab))
    return EventsModel(cfg, vocab, model, thresholds, ngram, calibration)


def score_sessions(
    run: EventsModel,
    sessions: Iterable[Session],
    *,
    batch_size: int = 64,
    top_k: int = 5,
    score: str | None = None,
    thresholds: dict[str, dict[str, float]] | None = None,
    ngram: bool = False,
) -> Iterator[dict[str, Any]]:
    """Score sessions with a loaded run; one result dict per session, in order.

    Sessions are consumed ``batch_size`` at a time, so a file of any size streams through.

    Args:
        run: from :func:`load_events`.
        sessions: the sessions (labels, if any, are passed through).
        top_k: how many of the most surprising events to list.
        score: which session score gives the verdict (default: the run's).
        thresholds: per model and score (default: the run's, see :func:`repick_thresholds`).
        ngram: add the n-gram baseline's scores (``"ngram": {...}``).

    Yields:
        ``{"session", "score", "verdict", "threshold", "scores": {max, mean, count},
        "events", "unknown", "top": [{position, event, surprise, miss[, unknown]}],
        ["label"], ["ngram"]}``.
    """
    check_batch_size(batch_size, none=None)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        # a negative count sliced the list from its end: all but the last events listed
        raise ConfigError(f"top_k must be an integer ≥ 0, got {top_k!r}")
    name = score or run.thresholds["score"]
    run.check_score(name)
    limits = thresholds or {m: run.thresholds[m] for m in ("rnn", "ngram")}
    cal = run.calibration or {}
    g = int(run.thresholds["top_g"])
    if ngram and run.ngram is None:
        raise CheckpointError("this run has no ngram.safetensors")
    batch: list[Session] = []

    def flush() -> Iterator[dict[str, Any]]:
        encoded = [run.vocab.encode_events(s.events) for s in batch]
        seqs = [ids for ids, _ in encoded]
        per_event = run.surprises(seqs, batch_size)
        per_ngram = ngram_surprises(run.ngram, seqs) if ngram and run.ngram else None
        all_rnn = all_scores(per_event, seqs, g, cal.get("rnn"))
        all_ngram = all_scores(per_ngram, seqs, g, cal.get("ngram")) if per_ngram else None
        for i, session in enumerate(batch):
            surprise, rank = per_event[i]
            scores = score_row(all_rnn, i)
            value = float(scores[name])
            limit = float(limits["rnn"][name])
            record: dict[str, Any] = {
                "session": session.session,
                "score": value,
                "verdict": "anomalous" if value > limit else "normal",
                "threshold": limit,
                "scores": scores,
                "events": len(session.events),
                "unknown": encoded[i][1],
                "top": top_items(surprise, rank, seqs[i], session.events, top_k, g),
            }
            if session.label is not None:
                record["label"] = session.label
            if per_ngram is not None:
                assert all_ngram is not None
                ns = score_row(all_ngram, i)
                nlimit = float(limits["ngram"][name])
                record["ngram"] = {
                    "score": float(ns[name]),
                    "verdict": "anomalous" if ns[name] > nlimit else "normal",
                    "threshold": nlimit,
                    "scores": ns,
                }
            yield record

    for session in sessions:
        batch.append(session)
        if len(batch) >= batch_size:
            yield from flush()
            batch = []
    if batch:
        yield from flush()


def evaluate(
    run_dir: str | Path, data_path: str, batch_size: int | None = None, device: str = "cpu"
) -> dict[str, Any]:
    """Score a labelled (or unlabelled) session file with the model and the baseline.

    Returns ``loss_nats``/``tokens``/``perplexity`` over every event (and session end) of the
    file; with labels: ``auc`` (``None`` unless both classes occur), ``precision``,
    ``recall``, ``f1``, ``fpr`` at the stored threshold of the run's score (``None`` where
    undefined: no recall without anomalous sessions, no precision with none flagged, no
    FPR without normal sessions; :func:`rnnkit.metrics.detection.precision_recall_f1`),
    the same for each score (``rnn_max``, ``rnn_mean``, ``rnn_count``) and for the n-gram
    baseline (``ngram`` for the run's score, ``ngram_max``…), side by side.
    """
    check_batch_size(batch_size)
    run = load_events(run_dir, device)
    sessions = read_sessions(data_path)
    bs = batch_size or run.cfg.batch_size
    encoded = [run.vocab.encode_events(s.events) for s in sessions]
    seqs = [ids for ids, _ in encoded]
    g = int(run.thresholds["top_g"])
    name = run.thresholds["score"]
    rnn = run.surprises(seqs, bs)
    metrics: dict[str, Any] = {
        **surprise_loss(rnn),
        "sessions": len(sessions),
        "events": sum(len(s) for s in seqs),
        "unknown_events": sum(n for _, n in encoded),
        "score": name,
        "target_fpr": run.thresholds["target_fpr"],
        "top_g": g,
        "threshold": run.thresholds["rnn"][name],
    }
    labelled = [i for i, s in enumerate(sessions) if s.label is not None]
    ngram_per = ngram_surprises(run.ngram, seqs) if run.ngram is not None else None
    if ngram_per is not None:
        metrics["ngram"] = {
            "order": run.ngram.order,  # type: ignore[union-attr]
            **surprise_loss(ngram_per),
        }
    if not labelled:
        return metrics
    labels = np.array([sessions[i].label for i in labelled])
    metrics["labelled"] = len(labelled)
    metrics["anomalous_sessions"] = int(labels.sum())
    models = {"rnn": rnn, **({"ngram": ngram_per} if ngram_per is not None else {})}
    cal = run.calibration or {}
    for model_name, per_event in models.items():
        scores = all_scores(
            [per_event[i] for i in labelled], [seqs[i] for i in labelled], g, cal.get(model_name)
        )
        for score_name in run.scores:
            m = detection_metrics(
                scores[score_name], labels, run.thresholds[model_name][score_name]
            )
            metrics[f"{model_name}_{score_name}"] = m
        main = metrics[f"{model_name}_{name}"]
        if model_name == "rnn":
            metrics["auc"] = main.get("auc")
            for key in ("precision", "recall", "f1", "fpr"):
                metrics[key] = main[key]
        else:
            # the keys of the model's, auc None too where undefined (it was left out)
            metrics["ngram"].update(
                {k: main.get(k) for k in ("auc", "precision", "recall", "f1", "fpr")}
            )
    return metrics


def predictor(
    run_dir: str | Path,
    batch_size: int | None = None,
    device: str = "cpu",
    top: int = 5,
    params: str | Path | None = None,
    **_: Any,
) -> Any:
    """``rnnkit predict`` for an events run: each input line is one session as JSON
    (``{"session": id, "events": [...]}``, as ``rnnkit score`` reads), the result its
    verdict record from :func:`score_sessions` (the run's score and thresholds). With
    ``params`` (a ``params`` run directory) the parameter values are judged too
    (:func:`rnnkit.app.tasks.params.combine`)."""
    check_batch_size(batch_size, none="64")
    from rnnkit.data.events import parse_session

    run = load_events(run_dir, device)
    bs = batch_size or 64
    params_run = None
    if params is not None:
        from rnnkit.app.tasks import params as params_task

        params_run = params_task.load_params(params, device)

    def score(lines: list[str], where: list[tuple[str, int]]) -> list[dict[str, Any]]:
        sessions = [
            parse_session(text, path, line) for text, (path, line) in zip(lines, where, strict=True)
        ]
        records = list(score_sessions(run, sessions, batch_size=bs, top_k=top))
        if params_run is None:
            return records
        items = [(s, path, line) for s, (path, line) in zip(sessions, where, strict=True)]
        judged = params_task.score_sessions(params_run, items, batch_size=bs, top_k=top)
        return [params_task.combine(r, p) for r, p in zip(records, judged, strict=True)]

    return score
