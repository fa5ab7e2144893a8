"""The glue every task shares (``rnnkit.tasks.run``): the loop's options from the config."""

from __future__ import annotations

import dataclasses

import pytest

from rnnkit.config import TrainConfig
from rnnkit.errors import ConfigError
from rnnkit.tasks.run import train_options


def test_every_loop_option_comes_from_the_config() -> None:
    cfg = TrainConfig(
        train="corpus.txt",
        epochs=3,
        steps=17,
        max_time=12.5,
        clip_norm=0.5,
        clip_value=2.0,
        eval_every=4,
        patience=2,
        on_nonfinite="skip",
        precision="bf16",
    ).validate()
    opts = train_options(cfg, quiet=True, units="bits")
    got = dataclasses.asdict(opts)
    for name in (
        "epochs",
        "steps",
        "max_time",
        "clip_norm",
        "clip_value",
        "eval_every",
        "patience",
        "on_nonfinite",
        "precision",
    ):
        assert got[name] == getattr(cfg, name), name
    assert opts.quiet is True and opts.units == "bits"


def test_on_nonfinite_is_validated_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="--on-nonfinite must be one of stop, skip"):
        TrainConfig(train="corpus.txt", on_nonfinite="ignore").validate()
