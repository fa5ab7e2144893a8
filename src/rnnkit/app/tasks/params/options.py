"""The ``params`` task's own options (``rnnkit.app.config.ParamsOptions`` and the two of
``EventsOptions`` it reads), checked, by the names the run's files use; the checks of a
confidence and a rate that ``rnnkit score`` re-picks with."""

from __future__ import annotations

from typing import Any

from rnnkit.app.config import EventsOptions, ParamsOptions, TrainConfig
from rnnkit.errors import ConfigError

__all__ = [
    "check_confidence",
    "check_target_fpr",
    "options",
]


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The params options of ``cfg``, checked (a ``ConfigError`` naming the option), by
    the names the run's files use (``threshold``: the method).

    >>> options(TrainConfig(train="x", confidence=0.999))["confidence"]
    0.999
    """
    cfg.check_fields(ParamsOptions, EventsOptions)
    return {
        "confidence": cfg.confidence,
        "target_fpr": cfg.target_fpr,
        "threshold": cfg.threshold_method,
    }


def check_confidence(c: Any, argument: str = "confidence") -> float:
    """``c`` if it is a confidence in (0, 1), else a ConfigError naming ``argument`` (the
    Python argument, or the field of ``thresholds.json``; ``rnnkit score`` and ``rnnkit
    train`` check their ``--confidence`` first).

    >>> check_confidence(1.5)
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: confidence must be in (0, 1), got 1.5
    """
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 < c < 1:
        raise ConfigError(f"{argument} must be in (0, 1), got {c!r}")
    return float(c)


def check_target_fpr(f: Any, argument: str = "target_fpr") -> float:
    """``f`` if it is a rate in (0, 1), else a ConfigError naming ``argument`` (the
    Python argument; ``rnnkit score`` checks its ``--target-fpr`` first)."""
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
        raise ConfigError(f"{argument} must be in (0, 1), got {f!r}")
    return float(f)
