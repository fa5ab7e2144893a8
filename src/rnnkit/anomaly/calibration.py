"""Every session score of a model from its per-event surprises (:mod:`rnnkit.anomaly.scores`),
the calibration the ``norm`` and ``combined`` scores are measured against, and a session's
most surprising events as a verdict lists them.

Per-event surprises come as ``(surprise (n+1,), rank (n+1,))`` per session of ``n`` events
(position ``n`` is the session's end ``</s>``), as :mod:`rnnkit.anomaly.surprise` gives
them; a top-g miss is ``rank ≥ g``.

>>> import numpy as np
>>> per_event = [(np.array([0.5, 2.0, 0.1]), np.array([0, 3, 0]))]
>>> scores = all_scores(per_event, [np.array([4, 5])], top_g=2, calibration=None)
>>> score_row(scores, 0)
{'max': 2.0, 'mean': 0.8666666666666667, 'count': 1, 'end': 0.1}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rnnkit.anomaly.scores import (
    COMBINED_PARTS,
    RUNNING_SCORES,
    KeyStats,
    combined_scores,
    session_scores,
    top_events,
)
from rnnkit.data.vocab import EOS_ID, SPECIALS, UNK_ID

__all__ = ["Calibration", "all_scores", "score_row", "top_items"]


def _targets(seq: np.ndarray) -> np.ndarray:
    """The ids each surprise is of: the session's events, then ``</s>``."""
    return np.append(np.asarray(seq, dtype=np.int64), EOS_ID)


def _session_rows(
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    seqs: Sequence[np.ndarray],
    top_g: int,
    keys: KeyStats | None,
) -> list[dict[str, float | int]]:
    return [
        session_scores(s, r >= top_g, None if keys is None else keys.normalise(s, _targets(q)))
        for (s, r), q in zip(per_event, seqs, strict=True)
    ]


@dataclass
class Calibration:
    """What a model's ``norm`` and ``combined`` scores are measured against: each event's
    typical surprise, and the :data:`~rnnkit.anomaly.scores.COMBINED_PARTS` scores of the
    (normal) training sessions."""

    keys: KeyStats
    parts: dict[str, np.ndarray]

    @classmethod
    def fit(
        cls,
        per_event: Sequence[tuple[np.ndarray, np.ndarray]],
        seqs: Sequence[np.ndarray],
        vocab_size: int,
        top_g: int,
    ) -> Calibration:
        pairs = [(s, _targets(q)) for (s, _), q in zip(per_event, seqs, strict=True)]
        keys = KeyStats.fit(pairs, vocab_size)
        rows = _session_rows(per_event, seqs, top_g, keys)
        parts = {n: np.array([row[n] for row in rows], dtype=np.float64) for n in COMBINED_PARTS}
        return cls(keys, parts)

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """The arrays to store, named ``{prefix}/key_mean``, ``{prefix}/parts/max``, …"""
        out = {f"{prefix}/key_mean": self.keys.mean, f"{prefix}/key_std": self.keys.std}
        out.update({f"{prefix}/parts/{n}": v for n, v in self.parts.items()})
        return out

    @classmethod
    def from_arrays(
        cls, arrays: dict[str, np.ndarray], prefix: str, vocab_size: int | None = None
    ) -> Calibration:
        """Back from :meth:`arrays`: a missing array is a ``KeyError``; a non-finite value
        (a NaN mean made every ``norm`` and ``combined`` score NaN, every verdict
        "normal"), or key statistics of another vocabulary than ``vocab_size`` (when
        given), a ``ValueError`` naming the array."""
        names = [f"{prefix}/key_mean", f"{prefix}/key_std"]
        names += [f"{prefix}/parts/{n}" for n in COMBINED_PARTS]
        for name in names:
            values = np.asarray(arrays[name])
            if values.dtype.kind not in "fiu" or not np.isfinite(values).all():
                raise ValueError(f"{name} holds values that are not finite numbers")
        keys = KeyStats(arrays[f"{prefix}/key_mean"], arrays[f"{prefix}/key_std"])
        if vocab_size is not None and len(keys.mean) != vocab_size:
            raise ValueError(
                f"{prefix}/key_mean has {len(keys.mean)} events, the vocabulary {vocab_size}"
            )
        return cls(keys, {n: arrays[f"{prefix}/parts/{n}"] for n in COMBINED_PARTS})


def all_scores(
    per_event: Sequence[tuple[np.ndarray, np.ndarray]],
    seqs: Sequence[np.ndarray],
    top_g: int,
    calibration: Calibration | None,
) -> dict[str, np.ndarray]:
    """Every session score, ``(n,)`` each; without a calibration (a run from before it was
    stored) only the :data:`~rnnkit.anomaly.scores.RUNNING_SCORES` and ``end``."""
    keys = None if calibration is None else calibration.keys
    rows = _session_rows(per_event, seqs, top_g, keys)
    names = COMBINED_PARTS if calibration is not None else (*RUNNING_SCORES, "end")
    out = {n: np.array([row[n] for row in rows], dtype=np.float64) for n in names}
    if calibration is not None:
        out["combined"] = combined_scores(calibration.parts, out)
    return out


def score_row(scores: dict[str, np.ndarray], i: int) -> dict[str, float | int]:
    """Session ``i``'s scores as plain numbers (``count`` an integer)."""
    return {k: int(v[i]) if k == "count" else float(v[i]) for k, v in scores.items()}


def top_items(
    surprise: np.ndarray, rank: np.ndarray, ids: np.ndarray, events: Sequence[str], k: int, g: int
) -> list[dict[str, Any]]:
    """The ``k`` most surprising events of a session, most surprising first, as a verdict
    lists them: position, event (``</s>`` for the end), surprise, whether it is a top-``g``
    miss, and ``unknown`` for an event outside the vocabulary."""
    items = []
    for position, s in top_events(surprise, k):
        end = position == len(events)
        item: dict[str, Any] = {
            "position": position,
            "event": SPECIALS[EOS_ID] if end else events[position],
            "surprise": round(s, 4),
            "miss": bool(rank[position] >= g),
        }
        if not end and ids[position] == UNK_ID:
            item["unknown"] = True
        items.append(item)
    return items
