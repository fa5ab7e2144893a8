"""The options that the commands loading a trained run (``evaluate``, ``predict``,
``generate``, ``score``, ``report``) share with ``rnnkit train``, declared once, on the
training configuration's fields (``rnnkit.app.config``): the same flag, type, choices,
metavar, help text and bounds. Only the default differs where a run has its own: such an
option left out means the run's value (``--score``: the score the run was trained with).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from rnnkit.app.config import TrainConfig
from rnnkit.app.config.fields import check_option, flag, option_of, value_kinds

__all__ = ["RUN_DEFAULT", "add_device_option", "add_run_option", "check_run_option"]

#: What the help says of the default of an option that a run holds.
RUN_DEFAULT = "the run's"


def _field(name: str) -> dataclasses.Field[Any]:
    return next(f for f in dataclasses.fields(TrainConfig) if f.name == name)


def run_option_help(name: str, default: str | None = RUN_DEFAULT, note: str = "") -> str:
    """The help of ``--name``: its field's text, the default said as ``default`` (None:
    argparse's own ``%(default)s``), then ``[note]``.

    >>> run_option_help("target_fpr", note="re-picked")  # doctest: +ELLIPSIS
    "false-positive rate the thresholds aim at ... (default the run's; ...) [re-picked]"
    """
    text = option_of(_field(name)).help
    if default is not None:
        text = text.replace("%(default)s", default)
    return f"{text} [{note}]" if note else text


def add_run_option(
    p: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    *,
    note: str = "",
    default: Any = None,
    default_text: str | None = RUN_DEFAULT,
) -> None:
    """Add the option of the configuration field ``name`` to ``p``: the field's type,
    choices, metavar and help (:func:`run_option_help`); its value is checked against the
    field's bounds by :func:`check_run_option`.

    >>> p = argparse.ArgumentParser(); add_run_option(p, "score")
    >>> p.parse_args(["--score", "norm"]).score, p.parse_args([]).score
    ('norm', None)
    """
    field = _field(name)
    meta = option_of(field)
    kind, _ = value_kinds(TrainConfig)[name]
    typed: dict[str, Any] = {} if kind is str else {"type": kind}
    p.add_argument(
        flag(name),
        **typed,
        default=default,
        choices=meta.choices,
        metavar=meta.metavar,
        help=run_option_help(name, default_text, note),
    )


def check_run_option(name: str, value: Any) -> None:
    """A ``ConfigError`` naming ``--name`` unless ``value`` (None: not given) is within
    the bounds of the field ``name``, as ``rnnkit train`` checks it.

    >>> check_run_option("target_fpr", 1.5)
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --target-fpr must be in (0, 1), got 1.5
    """
    if value is not None:
        check_option(_field(name), value)


def add_device_option(p: argparse.ArgumentParser) -> None:
    """Add ``--device cpu|cuda|auto`` (default cpu): where the run's model is loaded and
    computes. A run trained on one device runs on another with the same results to
    float32 rounding.

    >>> p = argparse.ArgumentParser(); add_device_option(p)
    >>> p.parse_args(["--device", "auto"]).device, p.parse_args([]).device
    ('auto', 'cpu')
    """
    add_run_option(p, "device", default=_field("device").default, default_text=None)
