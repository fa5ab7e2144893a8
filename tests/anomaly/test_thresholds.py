"""Thresholds that say how far they can be trusted: the generalized Pareto tail fit and
the Clopper–Pearson interval, against hand-computed values and known distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.anomaly.thresholds import (
    GPDFit,
    clopper_pearson,
    fit_gpd_pwm,
    gpd_threshold,
    pick_threshold,
    pick_thresholds,
    resolvable_fpr,
    sessions_to_resolve,
    threshold_at_fpr,
    validation_fpr,
)


def test_pwm_fit_by_hand() -> None:
    # y = 1, 2, 3: p_j = (j − 0.35)/3, a0 = 2, a1 = Σ (1 − p_j) y_j / 3.
    a0 = 2.0
    a1 = ((1 - 0.65 / 3) * 1 + (1 - 1.65 / 3) * 2 + (1 - 2.65 / 3) * 3) / 3
    xi, sigma = fit_gpd_pwm([3.0, 1.0, 2.0])
    assert xi == pytest.approx(2 - a0 / (a0 - 2 * a1))
    assert sigma == pytest.approx(2 * a0 * a1 / (a0 - 2 * a1))
    for bad in ([1.0], [-1.0, 2.0], [0.0, 0.0, 0.0]):
        with pytest.raises(ValueError):
            fit_gpd_pwm(bad)


@pytest.mark.parametrize("xi", [-0.2, 0.0, 0.3])
def test_pwm_fit_recovers_a_known_tail(xi: float) -> None:
    # Inverse-CDF samples of GPD(ξ, σ = 2): y = σ/ξ ((1 − U)^(−ξ) − 1), or −σ ln(1 − U).
    u = np.random.default_rng(0).random(50_000)
    y = -2.0 * np.log1p(-u) if xi == 0 else 2.0 / xi * ((1 - u) ** (-xi) - 1)
    got_xi, got_sigma = fit_gpd_pwm(y)
    assert got_xi == pytest.approx(xi, abs=0.03)
    assert got_sigma == pytest.approx(2.0, rel=0.03)


def test_gpd_quantile_by_hand() -> None:
    # rate 0.01 of n = 100 with m = 10 exceedances: r = 0.1.
    assert GPDFit(u=1.0, xi=0.5, sigma=2.0, m=10, n=100).quantile(0.01) == pytest.approx(
        1 + 2 / 0.5 * (0.1**-0.5 - 1)
    )
    assert GPDFit(u=1.0, xi=0.0, sigma=2.0, m=10, n=100).quantile(0.01) == pytest.approx(
        1 - 2 * math.log(0.1)
    )


def test_tail_threshold_extrapolates_past_the_largest_score() -> None:
    # 300 exponential scores: the true score exceeded 0.1 % of the time is ln 1000 = 6.91.
    # The empirical quantile cannot go past the largest of 300 (n·α < 1); the tail fit
    # can, and over many draws it lands on the true quantile (one draw of 30 exceedances
    # varies a lot: the median of 60 is compared).
    fitted, largest = [], []
    for seed in range(60):
        scores = np.random.default_rng(seed).exponential(size=300)
        threshold, how = pick_threshold(scores, 0.001, "gpd")
        assert how.startswith("generalized Pareto")
        fit = gpd_threshold(scores, 0.001)
        assert fit.m == 30 and fit.n == 300 and threshold == fit.quantile(0.001)
        fitted.append(threshold)
        largest.append(scores.max())
    assert np.median(fitted) == pytest.approx(math.log(1000), rel=0.08)
    assert np.median(largest) < 0.9 * math.log(1000)  # where the empirical one would sit


def test_tail_threshold_falls_back_to_the_empirical_quantile() -> None:
    scores = np.arange(100, dtype=float)
    empirical = threshold_at_fpr(scores, 0.2)
    # The target is within the scores' reach: 0.2 · 100 = 20 ≥ 10 exceedances.
    assert pick_threshold(scores, 0.2, "gpd") == (
        empirical,
        "empirical quantile (the target is within the validation scores)",
    )
    # Ties: 95 equal scores and 5 larger leave too few exceedances to fit.
    tied = np.r_[np.zeros(95), np.arange(1, 6)]
    value, how = pick_threshold(tied, 0.001, "gpd")
    assert value == threshold_at_fpr(tied, 0.001) and "tail fit impossible" in how
    with pytest.raises(ValueError, match="threshold method"):
        pick_threshold(scores, 0.1, "median")


def test_a_tail_that_ends_below_the_scores_it_was_fitted_on_is_not_used() -> None:
    """Blocks of tied sessions fit a steep tail (ξ ≈ −3) whose end, 0.56, lies below the
    7 largest scores: its threshold would pass 3.5 % of the validation sessions against a
    0.2 % target. The empirical quantile (above the largest score) is used, and said.
    (A fit that passes the largest score alone is kept: a rare quantile is exceeded by
    chance, as in the exponential draws above.)"""
    scores = np.r_[np.linspace(0.0, 0.47, 170), np.full(23, 0.52), np.full(7, 0.59)]
    fit = gpd_threshold(scores, 0.002)
    assert fit.xi < -2 and fit.quantile(0.002) < 0.59
    for target in (0.002, 0.0001):
        value, how = pick_threshold(scores, target, "gpd")
        assert value == threshold_at_fpr(scores, target) > scores.max()
        assert how == (
            "empirical quantile (the fitted tail, ξ=-3.03, σ=0.267, top 30 of 200, passes 7 "
            f"of the 200 validation scores: more than a rate of {target:g} allows)"
        )


def test_clopper_pearson_closed_forms() -> None:
    for n in (1, 7, 48, 1000):
        lo, hi = clopper_pearson(0, n)
        assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
        lo, hi = clopper_pearson(n, n)
        assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / n), rel=1e-9)
    lo, hi = clopper_pearson(1, 2)
    assert lo == pytest.approx(1 - math.sqrt(0.975)) and hi == pytest.approx(math.sqrt(0.975))
    # A tabulated value: 5 of 20, 95 %: [0.0866, 0.4910].
    lo, hi = clopper_pearson(5, 20)
    assert lo == pytest.approx(0.0866, abs=1e-4) and hi == pytest.approx(0.4910, abs=1e-4)
    # Symmetry: k of n and n − k of n mirror each other.
    lo, hi = clopper_pearson(3, 11, confidence=0.9)
    lo2, hi2 = clopper_pearson(8, 11, confidence=0.9)
    assert lo == pytest.approx(1 - hi2) and hi == pytest.approx(1 - lo2)
    for k, n in ((-1, 3), (4, 3), (0, 0)):
        with pytest.raises(ValueError):
            clopper_pearson(k, n)


def test_resolvable_fpr() -> None:
    # 48 clean sessions vouch for no rate under 7.4 %; 368 are the fewest for 1 %.
    assert resolvable_fpr(48) == pytest.approx(0.0740, abs=1e-4)
    assert resolvable_fpr(367) > 0.01 >= resolvable_fpr(368)


def test_tail_level_steps_down_past_tied_scores() -> None:
    # 80 distinct scores, then 15 sessions tied at 90 and 5 at 100 (runs that repeat
    # exactly): 10 exceedances would cut the tied block, so the level steps down to 79
    # and all 20 above it are fitted.
    scores = np.r_[np.arange(80.0), np.full(15, 90.0), np.full(5, 100.0)]
    fit = gpd_threshold(scores, 0.001)
    assert (fit.u, fit.m, fit.n) == (79.0, 20, 100)
    xi, sigma = fit_gpd_pwm(np.r_[np.full(15, 11.0), np.full(5, 21.0)])
    assert (fit.xi, fit.sigma) == pytest.approx((xi, sigma))
    # All but a few tied: no level in the upper half has 10 above it.
    with pytest.raises(ValueError, match="no tail to fit"):
        gpd_threshold(np.r_[np.zeros(95), np.arange(1.0, 6.0)], 0.001)


def test_normal_quantile_matches_the_tables() -> None:
    from rnnkit.anomaly.thresholds import normal_quantile

    # Φ⁻¹ from the standard tables: 1.959964 (97.5 %), 2.575829 (99.5 %), 3.290527 (99.95 %)
    for p, z in ((0.975, 1.959964), (0.995, 2.575829), (0.9995, 3.290527), (0.5, 0.0)):
        assert normal_quantile(p) == pytest.approx(z, abs=1e-6)
        assert normal_quantile(1 - p) == pytest.approx(-z, abs=1e-6)
    with pytest.raises(ValueError, match="p in"):
        normal_quantile(1.0)


def test_gaussian_interval_by_hand() -> None:
    from rnnkit.anomaly.thresholds import fit_gaussian

    # Errors 1, 2, 3, 4: mean 2.5, sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3,
    # σ = 1.290994; at 99 %, z = 2.575829: 2.5 ± 2.575829 · 1.290994 = 2.5 ± 3.325380.
    fit = fit_gaussian([1.0, 2.0, 3.0, 4.0])
    lo, hi = fit.interval(0.99)
    assert (fit.mean, fit.n) == (2.5, 4)
    assert fit.std == pytest.approx(1.290994, abs=1e-6)
    assert lo == pytest.approx(2.5 - 3.325380, abs=1e-5)
    assert hi == pytest.approx(2.5 + 3.325380, abs=1e-5)
    # 95 %: z = 1.959964 → upper end 2.5 + 2.530302 = 5.030302
    assert fit.interval(0.95)[1] == pytest.approx(5.030302, abs=1e-5)
    # Identical errors: the floor keeps the interval open.
    assert fit_gaussian([0.2, 0.2, 0.2], min_std=0.01).interval(0.99)[1] == pytest.approx(
        0.2 + 0.02575829, abs=1e-7
    )
    with pytest.raises(ValueError, match="at least two"):
        fit_gaussian([1.0])
    with pytest.raises(ValueError, match="finite"):
        fit_gaussian([1.0, float("nan")])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=60),
    st.floats(0.001, 0.999),
)
def test_threshold_flags_at_most_the_allowed_share(scores: list[float], fpr: float) -> None:
    threshold = threshold_at_fpr(scores, fpr)
    above = sum(s > threshold for s in scores)
    allowed = math.floor(fpr * len(scores) + 1e-9)
    assert above <= allowed
    # ...and it is (just above) the smallest such threshold among the scores: the largest
    # score at or below it would flag more if the threshold moved under it.
    chosen = max(s for s in scores if s <= threshold)
    assert sum(s >= chosen for s in scores) > allowed
    assert threshold - chosen <= 1e-4 * max(1.0, abs(chosen)) + 1e-12


def test_threshold_examples_and_errors() -> None:
    normal = np.arange(100, dtype=float)  # 0..99
    assert threshold_at_fpr(normal, 0.05, margin=0) == 94.0  # 95..99 above: five of 100
    assert threshold_at_fpr(normal, 0.001, margin=0) == 99.0  # no false positive allowed
    assert threshold_at_fpr([3.0], 0.5) == pytest.approx(3.0003)
    # The margin never reaches past the midpoint to the next score.
    assert threshold_at_fpr([1.0, 1.00001], 0.5) == pytest.approx(1.000005)
    # ... nor reaches the next score where no float lies between the two (the midpoint
    # of -5e-324 and 0 rounds to 0, which was then not flagged: hypothesis found it)
    assert threshold_at_fpr([0.0, -5e-324], 0.5) == -5e-324
    # Copies of the chosen score stay below the line, even off by float32 rounding.
    copies = np.full(10, 7.25)
    limit = threshold_at_fpr(copies, 0.01)
    assert not (np.float32(7.25) * (1 + 1e-6) > limit)
    with pytest.raises(ValueError, match="target_fpr"):
        threshold_at_fpr(normal, 0.0)
    with pytest.raises(ValueError, match="no normal scores"):
        threshold_at_fpr([], 0.1)


@pytest.mark.parametrize("target", [0.01, 0.05, 0.2])
def test_sessions_to_resolve_is_the_first_count_that_resolves(target: float) -> None:
    n = sessions_to_resolve(target)
    assert resolvable_fpr(n) <= target < resolvable_fpr(n - 1)


def test_validation_fpr_counts_and_bounds_the_false_positives() -> None:
    scores = np.array([0.1, 0.4, 0.2, 0.9, 0.4, 0.3])
    v = validation_fpr(scores, 0.35, 0.05)
    assert (v["false_positives"], v["sessions"], v["rate"]) == (3, 6, 0.5)  # above, not at
    assert v["interval95"] == list(clopper_pearson(3, 6))
    assert v["resolvable"] == resolvable_fpr(6) and v["resolved"] is False
    many = validation_fpr(np.zeros(1000), 0.5, 0.01)
    assert many["false_positives"] == 0 and many["resolved"] is True


def test_pick_thresholds_picks_each_score_alone() -> None:
    scores = {"max": np.array([0.1, 0.5, 0.2, 0.9, 0.3]), "count": np.array([0.0, 1, 0, 2, 0])}
    values, how = pick_thresholds(scores, 0.2)
    assert values == {name: pick_threshold(s, 0.2)[0] for name, s in scores.items()}
    assert how == {"max": "empirical quantile", "count": "empirical quantile"}
