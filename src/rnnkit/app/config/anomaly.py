"""The options of the anomaly-detection tasks: ``events`` (sessions of events scored by
a next-event model) and ``params`` (the numbers of log lines, one regressor per key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rnnkit.anomaly.scores import SCORES
from rnnkit.anomaly.thresholds import THRESHOLD_METHODS
from rnnkit.app.config.fields import option

__all__ = ["EventsOptions", "ParamsOptions"]


@dataclass(kw_only=True)
class EventsOptions:
    """How sessions are scored and where the thresholds lie (``params``: the two marked)."""

    title: ClassVar[str] = "anomaly detection (--task events; params: the two marked)"

    target_fpr: float = option(
        0.01,
        metavar="A",
        rate=True,
        tasks=("events", "params"),
        help="false-positive rate the thresholds aim at on normal validation sessions "
        "(default %(default)s; params too: its session threshold)",
    )
    top_g: int = option(
        9,  # DeepLog's
        metavar="G",
        positive=True,
        tasks=("events",),
        help="an event outside the G most probable is a miss (the count score; default 9)",
    )
    window: int | None = option(
        None,
        metavar="H",
        positive=True,
        tasks=("events",),
        help="each prediction sees only the last H events (DeepLog's window; default: "
        "the whole session so far)",
    )
    score: str = option(
        # measured on real and generated sessions (docs/defaults.md): best on most
        "combined",
        choices=SCORES,
        tasks=("events",),
        help="the session score giving verdicts: max or mean surprise, count of top-g misses, "
        "end (surprise of the session's end), norm (surprise against each event's typical "
        "one) or combined (default %(default)s); docs/anomaly.md compares them",
    )
    threshold_method: str = option(
        "quantile",
        choices=THRESHOLD_METHODS,
        tasks=("events", "params"),
        help="quantile: the empirical one; gpd: a generalized Pareto fit of the validation "
        "scores' tail, for rates the validation sessions are too few to show (default "
        "%(default)s; params too)",
    )


@dataclass(kw_only=True)
class ParamsOptions:
    """When a parameter vector is anomalous."""

    title: ClassVar[str] = "parameter values (--task params)"

    confidence: float = option(
        0.99,
        metavar="C",
        rate=True,
        tasks=("params",),
        help="a parameter vector whose prediction error is above the upper end of this "
        "confidence interval of the key's validation errors is anomalous (default "
        "%(default)s)",
    )
