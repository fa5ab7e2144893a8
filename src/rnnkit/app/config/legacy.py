"""Older run directories' ``config.json``: before the anomaly-detection options and the
tagger's word dropout were fields of ``TrainConfig``, a run kept them in an ``extra``
object, under the keys of :data:`LEGACY_KEYS`. ``TrainConfig.from_dict`` moves them onto
their fields here, so that ``--resume``, ``evaluate``, ``predict``, ``score``, ``report``
and ``rnnkit.load`` read those runs as before.
"""

from __future__ import annotations

from typing import Any

from rnnkit.errors import ConfigError

__all__ = ["LEGACY_KEYS", "from_legacy"]

#: A key of an old ``config.json``'s ``extra`` object → the field it is now.
LEGACY_KEYS = {
    "target_fpr": "target_fpr",
    "top_g": "top_g",
    "window": "window",
    "score": "score",
    "threshold": "threshold_method",
    "confidence": "confidence",
    "word_dropout": "word_dropout",
}


def from_legacy(data: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``data`` with an old ``extra`` object's keys moved onto their fields, and each such
    field → where it was (``extra.threshold``), for the messages.

    >>> from_legacy({"train": "x", "extra": {"threshold": "gpd"}}, "config.json")
    ({'train': 'x', 'threshold_method': 'gpd'}, {'threshold_method': 'extra.threshold'})
    """
    if "extra" not in data:
        return data, {}
    data, legacy = dict(data), {}
    extra = data.pop("extra")
    if not isinstance(extra, dict):
        raise ConfigError(f"{where}: extra must be an object, got {type(extra).__name__}")
    for key, value in extra.items():
        name = LEGACY_KEYS.get(key)
        if name is None:
            raise ConfigError(f"{where}: unknown key extra.{key} (known: {sorted(LEGACY_KEYS)})")
        if name in data:
            raise ConfigError(f"{where}: {name} is given twice (and as extra.{key})")
        data[name] = value
        legacy[name] = f"extra.{key}"
    return data, legacy
