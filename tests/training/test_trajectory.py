"""The course of a run read from its events: smoothed training losses (means of the
nearest training records, computed by hand and by numpy here) and the validation losses
at the best and the last validation; None where the events cannot tell."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rnnkit.training.trajectory import SMOOTH_RECORDS, run_events, smoothed_loss, trajectory


def _events(train: dict[int, float], valid: dict[int, float], key: str = "loss_nats") -> list:
    events = [{"event": "train", "step": s, "loss_nats": v} for s, v in train.items()]
    events += [{"event": "valid", "step": s, key: v, "best": False} for s, v in valid.items()]
    return sorted(events, key=lambda e: e["step"])


def test_smoothed_losses_are_means_of_the_nearest_records():
    assert SMOOTH_RECORDS == 5
    records = [(s, float(s)) for s in range(10, 130, 10)]  # loss = step: 10 … 120
    # nearest 60: 60, then 50 and 70, then 40 and 80
    assert smoothed_loss(records, 60) == pytest.approx(60.0)
    # at the start: 10, 20, 30, 40, 50
    assert smoothed_loss(records, 1) == pytest.approx(30.0)
    # the end: the last five
    assert smoothed_loss(records) == pytest.approx(np.mean([80, 90, 100, 110, 120]))
    assert smoothed_loss(records[:2]) == pytest.approx(15.0)
    assert smoothed_loss([]) is None and smoothed_loss([], 5) is None


def test_the_course_of_a_run_that_overfits():
    rng = np.random.default_rng(0)
    steps = np.arange(4, 204, 4)
    train_loss = 2.0 * np.exp(-steps / 80) + 0.1 * rng.random(len(steps))
    valid = {s: 1.5 - s / 1000 if s <= 80 else 1.42 + (s - 80) / 500 for s in range(20, 220, 20)}
    events = _events(dict(zip(steps.tolist(), train_loss.tolist(), strict=True)), valid)
    events.append({"event": "early_stop", "step": 200})
    t = trajectory(events, 80)
    near = np.argsort(np.abs(steps - 80), kind="stable")[:5]
    assert t == {
        "best_step": 80,
        "last_valid_step": 200,
        "train_loss_at_best": pytest.approx(float(train_loss[near].mean())),
        "train_loss_end": pytest.approx(float(train_loss[-5:].mean())),
        "train_loss_change_se": pytest.approx(
            math.sqrt(train_loss[near].var(ddof=1) / 5 + train_loss[-5:].var(ddof=1) / 5)
        ),
        "valid_loss_best": pytest.approx(1.42),
        "valid_loss_last": pytest.approx(1.42 + 120 / 500),
        "valids_after_best": 6,  # at steps 100, 120, ..., 200
        "valids": len([e for e in events if e["event"] == "valid"]),
        "valid_every": 20,
        "train_records": 50,
    }
    assert sorted(steps[near].tolist()) == [72, 76, 80, 84, 88]


def test_regress_reads_its_own_validation_loss():
    events = _events({1: 3.0, 2: 2.0}, {2: 0.5}, key="loss")
    for e in events:
        if e["event"] == "valid":
            e["loss_nats"] = 1.17  # ½ (mse + ln 2π): not the training loss's unit
    assert trajectory(events, 2, "loss")["valid_loss_best"] == 0.5
    assert trajectory(events, 2)["valid_loss_best"] == 1.17


def test_non_finite_and_malformed_records_are_left_out():
    events = _events({1: 2.0, 2: math.nan, 3: 1.0}, {3: 1.5})
    events += [{"event": "train", "step": "4", "loss_nats": 0.1}, {"event": "train", "step": 5}]
    t = trajectory(events, 3)
    assert t["train_records"] == 2 and t["train_loss_end"] == pytest.approx(1.5)
    # both means read the same two records, 2 and 1: variance ½ each
    assert t["train_loss_change_se"] == pytest.approx(math.sqrt(0.5 / 2 + 0.5 / 2))
    assert trajectory(_events({1: 2.0}, {1: 1.5}), 1)["train_loss_change_se"] is None


@pytest.mark.parametrize(
    ("events", "best"),
    [
        (_events({1: 1.0}, {1: 1.0}), None),  # no best validation
        (_events({1: 1.0}, {1: 1.0}), True),
        (_events({}, {1: 1.0}), 1),  # no training record
        # a resumed run whose best (step 1) came before the events in memory
        (_events({5: 1.0, 6: 0.9}, {6: 1.2}), 1),
    ],
)
def test_none_where_the_events_cannot_tell(events, best):
    assert trajectory(events, best) is None


def _steps(events: list) -> list:
    return [(e["event"], e["step"]) for e in events]


def test_a_resumed_runs_events_drop_what_crashed_attempts_logged_past_their_snapshot():
    # attempt 1 logged steps 2..8 and crashed after its snapshot at 4; attempt 2 resumed
    # at 4, logged 6..10 and crashed after its snapshot at 8; this attempt resumed at 8
    first = _events({2: 3.0, 4: 2.5, 6: 2.4, 8: 2.3}, {4: 2.6, 8: 2.4})
    second = _events({6: 2.2, 8: 2.1, 10: 2.0}, {8: 2.2})
    history = _events({10: 1.9, 12: 1.8}, {12: 2.3})
    events = run_events(first + second + [{"event": "train", "step": None}], history, 8)
    # by hand: attempt 1 up to step 4, attempt 2 up to step 8, then the history
    assert events == first[:3] + second[:3] + history
    done = [("train", 2), ("train", 4), ("valid", 4), ("train", 6), ("train", 8), ("valid", 8)]
    assert _steps(events)[:6] == done
    t = trajectory(events, 8)
    assert t["valid_loss_best"] == 2.2 and t["train_records"] == 6
    assert t["train_loss_at_best"] == pytest.approx(np.mean([2.1, 2.2, 1.9, 2.5, 1.8]))
    # no resume: the events in memory are the run's
    assert run_events([], history, 0) == history


def test_the_usual_gap_between_validations_leaves_out_the_runs_closing_one():
    # every 190 steps, then a budget ended the run at step 984: a closing validation
    valid = {190: 2.17, 380: 1.89, 570: 1.75, 760: 1.67, 950: 1.62, 984: 1.63}
    t = trajectory(_events({s: 1.4 for s in range(50, 1000, 50)}, valid), 950)
    assert t["valid_every"] == 190 and t["valids_after_best"] == 1
    assert t["last_valid_step"] == 984
    # fewer than three validations: no usual gap to read
    t = trajectory(_events({1: 2.0, 2: 1.5}, {1: 1.9, 2: 1.8}), 2)
    assert t["valid_every"] is None and t["valids_after_best"] == 0
    # uneven gaps (an epoch's end between regular validations): the median
    valid = {100: 3.0, 200: 2.9, 250: 2.8, 350: 2.7, 450: 2.6, 460: 2.65}
    t = trajectory(_events({s: 2.0 for s in range(50, 500, 50)}, valid), 450)
    assert t["valid_every"] == 100
