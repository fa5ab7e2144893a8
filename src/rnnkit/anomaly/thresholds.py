"""Thresholds of anomaly scores that say how far they can be trusted.

A threshold for a target false-positive rate ``α`` is picked on ``n`` normal validation
sessions. The empirical one (:func:`threshold_at_fpr`) cannot resolve
``α < 1/n``: with 48 sessions it sits just above the largest score, and new normal
sessions then exceed it about ``1/(n+1)`` of the time, whatever ``α`` was asked for.
This module adds:

- :func:`gpd_threshold`: a peaks-over-threshold fit (Pickands 1975; the SPOT method of
  Siffer et al., KDD 2017). The ``m`` largest scores exceed ``u`` (the next one) by
  ``y_i``; a generalized Pareto distribution ``P(Y > y) = (1 + ξ y / σ)^(−1/ξ)`` is
  fitted to them by probability-weighted moments (Hosking & Wallis 1987) and the
  threshold is its quantile ``z = u + σ/ξ · ((α n / m)^(−ξ) − 1)`` (``u − σ ln(α n / m)``
  when ``ξ = 0``): the tail extrapolated past the largest score, to the asked rate.
- :func:`clopper_pearson`: the exact binomial confidence interval of a rate from
  ``k`` of ``n``: what a validation false-positive count actually shows.
- :func:`resolvable_fpr`: the smallest false-positive rate ``n`` sessions can show;
  :func:`validation_fpr`: what a validation set shows at a threshold;
  :func:`sessions_to_resolve`: how many sessions a target rate needs.
- :func:`fit_gaussian` and :meth:`GaussianFit.interval`: DeepLog's rule for parameter
  values (Du et al., CCS 2017): the prediction errors of normal validation data are
  modelled as a Gaussian ``N(μ, σ²)`` and an error above the upper end of its confidence
  interval, ``μ + z σ`` with ``z = Φ⁻¹((1 + c) / 2)``, is anomalous.

Closed forms and a bisection in numpy (no scipy): the estimators are a few lines each,
and the binomial tail needs only ``lgamma``.

>>> round(clopper_pearson(0, 48)[1], 4)   # 0 false positives in 48: up to 7.4 %
0.074
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "THRESHOLD_METHODS",
    "GPDFit",
    "GaussianFit",
    "clopper_pearson",
    "fit_gaussian",
    "fit_gpd_pwm",
    "gpd_threshold",
    "normal_quantile",
    "pick_threshold",
    "pick_thresholds",
    "resolvable_fpr",
    "sessions_to_resolve",
    "threshold_at_fpr",
    "validation_fpr",
]

#: ``quantile``: the empirical one; ``gpd``: the generalized Pareto tail fit.
THRESHOLD_METHODS: tuple[str, ...] = ("quantile", "gpd")
#: Fewest exceedances a tail fit is made from, and fewest validation sessions.
MIN_EXCEEDANCES = 10


@dataclass(frozen=True)
class GPDFit:
    """A generalized Pareto fit of the exceedances over ``u``.

    Attributes:
        u: the level the exceedances are measured from.
        xi: shape ``ξ`` (``> 0`` heavy tail, ``0`` exponential, ``< 0`` bounded).
        sigma: scale ``σ > 0``.
        m: number of exceedances; ``n`` the number of scores in all.
    """

    u: float
    xi: float
    sigma: float
    m: int
    n: int

    def quantile(self, rate: float) -> float:
        """The score exceeded with probability ``rate`` (``rate < m / n``)."""
        r = rate * self.n / self.m
        if abs(self.xi) < 1e-9:
            return self.u - self.sigma * math.log(r)
        return self.u + self.sigma / self.xi * (r ** (-self.xi) - 1.0)


def fit_gpd_pwm(exceedances: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """``(ξ, σ)`` of a generalized Pareto distribution by probability-weighted moments.

    With the exceedances sorted ascending ``y_(1) ≤ … ≤ y_(m)``, ``a_0 = mean(y)`` and
    ``a_1 = (1/m) Σ_j (1 − p_j) y_(j)``, ``p_j = (j − 0.35) / m``::

        ξ = 2 − a_0 / (a_0 − 2 a_1),    σ = 2 a_0 a_1 / (a_0 − 2 a_1)

    (Hosking & Wallis 1987, with ``ξ = −k``). Defined for ``ξ < 1``.

    Raises:
        ValueError: fewer than two exceedances, a negative one, or no spread
            (``a_0 ≤ 2 a_1``: the fit does not exist).

    >>> xi, sigma = fit_gpd_pwm([1.0, 2.0, 3.0])
    >>> round(xi, 4), round(sigma, 4)
    (-1.1034, 4.2069)
    """
    y = np.sort(np.asarray(exceedances, dtype=np.float64))
    m = y.size
    if m < 2:
        raise ValueError("a tail fit needs at least two exceedances")
    if y[0] < 0:
        raise ValueError("exceedances must be ≥ 0")
    p = (np.arange(1, m + 1) - 0.35) / m
    a0 = float(y.mean())
    a1 = float(np.mean((1.0 - p) * y))
    spread = a0 - 2.0 * a1
    if not spread > 1e-12 * max(a0, 1e-300) or not a0 > 0:
        raise ValueError("the exceedances have no spread to fit a tail to")
    return 2.0 - a0 / spread, 2.0 * a0 * a1 / spread


def gpd_threshold(
    normal_scores: Sequence[float] | np.ndarray, target_fpr: float, m: int | None = None
) -> GPDFit:
    """Fit the tail of normal scores (see the module's text); ``fit.quantile(target_fpr)``
    is the threshold.

    Args:
        normal_scores: scores of normal validation sessions.
        target_fpr: in ``(0, 1)``.
        m: exceedances to fit (default ``max(10, ⌈n/10⌉)``, at most ``n − 1``): the level
            ``u`` is the largest score with at least ``m`` scores above it (more when the
            scores tie).

    Raises:
        ValueError: fewer than :data:`MIN_EXCEEDANCES` + 1 scores, no level in the upper
            half of the scores with ``m`` above it (ties), a shape ``ξ ≥ 1``, or the fit
            does not exist (see :func:`fit_gpd_pwm`).
    """
    if not 0.0 < target_fpr < 1.0:
        raise ValueError(f"target_fpr must be in (0, 1), got {target_fpr}")
    s = np.sort(np.asarray(normal_scores, dtype=np.float64))
    n = s.size
    if n <= MIN_EXCEEDANCES:
        raise ValueError(f"a tail fit needs more than {MIN_EXCEEDANCES} scores, got {n}")
    if m is None:
        m = max(MIN_EXCEEDANCES, math.ceil(n / 10))
    m = min(m, n - 1)
    # The level: the largest score with at least m scores above it. Sessions that repeat
    # exactly tie; the level then steps down past the tied block rather than cutting it.
    above = n - np.searchsorted(s, s, side="right")  # #{scores > s_i}, non-increasing
    fits = np.flatnonzero(above >= m)
    if not fits.size or above[fits[-1]] > n // 2:
        raise ValueError(
            f"fewer than {m} scores lie above a level in the upper half (ties): no tail to fit"
        )
    u = float(s[fits[-1]])
    y = s[s > u] - u
    xi, sigma = fit_gpd_pwm(y)
    if xi >= 1.0:
        raise ValueError(f"the fitted tail has no mean (shape {xi:.2f} ≥ 1)")
    return GPDFit(u=u, xi=xi, sigma=sigma, m=int(y.size), n=n)


def pick_threshold(
    normal_scores: Sequence[float] | np.ndarray, target_fpr: float, method: str = "quantile"
) -> tuple[float, str]:
    """The threshold by ``method`` and how it was found (a line for the summary).

    ``gpd`` uses the tail fit only where it is needed and possible: when the target is
    within the empirical scores' reach (``α n ≥ m``, the fitted tail is not needed), the
    fit is impossible (too few sessions, ties), or the validation scores reject the
    fitted threshold (the 95 % Clopper–Pearson interval of the share of them above it
    lies wholly above the target: a tail that ends below scores it was fitted on), it
    falls back to the empirical quantile and says why.

    >>> pick_threshold([0.1, 0.5, 0.2, 0.9, 0.3], 0.2)
    (0.5001, 'empirical quantile')
    >>> pick_threshold([0.1, 0.5, 0.2, 0.9, 0.3], 0.01, "gpd")[1]
    'empirical quantile (tail fit impossible: a tail fit needs more than 10 scores, got 5)'
    """
    if method not in THRESHOLD_METHODS:
        raise ValueError(f"threshold method must be one of {', '.join(THRESHOLD_METHODS)}")
    empirical = threshold_at_fpr(normal_scores, target_fpr)
    if method == "quantile":
        return empirical, "empirical quantile"
    try:
        fit = gpd_threshold(normal_scores, target_fpr)
    except ValueError as exc:
        return empirical, f"empirical quantile (tail fit impossible: {exc})"
    if target_fpr * fit.n >= fit.m:
        return empirical, "empirical quantile (the target is within the validation scores)"
    shape = f"ξ={fit.xi:.3g}, σ={fit.sigma:.3g}, top {fit.m} of {fit.n}"
    fitted = fit.quantile(target_fpr)
    # The fit may land below the largest validation scores (they exceed a rare quantile
    # by chance), but not so far that the validation sessions themselves reject it: a
    # steep tail (ξ ≪ 0, blocks of tied sessions) can end below scores it was fitted on.
    above = int(np.count_nonzero(np.asarray(normal_scores, dtype=np.float64) > fitted))
    if not clopper_pearson(above, fit.n)[0] <= target_fpr:
        return empirical, (
            f"empirical quantile (the fitted tail, {shape}, passes {above} of the "
            f"{fit.n} validation scores: more than a rate of {target_fpr:g} allows)"
        )
    return fitted, f"generalized Pareto tail ({shape})"


def pick_thresholds(
    scores: dict[str, np.ndarray], target_fpr: float, method: str = "quantile"
) -> tuple[dict[str, float], dict[str, str]]:
    """:func:`pick_threshold` for each named score: the thresholds, and how each was found.

    >>> pick_thresholds({"max": np.array([0.1, 0.5, 0.2, 0.9, 0.3])}, 0.2)
    ({'max': 0.5001}, {'max': 'empirical quantile'})
    """
    picked = {name: pick_threshold(values, target_fpr, method) for name, values in scores.items()}
    return {k: v[0] for k, v in picked.items()}, {k: v[1] for k, v in picked.items()}


def _log_comb(n: int) -> np.ndarray:
    """``ln C(n, j)``, ``j = 0 … n`` (log-factorials as cumulative sums of logs)."""
    log_fact = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])
    return log_fact[n] - log_fact - log_fact[::-1]


def _tail_at_least(k: int, n: int, p: float, log_comb: np.ndarray) -> float:
    """``P(X ≥ k)`` for ``X ~ Binomial(n, p)``."""
    if k <= 0 or p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    j = np.arange(k, n + 1, dtype=np.float64)
    lp = log_comb[k:] + j * math.log(p) + (n - j) * math.log1p(-p)
    top = float(lp.max())
    return float(min(1.0, math.exp(top) * np.exp(lp - top).sum()))


def _bisect(f: Callable[[float], float], target: float) -> float:
    """The ``p`` in [0, 1] where the increasing ``f`` crosses ``target``."""
    lo, hi = 0.0, 1.0
    for _ in range(100):  # 2^-100: far below float resolution
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) confidence interval of a rate seen ``k`` times in ``n``.

    The lower end ``p_lo`` solves ``P(X ≥ k | p_lo) = (1−c)/2`` (0 when ``k = 0``), the
    upper ``p_hi`` solves ``P(X ≤ k | p_hi) = (1−c)/2`` (1 when ``k = n``), ``X`` binomial.
    With ``k = 0`` the upper end is ``1 − ((1−c)/2)^(1/n)``, about ``3.7/n`` at 95 %.

    >>> lo, hi = clopper_pearson(1, 2)   # 1 − sqrt(0.975) and sqrt(0.975)
    >>> round(lo, 5), round(hi, 5)
    (0.01258, 0.98742)
    """
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 ≤ k ≤ n and n ≥ 1, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    half = (1.0 - confidence) / 2.0
    lc = _log_comb(n)
    lo = 0.0 if k == 0 else _bisect(lambda p: _tail_at_least(k, n, p, lc), half)
    # P(X ≤ k | p) = 1 − P(X ≥ k + 1 | p) falls as p grows: it is `half` where
    # P(X ≥ k + 1 | p) = 1 − half.
    hi = 1.0 if k == n else _bisect(lambda p: _tail_at_least(k + 1, n, p, lc), 1.0 - half)
    return lo, hi


def resolvable_fpr(n: int, confidence: float = 0.95) -> float:
    """The smallest false-positive rate ``n`` clean validation sessions can vouch for:
    the upper end of :func:`clopper_pearson` ``(0, n)``. A target below it cannot be
    shown with these sessions, whatever threshold is picked.

    >>> round(resolvable_fpr(48), 4), round(resolvable_fpr(1000), 5)
    (0.074, 0.00368)
    """
    return clopper_pearson(0, n, confidence)[1]


def validation_fpr(
    normal_scores: np.ndarray, threshold: float, target_fpr: float
) -> dict[str, Any]:
    """What the validation sessions show about the false-positive rate at a threshold:
    the count above it, its 95 % Clopper–Pearson interval, and the smallest rate these
    sessions could show (:func:`resolvable_fpr`).

    >>> v = validation_fpr(np.array([0.1, 0.2, 0.3]), 0.25, 0.01)
    >>> v["false_positives"], v["sessions"], v["resolved"]
    (1, 3, False)
    """
    n = len(normal_scores)
    k = int(np.sum(np.asarray(normal_scores) > threshold))
    lo, hi = clopper_pearson(k, n)
    smallest = resolvable_fpr(n)
    return {
        "false_positives": k,
        "sessions": n,
        "rate": k / n,
        "interval95": [lo, hi],
        "resolvable": smallest,
        "resolved": bool(smallest <= target_fpr),
    }


def sessions_to_resolve(target_fpr: float, confidence: float = 0.95) -> int:
    """Fewest clean sessions whose Clopper–Pearson upper end reaches ``target_fpr``:
    ``⌈ln((1−c)/2) / ln(1−α)⌉``.

    >>> sessions_to_resolve(0.01)
    368
    """
    return math.ceil(math.log((1 - confidence) / 2) / math.log1p(-target_fpr))


def normal_quantile(p: float) -> float:
    """``Φ⁻¹(p)``, the standard normal quantile, by bisection on ``Φ(x) = ½ erfc(−x/√2)``.

    >>> round(normal_quantile(0.975), 6), round(normal_quantile(0.995), 6)
    (1.959964, 2.575829)
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs p in (0, 1), got {p}")
    lo, hi = -40.0, 40.0
    for _ in range(200):  # the interval halves each time: far below float resolution
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2.0)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class GaussianFit:
    """A Gaussian ``N(mean, std²)`` fitted to ``n`` values (prediction errors)."""

    mean: float
    std: float
    n: int

    def interval(self, confidence: float) -> tuple[float, float]:
        """The central ``confidence`` interval ``μ ∓ z σ``, ``z = Φ⁻¹((1 + c) / 2)``.

        >>> [round(x, 6) for x in GaussianFit(mean=1.0, std=2.0, n=10).interval(0.95)]
        [-2.919928, 4.919928]
        """
        if not 0.0 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {confidence}")
        z = normal_quantile((1.0 + confidence) / 2.0)
        return self.mean - z * self.std, self.mean + z * self.std


def fit_gaussian(values: Sequence[float] | np.ndarray, min_std: float = 0.0) -> GaussianFit:
    """Mean and sample standard deviation (``n − 1`` in the denominator) of ``values``,
    the deviation at least ``min_std`` (a set of identical errors would otherwise flag
    the smallest change).

    Raises:
        ValueError: fewer than two values, or a value that is not finite.

    >>> fit_gaussian([1.0, 2.0, 3.0, 4.0])
    GaussianFit(mean=2.5, std=1.2909944487358056, n=4)
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size < 2:
        raise ValueError(f"a Gaussian fit needs at least two values, got {x.size}")
    if not np.isfinite(x).all():
        raise ValueError("a Gaussian fit needs finite values")
    return GaussianFit(float(x.mean()), max(float(x.std(ddof=1)), min_std), int(x.size))


def threshold_at_fpr(
    normal_scores: Sequence[float] | np.ndarray, target_fpr: float, margin: float = 1e-4
) -> float:
    """A threshold that flags at most ``⌊target_fpr · n⌋`` of ``n`` normal scores (a
    session is anomalous when its score is strictly above the threshold).

    With ``k = ⌊target_fpr · n⌋`` allowed, the threshold sits just above the ``(k+1)``-th
    largest score ``s``: at ``s + margin·max(1, |s|)``, but never past the midpoint to the
    next larger score. The margin keeps verdicts stable where sessions repeat exactly (two
    runs of a deterministic program score the same): float rounding — a session scored in
    another batch, or streamed — can then not push a copy of ``s`` over the line.

    With ``n < 1 / target_fpr`` no false positive is allowed and the threshold is just
    above the largest normal score; on new normal sessions the false-positive rate is then
    about ``1 / (n + 1)``, so the validation set should hold well over ``1 / target_fpr``
    sessions for the target to be met rather than undershot.

    Args:
        normal_scores: scores of normal (validation) sessions, at least one.
        target_fpr: in ``(0, 1)``.
        margin: relative tolerance above the chosen score (``≥ 0``).

    >>> threshold_at_fpr([0.1, 0.5, 0.2, 0.9, 0.3], 0.2)  # one of five may be above
    0.5001
    >>> threshold_at_fpr([0.1, 0.5, 0.2, 0.9, 0.3], 0.01, margin=0.0)
    0.9
    """
    if not 0.0 < target_fpr < 1.0:
        raise ValueError(f"target_fpr must be in (0, 1), got {target_fpr}")
    if not margin >= 0.0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    s = np.sort(np.asarray(normal_scores, dtype=np.float64))
    if s.size == 0:
        raise ValueError("no normal scores to choose a threshold from")
    allowed = math.floor(target_fpr * s.size + 1e-9)  # 1e-9: 0.01 * 300 is 3, not 2.999…
    chosen = float(s[s.size - 1 - allowed])
    threshold = chosen + margin * max(1.0, abs(chosen))
    larger = s[s > chosen]
    if larger.size:
        mid = (chosen + float(larger[0])) / 2
        # two neighbouring floats (-5e-324 and 0) have no float between them: the midpoint
        # rounds to the larger, which the threshold would then no longer flag
        threshold = min(threshold, mid if mid < float(larger[0]) else chosen)
    return threshold
