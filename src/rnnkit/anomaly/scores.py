"""Anomaly scores of event sessions: per-event surprise, top-g misses, session scores and
their combination. Pure functions. (Thresholds are in :mod:`rnnkit.anomaly.thresholds`,
ROC-AUC and the verdict metrics in :mod:`rnnkit.metrics.detection`.)

Per event ``t`` of a session (its end ``</s>`` included, so a session cut short is
visible), given the model's log-probabilities ``log p(· | e_<t)``:

- **surprise** ``s_t = −ln p(e_t | e_<t)`` in nats;
- **top-g miss** (DeepLog, Du et al. 2017): ``e_t`` is not among the ``g`` most probable
  candidates, i.e. its *rank* (how many candidates are strictly more probable) is ``≥ g``.

Per session, six scores, each higher = more anomalous:

- ``max``: ``max_t s_t`` (one very unlikely event is enough: the default);
- ``mean``: ``mean_t s_t`` (per-event negative log-likelihood; length-independent);
- ``count``: the number of top-g misses (DeepLog flags a session with ``count ≥ 1``);
- ``end``: the surprise of the session's end ``−ln p(</s> | e_1 … e_n)``: high when the
  session stops where the model expects more events (a run cut short by a crash);
- ``norm``: ``max_t z_t`` with ``z_t = (s_t − μ_k) / max(σ_k, σ_min)`` the surprise of
  event ``k = e_t`` relative to that event's own typical surprise (mean ``μ_k`` and
  standard deviation ``σ_k`` over normal sessions, :class:`KeyStats`): an event that is
  always hard to predict no longer hides one that is always easy;
- ``combined``: ``−ln min_j p_j`` (Tippett's combination) over the tail p-values ``p_j``
  of the five scores above, each against the same scores of normal calibration sessions
  (:func:`log_tail_pvalues`, with an exponential tail past the largest of them): a
  session extreme in *any* way, on a common scale.

A session is anomalous when its score is **strictly above** the threshold. The threshold
for a target false-positive rate ``α`` is picked on normal validation sessions by
:func:`rnnkit.anomaly.thresholds.threshold_at_fpr`: at most ``⌊α·n⌋`` of the ``n``
validation scores lie above it.

>>> import numpy as np
>>> log_probs = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]))
>>> s, rank = surprise_and_rank(log_probs, np.array([0, 1]))
>>> s.round(3).tolist(), rank.tolist()
([0.357, 2.303], [0, 1])
>>> {k: round(v, 3) for k, v in session_scores(s, rank >= 1).items()}
{'max': 2.303, 'mean': 1.33, 'count': 1, 'end': 2.303}
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: The scores that are never negative (surprises, counts, ``−ln`` of a p-value); ``norm``
#: is a z-score and may be. A threshold below 0 for these would flag every session.
NONNEGATIVE_SCORES = ("max", "mean", "count", "end", "combined")

__all__ = [
    "COMBINED_PARTS",
    "RUNNING_SCORES",
    "SCORES",
    "KeyStats",
    "RunningScore",
    "combined_scores",
    "log_tail_pvalues",
    "session_scores",
    "surprise_and_rank",
    "tail_pvalues",
    "top_events",
]

#: The scores a session keeps in O(1) memory as events arrive (:class:`RunningScore`).
RUNNING_SCORES: tuple[str, ...] = ("max", "mean", "count")
#: The scores Tippett's combination is made of.
COMBINED_PARTS: tuple[str, ...] = ("max", "mean", "count", "end", "norm")
#: The session scores, in the order they are reported.
SCORES: tuple[str, ...] = (*COMBINED_PARTS, "combined")
#: Smallest per-event standard deviation of surprise (nats) a ``norm`` score divides by:
#: an event the model always predicts (σ ≈ 0) would otherwise turn a tenth of a nat into
#: a huge z.
MIN_STD = 0.1
#: Relative distance within which a score ties with a calibration score
#: (:func:`log_tail_pvalues`): float rounding, not a difference; the threshold's margin
#: (``rnnkit.anomaly.thresholds.threshold_at_fpr``).
TIE_TOLERANCE = 1e-4


def surprise_and_rank(log_probs: Any, targets: Any) -> tuple[Any, Any]:
    """Surprise ``−ln p(target)`` and rank of each target among all candidates.

    Works on numpy arrays and on torch tensors alike (the result has the input's kind).

    Args:
        log_probs: ``(..., V)`` log-probabilities (natural log) of the next event.
        targets: ``(...)`` integer ids of the events that did happen.

    Returns:
        ``(surprise, rank)``, each ``(...)``: ``rank`` is the number of candidates strictly
        more probable than the target (0 = the model's first choice), so the target is a
        top-g miss exactly when ``rank >= g``. Ties count in the target's favour.

    >>> import torch
    >>> lp = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    >>> s, r = surprise_and_rank(lp, torch.tensor([2]))
    >>> round(float(s[0]), 4), int(r[0])
    (1.3863, 1)
    """
    if isinstance(log_probs, np.ndarray):
        target_lp = np.take_along_axis(log_probs, np.asarray(targets)[..., None], axis=-1)
    else:  # a torch tensor (torch is not imported here: this module stays numpy-only)
        target_lp = log_probs.gather(-1, targets.unsqueeze(-1))
    rank = (log_probs > target_lp).sum(-1)
    return 0.0 - target_lp[..., 0], rank  # not -x: p = 1 gives 0, not -0.0 in the output


def session_scores(surprise: Any, miss: Any, z: Any = None) -> dict[str, float | int]:
    """The session scores from per-event surprises, top-g misses and normalised surprises.

    Args:
        surprise: ``(n,)`` surprises in nats (n ≥ 1), the last one that of the end
            ``</s>`` (the ``end`` score).
        miss: ``(n,)`` bool, the events outside the top-g candidates.
        z: ``(n,)`` normalised surprises (:meth:`KeyStats.normalise`), or None for a
            result without ``norm``.

    Returns:
        ``{"max": float, "mean": float, "count": int, "end": float[, "norm": float]}``
        (``combined`` needs other sessions: :func:`combined_scores`).

    >>> session_scores([1.0, 3.0, 0.5], [False, True, False], z=[0.0, 4.0, 2.0])
    {'max': 3.0, 'mean': 1.5, 'count': 1, 'end': 0.5, 'norm': 4.0}
    """
    s = np.asarray(surprise, dtype=np.float64)
    if s.size == 0:
        raise ValueError("a session score needs at least one event")
    out: dict[str, float | int] = {
        "max": float(s.max()),
        "mean": float(s.mean()),
        "count": int(np.sum(miss)),
        "end": float(s[-1]),
    }
    if z is not None:
        out["norm"] = float(np.max(np.asarray(z, dtype=np.float64)))
    return out


class KeyStats:
    """Per-event mean and standard deviation of surprise over normal sessions, for the
    ``norm`` score ``z_t = (s_t − μ_k) / max(σ_k, σ_min)`` with ``k = e_t``.

    An event id seen fewer than ``min_count`` times (or never: an unknown event) gets the
    mean and standard deviation of all events together.

    Args:
        mean, std: ``(V,)`` per event id.

    >>> stats = KeyStats.fit([(np.array([1.0, 3.0, 0.2]), np.array([4, 4, 2]))], 6, min_count=2)
    >>> stats.mean.round(3).tolist(), stats.std.round(3).tolist()
    ([1.4, 1.4, 1.4, 1.4, 2.0, 1.4], [1.178, 1.178, 1.178, 1.178, 1.0, 1.178])
    >>> stats.normalise(np.array([5.0, 2.578]), np.array([4, 0])).round(3).tolist()
    [3.0, 1.0]
    """

    def __init__(self, mean: np.ndarray, std: np.ndarray, min_std: float = MIN_STD) -> None:
        self.mean = np.asarray(mean, dtype=np.float64)
        self.std = np.asarray(std, dtype=np.float64)
        if self.mean.shape != self.std.shape or self.mean.ndim != 1:
            raise ValueError("mean and std must be (V,) arrays of one shape")
        self.min_std = float(min_std)

    @classmethod
    def fit(
        cls,
        sessions: Sequence[tuple[np.ndarray, np.ndarray]],
        vocab_size: int,
        min_count: int = 5,
        min_std: float = MIN_STD,
    ) -> KeyStats:
        """From ``(surprise (n,), event ids (n,))`` pairs of normal sessions.

        The statistics are population ones (divided by the count): ``μ_k = Σ s / c_k``,
        ``σ_k² = Σ s² / c_k − μ_k²``.
        """
        if not sessions:
            raise ValueError("per-event statistics need at least one session")
        s = np.concatenate([np.asarray(x, dtype=np.float64) for x, _ in sessions])
        k = np.concatenate([np.asarray(ids, dtype=np.int64) for _, ids in sessions])
        count = np.bincount(k, minlength=vocab_size).astype(np.float64)
        total = np.bincount(k, weights=s, minlength=vocab_size)
        squares = np.bincount(k, weights=s * s, minlength=vocab_size)
        seen = count >= max(min_count, 1)
        mean = np.full(vocab_size, s.mean())
        std = np.full(vocab_size, s.std())
        mean[seen] = total[seen] / count[seen]
        std[seen] = np.sqrt(np.maximum(squares[seen] / count[seen] - mean[seen] ** 2, 0.0))
        return cls(mean, std, min_std)

    def normalise(self, surprise: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """``z (n,)`` of surprises ``(n,)`` of the event ids ``(n,)``."""
        ids = np.asarray(ids, dtype=np.int64)
        return (np.asarray(surprise, dtype=np.float64) - self.mean[ids]) / np.maximum(
            self.std[ids], self.min_std
        )


def log_tail_pvalues(calibration: Any, scores: Any) -> np.ndarray:
    """``ln p(x)``, the tail p-value of each score against calibration scores of normal
    sessions (``N`` of them, sorted ``c_(1) ≤ … ≤ c_(N)``).

    Up to the largest calibration score it is the conformal p-value
    ``p(x) = (1 + #{c ≥ x}) / (N + 1)``. Beyond it the count would stop at ``1/(N+1)``
    (every session past the largest would tie, whether a little or far past), so the tail
    is extrapolated as an exponential one (a generalized Pareto tail with ``ξ = 0``):
    ``p(x) = exp(−(x − c_(N)) / β) / (N + 1)``, with ``β`` the mean excess of the top
    ``m = min(max(10, ⌈N/10⌉), N − 1)`` scores over the next one (the exponential's
    maximum-likelihood scale); when they have no spread (none beyond the tie tolerance
    below), ``β`` is the standard deviation of all calibration scores, or 1.

    ``c ≥ x`` is counted with a tolerance, ``c ≥ x − 10⁻⁴ max(1, |x|)``
    (:data:`TIE_TOLERANCE`, the threshold's margin): a copy of a calibration session
    scored again, in another batch or streamed, ties with it whatever the float rounding.

    >>> np.exp(log_tail_pvalues([1.0, 2.0, 2.0, 5.0], [0.5, 2.0, 5.0, 7.0])).round(4).tolist()
    [1.0, 0.8, 0.4, 0.0736]
    """
    cal = np.sort(np.asarray(calibration, dtype=np.float64))
    n = cal.size
    if n == 0:
        raise ValueError("tail p-values need calibration scores")
    x = np.asarray(scores, dtype=np.float64)
    # A score within float rounding of a calibration score ties with it: the same session
    # scored in another batch, or streamed, differs by ~1e-7 relative, and on the step of
    # the count (at the largest: 2/(N+1) against 1/(N+1)) that moved it by ln 2
    tol = TIE_TOLERANCE * np.maximum(1.0, np.abs(x))
    above = n - np.searchsorted(cal, x - tol, side="left")  # #{c >= x}, ties as above
    log_p = np.log((1.0 + above) / (n + 1.0))
    m = min(max(10, math.ceil(n / 10)), n - 1)
    excess = cal[cal > cal[n - 1 - m]] - cal[n - 1 - m] if m > 0 else cal[:0]
    beta = float(excess.mean()) if excess.size else 0.0
    # A spread within float rounding is none: 1600 equal scores have a std of 2e-16, not
    # 0, and a session 1e-3 past them scored 4e12 as a scale.
    least = TIE_TOLERANCE * max(1.0, abs(float(cal[-1])))
    if not beta > least:
        spread = float(cal.std())
        beta = spread if spread > least else 1.0
    beyond = x > cal[-1] + tol
    log_p[beyond] = -math.log(n + 1.0) - (x[beyond] - cal[-1]) / beta
    return log_p


def tail_pvalues(calibration: Any, scores: Any) -> np.ndarray:
    """The tail p-values of :func:`log_tail_pvalues` (which see).

    >>> tail_pvalues([1.0, 2.0, 3.0], [0.5, 2.0, 3.0]).tolist()
    [1.0, 0.75, 0.5]
    """
    return np.exp(log_tail_pvalues(calibration, scores))


def combined_scores(
    calibration: dict[str, Any], scores: dict[str, Any], parts: Sequence[str] = COMBINED_PARTS
) -> np.ndarray:
    """Tippett's combination ``−ln min_j p_j`` of the tail p-values of several scores.

    Args:
        calibration: per score name, the scores of normal calibration sessions.
        scores: per score name, ``(n,)`` scores of the sessions to combine.
        parts: the score names combined.

    Returns:
        ``(n,)`` combined scores, ``≥ 0``; past ``ln(N + 1)`` only for a session beyond
        every calibration session in some score.

    >>> cal = {"a": [1.0, 2.0, 3.0], "b": [10.0, 20.0, 30.0]}
    >>> combined_scores(cal, {"a": [0.0, 3.0], "b": [25.0, 20.0]}, ("a", "b")).round(4).tolist()
    [0.6931, 0.6931]
    """
    log_p = np.stack([log_tail_pvalues(calibration[name], scores[name]) for name in parts])
    return 0.0 - log_p.min(axis=0)  # not -x: p = 1 gives 0, not -0.0 in the output


def top_events(surprise: Any, k: int) -> list[tuple[int, float]]:
    """The ``k`` most surprising positions as ``(position, surprise)``, most surprising
    first; ties go to the earlier position.

    >>> top_events([0.5, 2.0, 0.1, 2.0], 3)
    [(1, 2.0), (3, 2.0), (0, 0.5)]
    """
    s = np.asarray(surprise, dtype=np.float64)
    if k <= 0 or s.size == 0:
        return []
    order = np.lexsort((np.arange(s.size), -s))[:k]  # by -surprise, then position
    return [(int(i), float(s[i])) for i in order]


class RunningScore:
    """The session scores of :func:`session_scores`, kept one event at a time in O(1)
    memory (plus the ``k`` most surprising events): what streaming keeps per session.

    Args:
        top_k: how many of the most surprising events to remember.

    >>> r = RunningScore(top_k=2)
    >>> for position, (s, miss) in enumerate([(1.0, False), (3.0, True), (2.0, False)]):
    ...     r.add(s, miss, position, f"e{position}")
    >>> r.scores(), r.top()
    ({'max': 3.0, 'mean': 2.0, 'count': 1}, [(1, 3.0, 'e1'), (2, 2.0, 'e2')])
    """

    __slots__ = ("_heap", "count", "max", "n", "top_k", "total")

    def __init__(self, top_k: int = 5) -> None:
        self.top_k = top_k
        self.n = 0
        self.max = -math.inf
        self.total = 0.0
        self.count = 0
        # Min-heap of (surprise, -position, event): the root is the least surprising of
        # the kept ones (the latest of equals), the first to go.
        self._heap: list[tuple[float, int, str]] = []

    def add(self, surprise: float, miss: bool, position: int, event: str) -> None:
        """Account for one event."""
        self.n += 1
        self.max = max(self.max, surprise)
        self.total += surprise
        self.count += bool(miss)
        if self.top_k <= 0:
            return
        item = (surprise, -position, event)
        if len(self._heap) < self.top_k:
            heapq.heappush(self._heap, item)
        elif item > self._heap[0]:
            heapq.heapreplace(self._heap, item)

    def scores(self) -> dict[str, float | int]:
        """``{"max", "mean", "count"}`` so far (the :data:`RUNNING_SCORES`)."""
        if self.n == 0:
            raise ValueError("a session score needs at least one event")
        return {"max": self.max, "mean": self.total / self.n, "count": self.count}

    def score(self, name: str) -> float:
        """One of the scores by name (``"max"``, ``"mean"`` or ``"count"``)."""
        return float(self.scores()[name])

    def top(self) -> list[tuple[int, float, str]]:
        """The kept events as ``(position, surprise, event)``, most surprising first."""
        return [(-p, s, e) for s, p, e in sorted(self._heap, key=lambda x: (-x[0], -x[1]))]
