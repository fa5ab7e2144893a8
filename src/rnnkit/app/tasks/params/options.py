"""The ``params`` task's own options (``cfg.extra``): their defaults and checks."""

from __future__ import annotations

from typing import Any

from rnnkit.anomaly.thresholds import (
    THRESHOLD_METHODS,
)
from rnnkit.app.config import TrainConfig
from rnnkit.errors import ConfigError

__all__ = [
    "DEFAULTS",
    "check_confidence",
    "check_target_fpr",
    "options",
]


#: Options read from ``cfg.extra`` and their defaults.
DEFAULTS: dict[str, Any] = {"confidence": 0.99, "target_fpr": 0.01, "threshold": "quantile"}


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
