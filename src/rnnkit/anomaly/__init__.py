"""Anomaly detection on sessions of events: surprises, scores, thresholds, streaming.

* ``surprise``: the per-event surprise and rank of whole sessions under a next-event
  language model (or a history window of it) and under the n-gram baseline;
* ``scores``: per-event surprise and rank from log-probabilities, the session scores
  (``max``, ``mean``, ``count``, ``end``, ``norm``, ``combined``), per-event statistics
  and tail p-values;
* ``calibration``: every session score of a model's sessions at once, the calibration
  that ``norm`` and ``combined`` are measured against, a verdict's most surprising events;
* ``thresholds``: the threshold at a target false-positive rate (empirical or from a
  generalized Pareto tail) and how far it can be trusted (Clopper–Pearson);
* ``streaming``: scoring events as they arrive (``rnnkit score --follow``): one
  recurrent state per open session, verdicts when a session ends;
* ``session_state``: one model step per event and the pool of open sessions' states;
* ``stream_format``: the JSON-lines format of streamed events and its parser;
* ``follow``: reading a growing file or a pipe line by line (``tail -F``).

The detection metrics (ROC-AUC, precision, recall, F1) are in :mod:`rnnkit.metrics`.
"""

from rnnkit.anomaly.calibration import Calibration, all_scores, score_row, top_items
from rnnkit.anomaly.follow import OVERLONG, follow_lines
from rnnkit.anomaly.scores import (
    COMBINED_PARTS,
    RUNNING_SCORES,
    SCORES,
    KeyStats,
    RunningScore,
    combined_scores,
    log_tail_pvalues,
    session_scores,
    surprise_and_rank,
    tail_pvalues,
    top_events,
)
from rnnkit.anomaly.session_state import step_function
from rnnkit.anomaly.stream_format import StreamItem, parse_stream_line
from rnnkit.anomaly.streaming import StreamScorer, scores_array
from rnnkit.anomaly.surprise import (
    RANK_CELLS,
    SCORE_CHUNK,
    event_surprises,
    ngram_surprises,
    surprise_loss,
)
from rnnkit.anomaly.thresholds import (
    THRESHOLD_METHODS,
    GaussianFit,
    GPDFit,
    clopper_pearson,
    fit_gaussian,
    fit_gpd_pwm,
    gpd_threshold,
    normal_quantile,
    pick_threshold,
    pick_thresholds,
    resolvable_fpr,
    sessions_to_resolve,
    threshold_at_fpr,
    validation_fpr,
)

__all__ = [
    "COMBINED_PARTS",
    "OVERLONG",
    "RANK_CELLS",
    "RUNNING_SCORES",
    "SCORES",
    "SCORE_CHUNK",
    "THRESHOLD_METHODS",
    "Calibration",
    "GPDFit",
    "GaussianFit",
    "KeyStats",
    "RunningScore",
    "StreamItem",
    "StreamScorer",
    "all_scores",
    "clopper_pearson",
    "combined_scores",
    "event_surprises",
    "fit_gaussian",
    "fit_gpd_pwm",
    "follow_lines",
    "gpd_threshold",
    "log_tail_pvalues",
    "ngram_surprises",
    "normal_quantile",
    "parse_stream_line",
    "pick_threshold",
    "pick_thresholds",
    "resolvable_fpr",
    "score_row",
    "scores_array",
    "session_scores",
    "sessions_to_resolve",
    "step_function",
    "surprise_and_rank",
    "surprise_loss",
    "tail_pvalues",
    "threshold_at_fpr",
    "top_events",
    "top_items",
    "validation_fpr",
]
