"""Anomaly scores: surprise and rank, session scores, per-event statistics, tail p-values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rnnkit.anomaly.scores import (
    MIN_STD,
    KeyStats,
    RunningScore,
    combined_scores,
    log_tail_pvalues,
    session_scores,
    surprise_and_rank,
    tail_pvalues,
    top_events,
)


def test_surprise_and_rank_agree_between_numpy_and_torch() -> None:
    gen = torch.Generator().manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(3, 5, 7, generator=gen), dim=-1)
    targets = torch.randint(0, 7, (3, 5), generator=gen)
    s_t, r_t = surprise_and_rank(log_probs, targets)
    s_n, r_n = surprise_and_rank(log_probs.numpy(), targets.numpy())
    np.testing.assert_allclose(s_t.numpy(), s_n, rtol=1e-6)
    np.testing.assert_array_equal(r_t.numpy(), r_n)
    # The rank is the number of strictly more probable candidates: the argmax has rank 0.
    best = log_probs.argmax(-1)
    assert (surprise_and_rank(log_probs, best)[1] == 0).all()
    expected = (log_probs > log_probs.gather(-1, targets[..., None])).sum(-1)
    assert torch.equal(r_t, expected)


def test_rank_ties_count_for_the_target() -> None:
    lp = np.log(np.array([[0.4, 0.4, 0.2]]))
    assert surprise_and_rank(lp, np.array([1]))[1].tolist() == [0]
    assert surprise_and_rank(lp, np.array([2]))[1].tolist() == [2]


def test_session_scores_of_the_worked_example() -> None:
    # the worked example of docs/math.md, "Losses": −ln 0.7 three times and −ln 0.1.
    surprise = -np.log([0.7, 0.7, 0.7, 0.1])
    scores = session_scores(surprise, [False, False, False, True])
    assert scores["max"] == pytest.approx(2.303, abs=1e-3)
    assert scores["mean"] * 4 == pytest.approx(3.37, abs=1e-2)
    assert scores["count"] == 1
    with pytest.raises(ValueError, match="at least one event"):
        session_scores([], [])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 20, allow_nan=False), st.booleans()), min_size=1, max_size=40),
    st.integers(0, 6),
)
def test_running_score_equals_batch_scores(events: list[tuple[float, bool]], k: int) -> None:
    running = RunningScore(top_k=k)
    for position, (s, miss) in enumerate(events):
        running.add(s, miss, position, f"e{position}")
    surprise = [s for s, _ in events]
    batch = session_scores(surprise, [m for _, m in events])
    assert running.scores()["max"] == batch["max"]
    assert running.scores()["count"] == batch["count"]
    assert running.scores()["mean"] == pytest.approx(batch["mean"], rel=1e-12, abs=1e-12)
    assert [(p, s) for p, s, _ in running.top()] == top_events(surprise, k)


# ---- end, norm and combined scores -----------------------------------------------------


def test_session_scores_end_and_norm_by_hand() -> None:
    # Surprises of three events and the end: the end is the last one.
    scores = session_scores([0.2, 4.0, 0.1, 1.5], [False, True, False, False], z=[1, -2, 7, 3])
    assert scores == {"max": 4.0, "mean": 1.45, "count": 1, "end": 1.5, "norm": 7.0}
    assert "norm" not in session_scores([0.2], [False])


def test_key_stats_by_hand() -> None:
    # Event 4: surprises 1 and 3 (mean 2, population std 1); event 5: 0.5 five times
    # (std 0, floored to MIN_STD); event 6 once (under min_count): the global figures.
    surprise = np.array([1.0, 3.0, 0.5, 0.5, 0.5, 0.5, 0.5, 9.0])
    ids = np.array([4, 4, 5, 5, 5, 5, 5, 6])
    stats = KeyStats.fit([(surprise[:3], ids[:3]), (surprise[3:], ids[3:])], 7, min_count=2)
    g_mean = 15.5 / 8
    g_std = math.sqrt((1 + 9 + 5 * 0.25 + 81) / 8 - g_mean**2)
    assert stats.mean[4] == 2.0 and stats.std[4] == 1.0
    assert stats.mean[5] == 0.5 and stats.std[5] == 0.0
    assert stats.mean[6] == pytest.approx(g_mean) and stats.std[6] == pytest.approx(g_std)
    assert stats.mean[1] == pytest.approx(g_mean)  # never seen (<unk>)
    z = stats.normalise(np.array([5.0, 0.8, 9.0]), np.array([4, 5, 6]))
    np.testing.assert_allclose(z, [3.0, (0.8 - 0.5) / MIN_STD, (9.0 - g_mean) / g_std])
    with pytest.raises(ValueError, match="at least one session"):
        KeyStats.fit([], 3)


def test_tail_pvalues_and_tippett_combination_by_hand() -> None:
    cal = [1.0, 2.0, 2.0, 5.0]  # N = 4: p = (1 + #{c >= x}) / 5 up to the largest, 5
    # Past 5 the tail is exponential: the top m = 3 exceed u = 1 by 1, 1, 4 (β = 2).
    np.testing.assert_allclose(
        tail_pvalues(cal, [0.0, 2.0, 2.5, 5.0, 6.0, 9.0]),
        [1, 0.8, 0.4, 0.4, math.exp(-0.5) / 5, math.exp(-2) / 5],
    )
    calibration = {"a": cal, "b": [0.0, 0.0, 0.0, 10.0]}
    # Session 1: p_a = 0.8, p_b(10) = 0.4 → −ln 0.4; session 2: p_a(6) = e^-0.5/5, p_b = 1.
    combined = combined_scores(calibration, {"a": [2.0, 6.0], "b": [10.0, -1.0]}, ("a", "b"))
    np.testing.assert_allclose(combined, [-math.log(0.4), math.log(5) + 0.5])
    # Far past every calibration score: no ceiling, the excess in units of β (b: top 3
    # exceed 0 by 0, 0, 10 → only 10 is above u = 0: β = 10).
    far = combined_scores(calibration, {"a": [0.0], "b": [1010.0]}, ("a", "b"))
    assert far[0] == pytest.approx(math.log(5) + 100)
    # Below every calibration score p = 1 in each part: the score is 0, never -0 (which
    # printed as "score": -0.0 in every verdict of a clean session).
    zero = combined_scores(calibration, {"a": [0.0], "b": [-1.0]}, ("a", "b"))
    assert zero[0] == 0.0 and math.copysign(1.0, zero[0]) == 1.0
    # Calibration scores with no spread: the scale is 1.
    assert log_tail_pvalues([0.0, 0.0], [3.0])[0] == pytest.approx(-math.log(3) - 3)
    with pytest.raises(ValueError, match="calibration"):
        tail_pvalues([], [1.0])


@pytest.mark.parametrize("at", [5.0, 2.0, 0.0])
def test_a_copy_of_a_calibration_score_ties_with_it_whatever_the_rounding(at: float) -> None:
    """The same session scored in another batch differs by float rounding (~1e-7
    relative); on either side of the calibration score it still ties with it. At the
    largest score it landed on 2/5 or on the tail's 1/5: a combined score moved by ln 2."""
    cal = [0.0, 2.0, 2.0, 5.0]
    want = log_tail_pvalues(cal, [at])[0]
    for x in (at * (1 + 3e-7) + 1e-9, at * (1 - 3e-7) - 1e-9):
        assert log_tail_pvalues(cal, [x])[0] == pytest.approx(want, abs=1e-6)
    # ... while a real difference is still one: past the tolerance the count (or the tail)
    # moves
    assert log_tail_pvalues(cal, [at + 0.01])[0] < want - 0.1


def test_a_certain_event_has_surprise_zero_not_minus_zero() -> None:
    """A model sure of the event (log p = 0 exactly) printed ``"surprise": -0.0``."""
    numpy_form = (np.array([[0.0, -np.inf]]), np.array([0]))
    torch_form = (torch.tensor([[0.0, -math.inf]]), torch.tensor([0]))
    for log_probs, targets in (numpy_form, torch_form):
        surprise, rank = surprise_and_rank(log_probs, targets)
        assert math.copysign(1.0, float(surprise[0])) == 1.0 and int(rank[0]) == 0


def test_calibration_scores_equal_up_to_rounding_have_no_spread() -> None:
    """1600 copies of one score (an events run's ``norm``) have a std of 2e-16, not 0:
    taken as the tail's scale, a session 1e-3 past them got a combined score of 4e12, one
    4 nats past 1.8e16. Within rounding there is no spread, and the scale is 1."""
    c = 1.0994199979468593
    cal = np.full(1600, c)
    assert 0 < cal.std() < 1e-15  # the rounding that made the scale
    got = -log_tail_pvalues(cal, [1.1, 5.0])
    np.testing.assert_allclose(got, math.log(1601) + np.array([1.1 - c, 5.0 - c]), rtol=1e-12)
    # top scores that differ in the last bits: no spread either
    rounded = np.concatenate([np.full(1590, 2.0), 2.0 + np.arange(1, 11) * 4e-16])
    assert -log_tail_pvalues(rounded, [3.0])[0] == pytest.approx(math.log(1601) + 1.0)
