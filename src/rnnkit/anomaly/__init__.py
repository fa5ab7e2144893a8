"""Anomaly detection on sessions of events: scores, thresholds, streaming.

* ``scores``: per-event surprise and rank, the session scores (``max``, ``mean``,
  ``count``, ``end``, ``norm``, ``combined``), per-event statistics and tail p-values;
* ``thresholds``: the threshold at a target false-positive rate (empirical or from a
  generalized Pareto tail) and how far it can be trusted (Clopper–Pearson);
* ``streaming``: scoring events as they arrive (``rnnkit score --follow``): one
  recurrent state per open session, verdicts when a session ends;
* ``session_state``: one model step per event and the pool of open sessions' states;
* ``stream_format``: the JSON-lines format of streamed events and its parser;
* ``follow``: reading a growing file or a pipe line by line (``tail -F``).

The detection metrics (ROC-AUC, precision, recall, F1) are in :mod:`rnnkit.metrics`.
"""

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
    resolvable_fpr,
    threshold_at_fpr,
)

__all__ = [
    "COMBINED_PARTS",
    "OVERLONG",
    "RUNNING_SCORES",
    "SCORES",
    "THRESHOLD_METHODS",
    "GPDFit",
    "GaussianFit",
    "KeyStats",
    "RunningScore",
    "StreamItem",
    "StreamScorer",
    "clopper_pearson",
    "combined_scores",
    "fit_gaussian",
    "fit_gpd_pwm",
    "follow_lines",
    "gpd_threshold",
    "log_tail_pvalues",
    "normal_quantile",
    "parse_stream_line",
    "pick_threshold",
    "resolvable_fpr",
    "scores_array",
    "session_scores",
    "step_function",
    "surprise_and_rank",
    "tail_pvalues",
    "threshold_at_fpr",
    "top_events",
]
