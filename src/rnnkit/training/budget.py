"""How long training runs, and how often it validates and records, from the options and
the data's size.

A run has a step budget (``steps``, or ``epochs`` × steps per epoch), a time budget
(``max_time``), or neither: then it trains until validation stops improving, validating
about ``VALIDATIONS_PER_EPOCH`` times per epoch, stopping after :func:`default_patience`
validations without improvement, and at the latest after ``CAP_EPOCHS`` epochs (at least
``CAP_MIN_STEPS`` steps) or ``CAP_SECONDS`` seconds. Training records come every
:func:`default_log_every` steps unless ``log_every`` says otherwise. What counts as an
improvement for the patience is :func:`gained`'s: a fall of the validation loss by more
than ``min_gain`` (``MIN_GAIN``) of it, and by at least ``min_gain`` nats below one nat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from rnnkit.errors import ConfigError

__all__ = [
    "CAP_EPOCHS",
    "CAP_MIN_STEPS",
    "CAP_SECONDS",
    "MIN_GAIN",
    "default_eval_every",
    "default_log_every",
    "default_patience",
    "gained",
]

# Training with no budget: validate about this often per epoch (early stopping needs
# several points per epoch on small data, where one epoch is a handful of steps) ...
VALIDATIONS_PER_EPOCH = 10
MAX_EVAL_EVERY = 1000  # ... but at least every 1,000 steps on large data
# ... and stop at the latest after CAP_EPOCHS epochs (but not before CAP_MIN_STEPS steps:
# a few hundred sessions make an epoch of 4 steps) or CAP_SECONDS of training.
CAP_EPOCHS = 100
CAP_MIN_STEPS = 5000
CAP_SECONDS = 3600.0

# Training records (metrics.jsonl, -v lines) every at most this many steps; a run whose
# length is known gets at least RECORDS_PER_RUN records (a 200-step run: every 4 steps),
# one of unknown length at least RECORDS_PER_EPOCH per epoch.
MAX_LOG_EVERY = 50
RECORDS_PER_RUN = 50
RECORDS_PER_EPOCH = 20


#: The default of ``min_gain``: torch's ``ReduceLROnPlateau`` threshold (relative).
MIN_GAIN = 1e-4


def gained(loss: float, reference: float | None, min_gain: float) -> bool:
    """Whether the validation loss ``loss`` is a gain for the patience: below the loss of
    the last validation that was one (``reference``; None: this is the first) by more
    than ``min_gain`` of its size, and by at least ``min_gain`` nats below one nat:
    ``loss < r − min_gain·max(|r|, 1)``.

    A chain of smaller falls adds up: ``reference`` moves only at a gain, so the patience
    runs out once the loss has not fallen by that fraction over ``patience`` validations
    (Keras' ``EarlyStopping(min_delta)`` and torch's ``ReduceLROnPlateau(threshold)`` keep
    their best so too). The best weights are the lowest loss's whatever this says.

    Relative above one nat, because the loss every task validates (``loss_nats``; never
    an accuracy) has no common scale: nats per token of a character or word model (about
    1 and 5), per example of a classifier (near 0.1 when it is good), per value of a
    regressor, a Gaussian negative log-likelihood whose size follows the units of the
    data (``½(mse + ln 2π)`` with ``--loss mse``). One absolute threshold would be
    negligible for some and out of reach for others; a fraction means the same for all.
    ``|r|`` rather than torch's ``r·(1 − min_gain)``: a Gaussian likelihood's loss can be
    negative, and there torch's rule takes a slightly worse loss for a gain.

    Below one nat the fall asked is ``min_gain`` nats, not a fraction: every loss here is
    in nats, and a fall of 1e-4 nats (each token's, example's or value's likelihood up by
    a hundredth of a percent) is the least that means anything. A model that fits its
    data drives a cross-entropy towards 0 geometrically, and a relative test counts every
    one of those falls: a classifier at validation accuracy 1.0 from step 189 went on to
    its cap at step 6,300 (loss 4e-4 → 9e-7 nats); it stops at step 959 now.

    >>> gained(1.9999, 2.0, 1e-4), gained(1.9997, 2.0, 1e-4), gained(1.9999, 2.0, 0.0)
    (False, True, True)
    >>> gained(-2.0001, -2.0, 1e-4), gained(-2.001, -2.0, 1e-4), gained(5.0, None, 1e-4)
    (False, True, True)
    >>> gained(0.0005, 0.001, 1e-4), gained(0.00095, 0.001, 1e-4)  # absolute below 1 nat
    (True, False)
    """
    return reference is None or loss < reference - min_gain * max(abs(reference), 1.0)


def default_eval_every(steps_per_epoch: int) -> int:
    """Steps between validations when training until validation stops improving:
    ``clamp(⌈S / VALIDATIONS_PER_EPOCH⌉, 1, MAX_EVAL_EVERY)`` for ``S`` steps per epoch.

    >>> default_eval_every(978), default_eval_every(4)
    (98, 1)
    """
    return max(1, min(math.ceil(steps_per_epoch / VALIDATIONS_PER_EPOCH), MAX_EVAL_EVERY))


def default_log_every(total_steps: int | None, steps_per_epoch: int) -> int:
    """Steps between training records when ``log_every`` is not given: for a run of known
    length ``N`` (a step or epoch budget) ``clamp(⌊N / 50⌋, 1, 50)`` — every step up to 99
    steps, at least 50 records up to 2,500 steps, every 50 steps beyond; for a run of
    unknown length (a time budget, or until validation stops improving) ``clamp(⌈S / 20⌉,
    1, 50)`` for ``S`` steps per epoch — at least 20 records per epoch (such a run lasts at
    least its patience, of an epoch or more, so it too gets ~20 points or more).

    >>> default_log_every(6, 10), default_log_every(200, 10), default_log_every(5000, 10)
    (1, 4, 50)
    >>> default_log_every(None, 978), default_log_every(None, 4)
    (49, 1)
    """
    if total_steps is not None:
        return max(1, min(total_steps // RECORDS_PER_RUN, MAX_LOG_EVERY))
    return max(1, min(math.ceil(steps_per_epoch / RECORDS_PER_EPOCH), MAX_LOG_EVERY))


def default_patience(steps_per_epoch: int, eval_every: int) -> int:
    """Validations without improvement before training with no budget stops: those of
    two epochs, at least 10 validations and at least 100 steps — generous, because an
    LSTM's validation loss can stall for a while (on a plateau) before it falls again.

    >>> default_patience(978, 98), default_patience(4, 1)
    (20, 100)
    """
    per_epoch = math.ceil(steps_per_epoch / eval_every)
    return max(2 * per_epoch, 10, math.ceil(100 / eval_every))


class BudgetOptions(Protocol):
    """The options a budget is made from (:class:`~rnnkit.training.options.TrainOptions`),
    read only."""

    @property
    def epochs(self) -> int | None: ...
    @property
    def steps(self) -> int | None: ...
    @property
    def max_time(self) -> float | None: ...
    @property
    def eval_every(self) -> int | None: ...
    @property
    def patience(self) -> int | None: ...
    @property
    def log_every(self) -> int | None: ...


@dataclass(frozen=True)
class Budget:
    """What ends a run and how often it validates and records.

    Attributes:
        total_steps: the last step (None: no step budget, a time budget only).
        max_time: seconds of training before it stops (None: no limit).
        eval_every: validate every N steps (None: at the end of every epoch; with no
            budget, or ``max_time`` alone, :func:`default_eval_every`).
        patience: validations without improvement before stopping (None: never).
        log_every: a training record every N steps.
        until_converged: no budget was given: train until validation stops improving.
    """

    total_steps: int | None
    max_time: float | None
    eval_every: int | None
    patience: int | None
    log_every: int
    until_converged: bool


def resolve_budget(opts: BudgetOptions, steps_per_epoch: int, validates: bool) -> Budget:
    """The :class:`Budget` of ``opts`` for data of ``steps_per_epoch`` steps per epoch
    (``validates``: the run has validation data, so a default patience applies).

    >>> from rnnkit.training.options import TrainOptions
    >>> b = resolve_budget(TrainOptions(epochs=None), 10, validates=True)
    >>> b.until_converged, b.total_steps, b.max_time, b.eval_every, b.patience, b.log_every
    (True, 5000, 3600.0, 1, 100, 1)
    """
    until_converged = opts.steps is None and opts.epochs is None and opts.max_time is None
    eval_every, patience, max_time = opts.eval_every, opts.patience, opts.max_time
    total_steps: int | None
    if opts.steps is not None:
        total_steps = opts.steps
    elif opts.epochs is not None:
        total_steps = opts.epochs * steps_per_epoch
    elif until_converged:
        total_steps = max(CAP_EPOCHS * steps_per_epoch, CAP_MIN_STEPS)
        max_time = CAP_SECONDS
        if eval_every is None:
            eval_every = default_eval_every(steps_per_epoch)
        if patience is None and validates:
            patience = default_patience(steps_per_epoch, eval_every)
    else:
        total_steps = None  # a time budget only
        if eval_every is None:
            # how many epochs fit is unknown: validated once an epoch, a run shorter than
            # one (a large corpus) had a single validation, at its end (no curve, no best)
            eval_every = default_eval_every(steps_per_epoch)
    known = opts.steps is not None or opts.epochs is not None
    log_every = opts.log_every
    if log_every is None:
        log_every = default_log_every(total_steps if known else None, steps_per_epoch)
    elif isinstance(log_every, bool) or log_every < 1:
        # (TrainOptions refuses it when made; the command line checks --log-every first)
        raise ConfigError(f"log_every must be an integer ≥ 1, got {log_every!r}")
    return Budget(total_steps, max_time, eval_every, patience, log_every, until_converged)


def cap_text(total_steps: int, steps_per_epoch: int) -> str:
    """The cap of a run with no budget, for people.

    >>> cap_text(5000, 10)
    '500 epochs (5,000 steps) or 3600 s'
    >>> cap_text(5000, 7)  # the 5,000-step floor of tiny data: epochs to one decimal
    '714.3 epochs (5,000 steps) or 3600 s'
    """
    epochs = total_steps / max(steps_per_epoch, 1)
    # At most 5,000 epochs (the step floor over one-step epochs): 4 digits show them all.
    return f"{epochs:.4g} epochs ({total_steps:,} steps) or {CAP_SECONDS:.0f} s"
