"""Learning-rate schedules of the command line, built from ``torch.optim.lr_scheduler``.

``--lr-schedule`` takes one of:

* ``constant``: the rate stays ``--lr``;
* ``plateau``: ``ReduceLROnPlateau``: ``lr ← lr · --lr-decay`` when validation stops
  improving (the default with ``--optimizer sgd``);
* ``step:E:F``: the rate is multiplied by ``F`` at the end of epoch ``E`` and of every
  later epoch, i.e. during epoch ``e`` (1-based) ``lr_e = lr · F^max(0, e − E)`` — the
  classic Penn Treebank schedule is ``step:4:0.5`` (lr 1, halved after epochs 4, 5, …);
* ``cosine``: ``CosineAnnealingLR`` from ``--lr`` down to 0 over the whole run (needs a
  known number of steps: ``--steps`` or ``--epochs``).

``--warmup N`` raises the rate linearly over the first N steps (``LinearLR`` from
``lr/(N+1)``), then hands over to the schedule (``SequentialLR``). Every per-step
scheduler here is stepped once per optimizer step; its state is part of a snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import (
    CosineAnnealingLR,
    LambdaLR,
    LinearLR,
    ReduceLROnPlateau,
    SequentialLR,
)

from rnnkit.errors import ConfigError
from rnnkit.training.options import given

__all__ = ["SCHEDULES", "LRSchedule", "build_lr_schedulers", "parse_lr_schedule"]

SCHEDULES = ("constant", "plateau", "step:E:F", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    """A parsed ``--lr-schedule``: ``kind`` and, for ``step``, ``after_epoch`` E and
    ``factor`` F."""

    kind: str
    after_epoch: int | None = None
    factor: float | None = None

    def step_factor(self, steps_done: int, steps_per_epoch: int) -> float:
        """``F^max(0, e − E)`` for the step after ``steps_done`` steps, in epoch
        ``e = steps_done // steps_per_epoch + 1``."""
        assert self.after_epoch is not None and self.factor is not None
        epoch = steps_done // steps_per_epoch + 1
        return self.factor ** max(0, epoch - self.after_epoch)


def parse_lr_schedule(spec: str, argument: str = "lr_schedule") -> LRSchedule:
    """``constant`` | ``plateau`` | ``cosine`` | ``step:E:F`` (E ≥ 1 an integer, F > 0).

    An error names ``argument``: ``TrainOptions``' field (the default) or the command
    line's ``--lr-schedule``.

    >>> parse_lr_schedule("step:4:0.5")
    LRSchedule(kind='step', after_epoch=4, factor=0.5)
    >>> parse_lr_schedule("linear")
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: lr_schedule must be one of constant, plateau, step:E:F, \
cosine, got 'linear'
    """
    if spec in ("constant", "plateau", "cosine"):
        return LRSchedule(spec)
    kind, _, rest = spec.partition(":") if isinstance(spec, str) else (None, "", "")
    if kind != "step":
        raise ConfigError(f"{argument} must be one of {', '.join(SCHEDULES)}, got {spec!r}")
    e, sep, f = rest.partition(":")
    if not sep:
        raise ConfigError(f"{argument} step:E:F needs an epoch E and a factor F, got {spec!r}")
    try:
        after = int(e)
    except ValueError:
        raise ConfigError(f"{argument} step:E:F needs an integer epoch E, got {e!r}") from None
    try:
        factor = float(f)
    except ValueError:
        raise ConfigError(f"{argument} step:E:F needs a number F, got {f!r}") from None
    if after < 1:
        raise ConfigError(f"{argument} step:E:F needs E ≥ 1, got {after}")
    if not (factor > 0 and math.isfinite(factor)):
        raise ConfigError(f"{argument} step:E:F needs a factor F > 0, got {f}")
    return LRSchedule("step", after, factor)


def build_lr_schedulers(
    optimizer: torch.optim.Optimizer,
    schedule: LRSchedule,
    *,
    steps_per_epoch: int,
    total_steps: int | None,
    warmup: int = 0,
    decay: float = 0.5,
    plateau_patience: int = 0,
    names: Mapping[str, str] | None = None,
) -> tuple[Any, ReduceLROnPlateau | None]:
    """``(per-step scheduler or None, ReduceLROnPlateau or None)`` for ``schedule``.

    ``total_steps`` is the run's length when known (None: a time budget or training until
    validation stops improving). A step schedule whose decay never happens within it,
    a cosine without it, or a warm-up not shorter than it is a ``ConfigError`` naming
    ``schedule``, ``total_steps`` or ``warmup``, or what ``names`` maps them to (the
    ``Trainer``: ``TrainOptions``' fields or the command line's options).
    """
    name = {"schedule": "schedule", "warmup": "warmup", "total_steps": "total_steps"}
    name.update(names or {})
    if warmup < 0:
        raise ConfigError(f"{name['warmup']} must be ≥ 0 steps, got {warmup}")
    if total_steps is not None and warmup >= total_steps > 0:
        raise ConfigError(
            f"{given(name['warmup'], warmup)} is not shorter than the run ({total_steps} steps)"
        )
    plateau = None
    main: Any = None
    if schedule.kind == "plateau":
        plateau = ReduceLROnPlateau(optimizer, factor=decay, patience=plateau_patience)
    elif schedule.kind == "step":
        assert schedule.after_epoch is not None
        if total_steps is not None and schedule.after_epoch * steps_per_epoch >= total_steps:
            epochs = total_steps / steps_per_epoch
            spec = f"step:{schedule.after_epoch}:{schedule.factor:g}"
            raise ConfigError(
                f"{given(name['schedule'], spec)} never decays: the run ends after "
                f"{epochs:g} epochs ({total_steps} steps of {steps_per_epoch} per epoch)"
            )

        # LambdaLR counts the steps after the warm-up: add them back, so that the decay
        # falls on the epoch boundaries whatever the warm-up.
        def factor(k: int) -> float:
            return schedule.step_factor(k + warmup, steps_per_epoch)

        main = LambdaLR(optimizer, factor)
    elif schedule.kind == "cosine":
        if total_steps is None:
            raise ConfigError(
                f"{given(name['schedule'], 'cosine')} needs the run's length: give "
                f"{name['total_steps']}"
            )
        main = CosineAnnealingLR(optimizer, T_max=max(total_steps - warmup, 1))
    if warmup == 0:
        return main, plateau
    warm = LinearLR(optimizer, start_factor=1.0 / (warmup + 1), end_factor=1.0, total_iters=warmup)
    if main is None:  # constant or plateau: LinearLR holds the rate after its last step
        return warm, plateau
    return SequentialLR(optimizer, [warm, main], milestones=[warmup]), plateau
