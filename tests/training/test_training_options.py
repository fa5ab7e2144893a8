"""``TrainOptions`` refuses, when it is made, a field out of its range, naming it (from
Python nothing else checked them: ``steps=0`` trained nothing, ``clip_norm=-1`` turned
every gradient around, ``max_time=nan`` never stopped)."""

from __future__ import annotations

import math

import pytest

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.settings import train_options
from rnnkit.errors import ConfigError
from rnnkit.training.options import TrainOptions

BAD = [
    ("steps", 0),
    ("steps", -1),
    ("steps", 2.5),
    ("steps", True),
    ("epochs", 0),
    ("epochs", -1),
    ("eval_every", 0),
    ("patience", 0),
    ("patience", -1),
    ("min_gain", -0.1),
    ("min_gain", 1.0),
    ("min_gain", math.nan),
    ("min_gain", "0.1"),
    ("threads", 0),
    ("rows", 0),
    ("max_time", 0),
    ("max_time", -1.0),
    ("max_time", math.nan),
    ("clip_norm", 0),
    ("clip_norm", -1.0),
    ("clip_norm", math.inf),
    ("clip_value", 0.0),
    ("clip_value", math.nan),
    ("lr_decay", 0),
    ("lr_decay", 2.0),
    ("lr_decay", -1),
    ("units", "bogus"),
]


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_a_field_out_of_range_is_refused_naming_it(name, value):
    with pytest.raises(ConfigError, match=f"^TrainOptions: {name} must be .*, got {value!r}$"):
        TrainOptions(**{name: value})


def test_every_value_in_range_is_taken():
    options = TrainOptions(
        epochs=None,
        steps=1,
        eval_every=1,
        patience=1,
        min_gain=0.0,
        threads=1,
        rows=1,
        max_time=math.inf,  # no time limit
        clip_norm=1e-3,
        clip_value=5,
        lr_decay=1.0,
        units="bits",
    )
    assert (options.steps, options.max_time, options.clip_value) == (1, math.inf, 5)


def test_the_command_lines_options_pass_unchanged():
    # rnnkit train checks its own options first: whatever it accepts, TrainOptions does.
    cfg = TrainConfig(steps=3, max_time=60.0, patience=2, eval_every=1, clip_value=0.5)
    assert train_options(cfg, quiet=True).clip_value == 0.5
    assert train_options(TrainConfig(), quiet=True).clip_norm == TrainConfig().clip_norm
