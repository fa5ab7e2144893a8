"""``--device`` of the commands that load a trained run (``evaluate``, ``predict``,
``generate``, ``score``, ``report``): the same choices as ``rnnkit train --device``,
declared once, on the training configuration's field."""

from __future__ import annotations

import argparse
import dataclasses

from rnnkit.app.config import TrainConfig
from rnnkit.app.config.fields import option_of

__all__ = ["add_device_option"]


def add_device_option(p: argparse.ArgumentParser) -> None:
    """Add ``--device cpu|cuda|auto`` (default cpu): where the run's model is loaded and
    computes. A run trained on one device runs on another with the same results to
    float32 rounding.

    >>> p = argparse.ArgumentParser(); add_device_option(p)
    >>> p.parse_args(["--device", "auto"]).device, p.parse_args([]).device
    ('auto', 'cpu')
    """
    field = next(f for f in dataclasses.fields(TrainConfig) if f.name == "device")
    p.add_argument(
        "--device",
        choices=option_of(field).choices,
        default=field.default,
        help="where the model computes: cpu, cuda (a GPU), auto (a GPU when there is one) "
        "(default %(default)s)",
    )
