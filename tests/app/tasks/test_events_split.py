"""How many normal sessions the events task validates on, and how the threshold is picked
when they are few: it rests on at least 30 normal sessions where the data allows, and on
the tail fit where it does not."""

from __future__ import annotations

import numpy as np
import pytest

from rnnkit.anomaly.scores import SCORES
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.events import MIN_THRESHOLD_SESSIONS, prepare_events_data
from rnnkit.app.tasks.events.thresholds import write_thresholds
from rnnkit.data.events import write_sessions
from rnnkit.data.generated_sessions import generate_sessions


@pytest.mark.parametrize(
    "sessions, fraction, expected",
    [(120, 0.05, 30), (60, 0.05, 18), (2000, 0.05, 100), (120, 0.4, 48), (3, 0.05, 1)],
)
def test_the_split_holds_out_enough_normal_sessions_for_a_threshold(
    tmp_path, sessions, fraction, expected
):
    path = tmp_path / "s.jsonl"
    write_sessions(path, generate_sessions(sessions, anomalies=0, seed=0))
    cfg = TrainConfig(task="events", train=str(path), valid_fraction=fraction).validate()
    data = prepare_events_data(cfg)
    assert len(data.valid) == expected
    assert len(data.train) == sessions - expected


def test_a_negative_seed_splits_the_sessions(tmp_path):
    path = tmp_path / "s.jsonl"
    write_sessions(path, generate_sessions(60, anomalies=0, seed=0))

    def held(seed):
        cfg = TrainConfig(task="events", train=str(path), seed=seed).validate()
        return [s.tolist() for s in prepare_events_data(cfg).valid]

    assert held(-1) == held(-1) != held(0)  # was a ValueError of numpy


def _scores(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.exponential(size=n) for name in SCORES}


@pytest.mark.parametrize("n", [12, 29, 30, 60])
def test_a_threshold_from_fewer_than_30_sessions_is_the_tail_fits(tmp_path, n):
    opts = {"target_fpr": 0.01, "threshold": "quantile", "top_g": 5, "window": 1, "score": "max"}
    valid = {"rnn": _scores(n, 1), "ngram": _scores(n, 2)}
    doc = write_thresholds(tmp_path, opts, valid, None)
    assert doc["valid_sessions"] == n
    if n < MIN_THRESHOLD_SESSIONS:
        assert doc["method"] == "gpd"
        how = doc["how"]["rnn"]["max"]
        assert how.startswith(f"{n} normal validation sessions, fewer than 30: ")
        assert "generalized Pareto tail" in how or "tail fit impossible" in how
    else:
        assert doc["method"] == "quantile"
        assert doc["how"]["rnn"]["max"] == "empirical quantile"
    opts["threshold"] = "gpd"  # the user's choice stays theirs, with no note
    assert not write_thresholds(tmp_path, opts, valid, None)["how"]["rnn"]["max"].startswith(
        f"{n} normal"
    )
