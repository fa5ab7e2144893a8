"""Scheduled-sampling schedules: values, bounds, monotonicity, parse errors naming the option."""

from __future__ import annotations

import math

import pytest

from rnnkit.errors import ConfigError
from rnnkit.training.scheduled_sampling import SamplingSchedule, parse_schedule


def test_none_is_teacher_forcing_throughout():
    s = parse_schedule("none")
    assert not s.active
    assert s.probability(0) == s.probability(10**9) == 0.0


def test_linear_reaches_one_after_k_steps():
    s = parse_schedule("linear:200")
    assert [s.probability(i) for i in (0, 50, 200, 10_000)] == [0.0, 0.25, 1.0, 1.0]


def test_exponential_is_one_minus_k_to_the_i():
    s = parse_schedule("exponential:0.999")
    assert s.probability(0) == 0.0
    assert s.probability(1000) == pytest.approx(1 - 0.999**1000)


def test_inverse_sigmoid_is_bengio_form_and_survives_huge_steps():
    s = parse_schedule("inverse-sigmoid:100")
    for i in (0, 100, 500, 1000):
        assert s.probability(i) == pytest.approx(1 - 100 / (100 + math.exp(i / 100)))
    assert s.probability(10**9) == 1.0


@pytest.mark.parametrize(
    "spec", ["linear:50", "exponential:0.95", "inverse-sigmoid:20", "linear:10:0.3"]
)
def test_probability_grows_and_stays_in_bounds(spec):
    s = parse_schedule(spec)
    values = [s.probability(i) for i in range(0, 400, 7)]
    assert all(0.0 <= v <= s.max_p for v in values)
    assert values == sorted(values)


def test_cap():
    assert parse_schedule("linear:10:0.3").probability(100) == 0.3
    assert parse_schedule("linear:10:0") == SamplingSchedule("linear", 10.0, 0.0)
    assert not parse_schedule("linear:10:0").active


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("cosine:3", "must be none"),
        ("linear", "must be none"),
        ("linear:x", "numbers"),
        ("linear:0", "K ≥ 1"),
        ("exponential:2", "0 < K < 1"),
        ("inverse-sigmoid:0.5", "K ≥ 1"),
        ("linear:10:1.5", "MAX"),
        ("linear:inf", "finite"),
    ],
)
def test_bad_specs_name_the_option(spec, problem):
    with pytest.raises(ConfigError, match="--scheduled-sampling") as err:
        parse_schedule(spec)
    assert problem in str(err.value)


def test_negative_step_is_an_error():
    with pytest.raises(ValueError):
        parse_schedule("linear:5").probability(-1)
