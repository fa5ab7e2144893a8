"""The ``events`` task's own options (``rnnkit.app.config.EventsOptions``), checked, by
the names the run's files use."""

from __future__ import annotations

from typing import Any

from rnnkit.app.config import EventsOptions, TrainConfig

__all__ = ["options"]


def options(cfg: TrainConfig) -> dict[str, Any]:
    """The events options of ``cfg``, checked (a ``ConfigError`` naming the option), by
    the names the run's files use (``threshold``: the method).

    >>> options(TrainConfig(train="x", top_g=3))["top_g"]
    3
    """
    cfg.check_fields(EventsOptions)
    return {
        "target_fpr": cfg.target_fpr,
        "top_g": cfg.top_g,
        "score": cfg.score,
        "window": cfg.window,
        "threshold": cfg.threshold_method,
    }
