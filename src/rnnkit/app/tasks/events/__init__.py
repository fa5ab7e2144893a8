"""The ``events`` task: a next-event language model of normal sessions, and anomaly scores.

``rnnkit train --task events`` reads JSON-lines sessions (:mod:`rnnkit.data.events`),
trains a recurrent LM over the event vocabulary on the *normal* sessions (unlabelled or
``label: 0``; ``label: 1`` sessions in the training file are left out and counted), fits
the n-gram baseline on the same sessions, scores the normal validation sessions with both
models and stores, per model and per session score (:mod:`rnnkit.anomaly.scores`), the threshold
for the target false-positive rate. The run directory holds, besides the usual files::

    thresholds.json            target FPR, top-g, window, the default score, how thresholds
                               are picked, every threshold
    valid_scores.safetensors   the validation sessions' scores (thresholds can be re-picked
                               at another FPR without retraining: ``rnnkit score --target-fpr``),
                               and those of labelled validation sessions (the report's curves)
    calibration.safetensors    per model, each event's mean and standard deviation of
                               surprise and the training sessions' scores: what the ``norm``
                               and ``combined`` scores are measured against
    ngram.safetensors          the n-gram baseline

Each session is one example: inputs ``<s> e_1 … e_n``, targets ``e_1 … e_n </s>``, padded
and bucketed by length. ``--bptt full`` (the task's default) backpropagates through whole
sessions, ``window:K`` is the exact windowed BPTT(K) and ``segment:K`` carries the state
across every K-th step with the gradient cut there (``train.segment_loss``; sessions are
never concatenated). Sessions longer than ``--max-len`` are trained in
pieces of that many events (a piece after the first starts from a zero state with the
previous event as input); scoring always runs whole sessions, carrying the state.

Options (``rnnkit.app.config.EventsOptions``, ``rnnkit train --target-fpr/--top-g/
--window/--score/--threshold-method``): ``target_fpr`` (0.01), ``top_g`` (9, DeepLog's
default), ``window`` (None: each prediction sees the whole session so far; ``h``: only
the last ``h`` events, from a zero state, as DeepLog's window, and training runs pieces
of ``h`` events),
``score`` (one of :data:`rnnkit.anomaly.scores.SCORES`, default ``"combined"``) and
``threshold_method`` (``"quantile"`` or ``"gpd"``,
:func:`rnnkit.anomaly.thresholds.pick_threshold`).

The modules, one job each: ``options`` (the task's options and their checks), ``data``
(the event vocabulary; reading, splitting and encoding sessions), ``thresholds``
(writing, reading and re-picking a run's thresholds), ``train`` (training the run),
``summary`` (``summary.json``), ``scoring`` (a trained run: load, score, evaluate,
predict). What they compute with is the library's, in :mod:`rnnkit.anomaly`: the
per-event surprise and rank under the LM and the n-gram (``surprise``), the session
scores and their calibration (``scores``, ``calibration``), the thresholds and what the
validation sessions show of them (``thresholds``).
"""

from rnnkit.anomaly.calibration import Calibration
from rnnkit.anomaly.surprise import event_surprises, ngram_surprises
from rnnkit.anomaly.thresholds import validation_fpr
from rnnkit.app.tasks.events.data import (
    MIN_THRESHOLD_SESSIONS,
    EventsData,
    EventVocabulary,
    prepare_events_data,
    validation_sessions,
)
from rnnkit.app.tasks.events.options import options
from rnnkit.app.tasks.events.scoring import (
    EventsModel,
    evaluate,
    load_event_model,
    load_events,
    predictor,
    read_calibration,
    score_sessions,
)
from rnnkit.app.tasks.events.thresholds import read_thresholds, repick_thresholds
from rnnkit.app.tasks.events.train import init_output_bias, train

__all__ = [
    "MIN_THRESHOLD_SESSIONS",
    "Calibration",
    "EventVocabulary",
    "EventsData",
    "EventsModel",
    "evaluate",
    "event_surprises",
    "init_output_bias",
    "load_event_model",
    "load_events",
    "ngram_surprises",
    "options",
    "predictor",
    "prepare_events_data",
    "read_calibration",
    "read_thresholds",
    "repick_thresholds",
    "score_sessions",
    "train",
    "validation_fpr",
    "validation_sessions",
]
