"""A NaN or infinite loss or gradient during training: stop, skip the step, or (float16)
let the ``GradScaler`` lower its scale.

``on_nonfinite="stop"`` (the default) ends training with :class:`TrainingDiverged` naming
the step and batch; ``"skip"`` drops the step and goes on, unless ``MAX_SKIPPED_STEPS``
steps in a row were bad. With float16, gradients that overflow the scaled loss are the
``GradScaler``'s business (it skips the step and halves its scale), not a divergence,
unless that happens ``MAX_SCALER_SKIPS`` times in a row. A finite training loss
``DIVERGED_RISE`` times the first step's (or than 1 nat, where that was less) stops
training too, whatever ``on_nonfinite`` says, where it is a cross-entropy (the loop asks
for those only: a regressor's squared error has its data's scale): a rate far too large
can leave weights that stay finite yet are as far gone as an overflow. No snapshot is
ever written after a bad step: the loop writes them only after good ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from rnnkit.errors import RnnkitError
from rnnkit.training.options import given

__all__ = ["DIVERGED_RISE", "MAX_SCALER_SKIPS", "MAX_SKIPPED_STEPS", "TrainingDiverged"]

# float16 overflow skips in a row before training counts as diverged: each halves the loss
# scale, so 20 take the default 2^16 down to 2^-4 — gradients that overflow float16 even
# then (|g| > 2^20) are not a scale problem.
MAX_SCALER_SKIPS = 20
# on_nonfinite="skip": non-finite steps in a row before training counts as diverged. One bad
# batch is what skipping is for; 20 in a row mean the weights themselves went bad (every
# later batch would be skipped too — without this bound, forever).
MAX_SKIPPED_STEPS = 20
# A training loss (nats a token) this many times the first step's, or than 1 where that
# was less, is a divergence though finite: no model that learns gets there (a character
# model at lr 1e30 went from 2.07 to 1.4e29 in one step; an untrained model starts near
# ln V, and a resumed one's first loss is at least 1 here).
DIVERGED_RISE = 1e6


class TrainingDiverged(RnnkitError):
    """A NaN or infinite loss/gradient; the last good checkpoint is left intact."""


def _python_name(name: str) -> str:
    return name


def lower_lr(argument: Callable[[str], str]) -> str:
    """The advice to lower the learning rate: ``--lr`` is ``rnnkit train``'s option; from
    Python the rate is the optimizer's (``TrainOptions`` has no ``lr``).

    >>> lower_lr(lambda name: "--" + name), lower_lr(_python_name)
    ('lower --lr', "lower the optimizer's lr")
    """
    lr = argument("lr")
    return f"lower {lr}" if lr.startswith("--") else "lower the optimizer's lr"


def advice(
    argument: Callable[[str], str], bf16: bool = False, clip_norm: float | None = None
) -> str:
    """What to change after a divergence, named as the user gave the run's options
    (``argument``: :meth:`~rnnkit.training.options.TrainOptions.argument`). With
    clipping on (``clip_norm``, the run's threshold), the advice is to lower it, naming
    its value: "set --clip-norm" was advised even when it was set (the command line's
    default is 5).

    >>> advice(lambda name: "--" + name.replace("_", "-"), bf16=True)
    'lower --lr, set --clip-norm or use --precision bf16'
    >>> advice(_python_name, bf16=True)
    "lower the optimizer's lr, set clip_norm or use precision='bf16'"
    >>> advice(lambda name: "--" + name.replace("_", "-"), clip_norm=5.0)
    'lower --lr or lower --clip-norm (now 5)'
    >>> advice(_python_name, clip_norm=0.25)
    "lower the optimizer's lr or lower clip_norm (now 0.25)"
    """
    clip = argument("clip_norm")
    remedies = [
        lower_lr(argument),
        f"set {clip}" if clip_norm is None else f"lower {clip} (now {clip_norm:g})",
    ]
    if bf16:
        remedies.append("use " + given(argument("precision"), "bf16"))
    return ", ".join(remedies[:-1]) + " or " + remedies[-1]


class NonFiniteGuard:
    """The checks of one training run and their counts in a row.

    Args:
        on_nonfinite: ``"stop"`` or ``"skip"``.
        log: where a ``skipped`` or ``scaler_skip`` event goes (the run's log).
        argument: how the advice of an error names an option (the run's
            :meth:`~rnnkit.training.options.TrainOptions.argument`; default: the Python
            arguments).
        clip_norm: the run's gradient-norm threshold (None: no clipping), which the
            advice names.

    ``where`` below is ``(step, batch, epoch)``: the step in flight (1-based), the batch's
    position in its epoch, the epoch.

    >>> guard = NonFiniteGuard("skip", log=lambda event: print(event["reason"]))
    >>> guard.check(float("nan"), "the training loss", (3, 2, 1))
    the training loss is nan at step 3 (batch 2 of epoch 1); no checkpoint was written
    False
    """

    def __init__(
        self,
        on_nonfinite: str,
        log: Callable[[dict[str, Any]], None],
        argument: Callable[[str], str] = _python_name,
        clip_norm: float | None = None,
    ) -> None:
        self.on_nonfinite = on_nonfinite
        self.log = log
        self.argument = argument
        self.clip_norm = clip_norm
        self.skip_streak = 0  # non-finite steps skipped in a row (on_nonfinite="skip")
        self.updated = False  # an optimizer step was taken in this run (this process)
        self.saved = False  # a checkpoint of this run exists (written, or resumed from)
        self.scaler_skips = 0  # steps the GradScaler skipped (float16 overflow)
        self.scaler_streak = 0  # ... of them in a row, up to now
        self.first_loss: float | None = None  # the first step's training loss a token

    def check(self, value: float, what: str, where: tuple[int, int, int]) -> bool:
        """True when ``value`` is finite; False when the step is to be skipped (the caller
        drops its gradients); raises :class:`TrainingDiverged` otherwise."""
        if math.isfinite(value):
            return True
        step, batch, epoch = where
        message = f"{what} is {value} at step {step} (batch {batch} of epoch {epoch}); {self.kept}"
        if self.on_nonfinite == "skip":
            self.log({"event": "skipped", "step": step, "reason": message})
            self.skip_streak += 1
            if self.skip_streak < MAX_SKIPPED_STEPS:
                return False
            message = f"{self.skip_streak} steps in a row were skipped; the last: {message}"
        raise TrainingDiverged(f"{message} ({self._remedy()})")

    def check_rise(self, loss: float, where: tuple[int, int, int]) -> None:
        """Raise :class:`TrainingDiverged` when the finite training loss ``loss`` (nats a
        token) is :data:`DIVERGED_RISE` times the first step's, or than 1 where that was
        less; the first call records it."""
        first = self.first_loss
        if first is None:
            self.first_loss = loss
        elif loss > DIVERGED_RISE * max(first, 1.0):
            step, batch, epoch = where
            raise TrainingDiverged(
                f"the training loss is {loss:.3g} at step {step} (batch {batch} of epoch "
                f"{epoch}), over a million times the first step's ({first:.3g}): training "
                f"diverged; {self.kept} ({self.advice()})"
            )

    @property
    def kept(self) -> str:
        """What the run keeps after a divergence: its last good checkpoint, if it has one."""
        return kept_checkpoint(self.saved)

    def advice(self, bf16: bool = False) -> str:
        """What to change after a divergence of this run (:func:`advice`)."""
        return advice(self.argument, bf16, self.clip_norm)

    def _remedy(self) -> str:
        """Before the first update the weights are those the run started from: a lower
        rate cannot help (a regress value of 1e30, whose squared error is inf, said
        "lower --lr")."""
        if self.updated:
            return self.advice()
        return (
            "before any update, so not the learning rate: values in the data too large for "
            "float32, or the weights the run started from"
        )

    def good_step(self) -> None:
        """An optimizer step was taken: the count of skipped steps in a row starts over."""
        self.skip_streak = 0
        self.updated = True

    def scaler_skipped(
        self,
        scaler: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer,
        params: Sequence[Tensor],
        where: tuple[int, int, int],
    ) -> bool:
        """fp16 only: if the unscaled gradients hold inf/NaN, let the GradScaler skip the
        step and lower its scale (its own overflow handling, not a divergence) and return
        True; ``MAX_SCALER_SKIPS`` such steps in a row are a :class:`TrainingDiverged`."""
        grads = [p.grad for p in params if p.grad is not None]
        peak = torch.nn.utils.get_total_norm(grads, norm_type=math.inf) if grads else None
        if peak is None or bool(torch.isfinite(peak)):
            self.scaler_streak = 0
            return False
        scaler.step(optimizer)  # sees the recorded inf: no optimizer step
        scaler.update()  # scale ← scale · backoff
        self.scaler_skips += 1
        self.scaler_streak += 1
        scale = scaler.get_scale()
        step, batch, epoch = where
        self.log({"event": "scaler_skip", "step": step, "batch": batch, "scale": scale})
        if self.scaler_streak >= MAX_SCALER_SKIPS:
            raise TrainingDiverged(
                f"the gradients overflowed float16 {self.scaler_streak} steps in a row, up to "
                f"step {step} (batch {batch} of epoch {epoch}; loss scale now {scale:g}); "
                f"{self.kept} ({self.advice(bf16=True)})"
            )
        return True


def kept_checkpoint(saved: bool) -> str:
    """The end of a divergence's message: no snapshot is ever written after a bad step, so
    the last good one is kept — where the run has one (a fresh run failing before its first
    snapshot, or a run without an output directory, has none)."""
    return "the last good checkpoint is kept" if saved else "no checkpoint was written"


@contextmanager
def update_overflow(
    where: tuple[int, int, int],
    lr: float,
    argument: Callable[[str], str] = _python_name,
    saved: bool = True,
) -> Iterator[None]:
    """An optimizer step whose update float32 cannot hold is a :class:`TrainingDiverged`.

    torch refuses such an update with ``RuntimeError: value cannot be converted to type
    float without overflow`` (Adam's first step is ``lr / (1 - β1)`` = 10·lr: ``--lr 1e38``
    overflows there; a growing ``--lr-schedule step:E:F`` may get there later). The step is
    named as the non-finite checks name it, and no snapshot follows; ``argument`` names
    the options as :class:`NonFiniteGuard`'s does, ``saved``: whether the run has a
    checkpoint.

    >>> with update_overflow((1, 1, 0), 1e38, lambda name: "--" + name):
    ...     raise RuntimeError("value cannot be converted to type float without overflow")
    Traceback (most recent call last):
    ...
    rnnkit.training.nonfinite.TrainingDiverged: the update overflows float32 at step 1 \
(batch 1 of epoch 0; learning rate 1e+38); the last good checkpoint is kept (lower --lr)
    """
    try:
        yield
    except RuntimeError as exc:
        if "without overflow" not in str(exc):
            raise
        step, batch, epoch = where
        raise TrainingDiverged(
            f"the update overflows float32 at step {step} (batch {batch} of epoch {epoch}; "
            f"learning rate {lr:g}); {kept_checkpoint(saved)} ({lower_lr(argument)})"
        ) from None
