"""Every session score of a model's sessions at once, and the calibration of ``norm`` and
``combined``: against the per-session scores and p-values computed one by one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rnnkit.anomaly.calibration import Calibration, all_scores, score_row, top_items
from rnnkit.anomaly.scores import COMBINED_PARTS
from rnnkit.data.vocab import EOS_ID, SPECIALS, UNK_ID

V = 8


def _sessions(
    seed: int, count: int
) -> tuple[list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(4, V, size=rng.integers(1, 7)) for _ in range(count)]
    per_event = [(rng.exponential(1.0, len(q) + 1), rng.integers(0, 5, len(q) + 1)) for q in seqs]
    return seqs, per_event


def test_calibration_by_hand_per_event_and_per_session() -> None:
    seqs, per_event = _sessions(0, 40)
    cal = Calibration.fit(per_event, seqs, V, top_g=3)
    # Per event id: the mean and (population) deviation of its surprises, ends as </s>.
    by_id: dict[int, list[float]] = {}
    for q, (s, _) in zip(seqs, per_event, strict=True):
        for k, x in zip([*q.tolist(), EOS_ID], s.tolist(), strict=True):
            by_id.setdefault(k, []).append(x)
    for k, values in by_id.items():
        if len(values) >= 5:
            assert cal.keys.mean[k] == pytest.approx(np.mean(values))
            assert cal.keys.std[k] == pytest.approx(np.std(values))
    # Per session: max, mean, count of misses, end, and the largest z.
    for i, (q, (s, r)) in enumerate(zip(seqs, per_event, strict=True)):
        ids = [*q.tolist(), EOS_ID]
        z = [
            (x - cal.keys.mean[k]) / max(cal.keys.std[k], cal.keys.min_std)
            for x, k in zip(s, ids, strict=True)
        ]
        expected = {"max": s.max(), "mean": s.mean(), "count": (r >= 3).sum(), "end": s[-1]}
        expected["norm"] = max(z)
        for name in COMBINED_PARTS:
            assert cal.parts[name][i] == pytest.approx(expected[name]), name


def test_combined_is_tippett_over_the_conformal_pvalues() -> None:
    seqs, per_event = _sessions(1, 30)
    cal = Calibration.fit(per_event, seqs, V, top_g=3)
    new_seqs, new_events = _sessions(2, 5)
    scores = all_scores(new_events, new_seqs, 3, cal)
    assert set(scores) == {*COMBINED_PARTS, "combined"}
    n = len(seqs)
    for i in range(len(new_seqs)):
        logs = []
        for name in COMBINED_PARTS:
            x, c = scores[name][i], cal.parts[name]
            if x <= c.max():  # within the calibration scores: (1 + #{c ≥ x}) / (N + 1)
                logs.append(math.log((1 + np.sum(c >= x)) / (n + 1)))
        if len(logs) == len(COMBINED_PARTS):
            assert scores["combined"][i] == pytest.approx(-min(logs))
        else:  # past the largest in some part: beyond every conformal p-value
            assert scores["combined"][i] > math.log(n + 1) - 1e-12


def test_without_a_calibration_only_the_running_scores_and_the_end() -> None:
    seqs, per_event = _sessions(3, 4)
    scores = all_scores(per_event, seqs, 2, None)
    assert set(scores) == {"max", "mean", "count", "end"}
    row = score_row(scores, 1)
    assert isinstance(row["count"], int) and row["count"] == int((per_event[1][1] >= 2).sum())
    assert row["end"] == float(per_event[1][0][-1])


def test_calibration_round_trips_through_its_arrays() -> None:
    seqs, per_event = _sessions(4, 12)
    cal = Calibration.fit(per_event, seqs, V, top_g=2)
    back = Calibration.from_arrays(cal.arrays("rnn"), "rnn")
    np.testing.assert_array_equal(back.keys.mean, cal.keys.mean)
    np.testing.assert_array_equal(back.keys.std, cal.keys.std)
    for name in COMBINED_PARTS:
        np.testing.assert_array_equal(back.parts[name], cal.parts[name])
    with pytest.raises(KeyError):
        Calibration.from_arrays(cal.arrays("rnn"), "ngram")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_calibration_that_is_not_finite_or_of_another_vocabulary_is_refused(bad) -> None:
    # A NaN key mean made every norm and combined score NaN: every verdict "normal".
    seqs, per_event = _sessions(4, 12)
    arrays = Calibration.fit(per_event, seqs, V, top_g=2).arrays("rnn")
    assert Calibration.from_arrays(arrays, "rnn", V).keys.mean.shape == (V,)
    for name in arrays:
        damaged = dict(arrays)
        damaged[name] = arrays[name].copy()
        damaged[name][0] = bad
        with pytest.raises(ValueError, match=f"^{name} holds values that are not finite"):
            Calibration.from_arrays(damaged, "rnn")
    with pytest.raises(ValueError, match=f"rnn/key_mean has {V} events, the vocabulary {V + 1}"):
        Calibration.from_arrays(arrays, "rnn", V + 1)


def test_top_items_name_the_end_and_unknown_events() -> None:
    surprise = np.array([0.2, 3.0, 1.0, 2.0])  # three events and the end
    rank = np.array([0, 4, 1, 0])
    ids = np.array([5, UNK_ID, 6])
    items = top_items(surprise, rank, ids, ["open", "weird", "close"], k=3, g=2)
    assert items == [
        {"position": 1, "event": "weird", "surprise": 3.0, "miss": True, "unknown": True},
        {"position": 3, "event": SPECIALS[EOS_ID], "surprise": 2.0, "miss": False},
        {"position": 2, "event": "close", "surprise": 1.0, "miss": False},
    ]
