"""A run's budget: the defaults that follow the data's size, and which option wins."""

from __future__ import annotations

import pytest

from rnnkit.errors import ConfigError
from rnnkit.training.budget import (
    CAP_EPOCHS,
    CAP_MIN_STEPS,
    CAP_SECONDS,
    cap_text,
    default_eval_every,
    default_patience,
    resolve_budget,
)
from rnnkit.training.options import TrainOptions


def test_default_eval_every_and_patience_follow_the_data_size():
    assert default_eval_every(1) == 1 and default_eval_every(10) == 1
    assert default_eval_every(11) == 2 and default_eval_every(978) == 98
    assert default_eval_every(10**7) == 1000  # at least every 1,000 steps
    # two epochs of validations, at least 10 validations and at least 100 steps
    assert default_patience(978, 98) == 20
    assert default_patience(10**7, 1000) == 20_000
    assert default_patience(60, 6) == 20
    assert default_patience(4, 1) == 100


def test_steps_win_over_epochs_and_a_time_budget_alone_has_no_step_total():
    b = resolve_budget(TrainOptions(epochs=3, steps=7), 10, validates=True)
    assert (b.total_steps, b.max_time, b.eval_every, b.patience) == (7, None, None, None)
    assert not b.until_converged and b.log_every == 1  # 7 // 50 < 1
    b = resolve_budget(TrainOptions(epochs=3), 10, validates=True)
    assert b.total_steps == 30
    b = resolve_budget(TrainOptions(epochs=None, max_time=60.0), 978, validates=True)
    assert b.total_steps is None and b.max_time == 60.0 and not b.until_converged
    assert b.log_every == 49  # unknown length: ceil(978 / 20)
    # how many epochs fit is unknown: validated as the default mode does (once an epoch,
    # a time budget shorter than an epoch of a large corpus had one validation, its last)
    assert b.eval_every == default_eval_every(978) == 98 and b.patience is None
    given = resolve_budget(TrainOptions(epochs=None, max_time=60.0, eval_every=7), 978, True)
    assert given.eval_every == 7


def test_no_budget_trains_until_validation_stops_improving_up_to_the_cap():
    b = resolve_budget(TrainOptions(epochs=None), 978, validates=True)
    assert b.until_converged and b.max_time == CAP_SECONDS
    assert b.total_steps == max(CAP_EPOCHS * 978, CAP_MIN_STEPS) == 97_800
    assert (b.eval_every, b.patience) == (98, 20)
    # Given options are kept; without validation data there is no default patience.
    b = resolve_budget(TrainOptions(epochs=None, eval_every=5, patience=3), 978, True)
    assert (b.eval_every, b.patience) == (5, 3)
    assert resolve_budget(TrainOptions(epochs=None), 978, validates=False).patience is None
    assert cap_text(b.total_steps, 978) == f"100 epochs (97,800 steps) or {CAP_SECONDS:.0f} s"


def test_the_cap_of_tiny_data_shows_its_epochs_to_one_decimal():
    # 7 steps an epoch: the 5,000-step floor is 714.2857... epochs, shown as people read it.
    b = resolve_budget(TrainOptions(epochs=None), 7, validates=True)
    assert b.total_steps == CAP_MIN_STEPS == 5000
    assert cap_text(b.total_steps, 7) == f"714.3 epochs (5,000 steps) or {CAP_SECONDS:.0f} s"
    assert cap_text(5000, 1).startswith("5000 epochs (5,000 steps)")


@pytest.mark.parametrize("bad", [0, -1, True])
def test_log_every_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=r"^TrainOptions: log_every must be an integer"):
        resolve_budget(TrainOptions(log_every=bad), 10, validates=True)
