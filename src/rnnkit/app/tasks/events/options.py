"""The ``events`` task's own options (``cfg.extra``): their defaults and checks."""

from __future__ import annotations

from typing import Any

from rnnkit.anomaly.scores import (
    SCORES,
)
from rnnkit.anomaly.thresholds import (
    THRESHOLD_METHODS,
)
from rnnkit.app.config import TrainConfig
from rnnkit.errors import ConfigError

__all__ = ["DEFAULTS", "options"]


#: Options read from ``cfg.extra`` and their defaults.
DEFAULTS: dict[str, Any] = {
    "target_fpr": 0.01,
    "top_g": 9,
    "score": "max",
    "window": None,
    "threshold": "quantile",
}


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The events options of ``cfg.extra`` merged over :data:`DEFAULTS`, validated.

    >>> options(TrainConfig(train="x", extra={"top_g": 3}))["top_g"]
    3
    """
    unknown = sorted(set(cfg.extra) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"unknown events option(s) {unknown} (known: {sorted(DEFAULTS)})")
    opts = {**DEFAULTS, **cfg.extra}
    fpr = opts["target_fpr"]
    if isinstance(fpr, bool) or not isinstance(fpr, (int, float)) or not 0 < fpr < 1:
        raise ConfigError(f"target_fpr must be in (0, 1), got {fpr!r}")
    g = opts["top_g"]
    if isinstance(g, bool) or not isinstance(g, int) or g < 1:
        raise ConfigError(f"top_g must be an integer ≥ 1, got {g!r}")
    if opts["score"] not in SCORES:
        raise ConfigError(f"score must be one of {', '.join(SCORES)}, got {opts['score']!r}")
    h = opts["window"]
    if h is not None and (isinstance(h, bool) or not isinstance(h, int) or h < 1):
        raise ConfigError(f"window must be an integer ≥ 1 (events of context), got {h!r}")
    if opts["threshold"] not in THRESHOLD_METHODS:
        raise ConfigError(
            f"threshold method must be one of {', '.join(THRESHOLD_METHODS)}, "
            f"got {opts['threshold']!r}"
        )
    return opts
