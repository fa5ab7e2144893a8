"""What a training run is asked to do (:class:`TrainOptions`) and what it did
(:class:`TrainResult`): the arguments and the result of
:meth:`rnnkit.training.loop.Trainer.fit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rnnkit.errors import ConfigError
from rnnkit.training.budget import MIN_GAIN

__all__ = ["TrainOptions", "TrainResult"]


@dataclass(frozen=True)
class TrainOptions:
    """How long and how to train.

    Frozen: a :class:`~rnnkit.training.loop.Trainer` resolves its budget (steps, epochs,
    time, validation and logging intervals) from them when it is made, so a field changed
    afterwards would be ignored; assigning one is an error instead. For another budget,
    make a new ``Trainer`` over the same model and optimizer with
    ``dataclasses.replace(options, steps=...)``.

    Attributes:
        epochs: passes over the training data (ignored when ``steps`` is set). None with
            ``steps`` and ``max_time`` None too: train until validation stops improving
            (see :mod:`rnnkit.training.budget`); None with ``max_time``: until the time is up.
        steps: total optimizer steps, or None to run ``epochs``.
        max_time: stop after this many seconds of training (validate and save first).
        clip_norm: global gradient-norm threshold κ (``g ← κ g / ‖g‖`` if ``‖g‖ > κ``).
        clip_value: clip each gradient entry to ``[−v, v]`` (a separate, named option).
        eval_every: validate every N steps (None: at the end of every epoch, or
            :func:`~rnnkit.training.budget.default_eval_every` when training until validation
            stops improving or for ``max_time`` alone).
        patience: stop after this many validations without improvement (None: never, or
            :func:`~rnnkit.training.budget.default_patience` when training until validation
            stops improving).
        min_gain: what counts as an improvement for ``patience``: a validation loss below
            that of the last improvement by more than this fraction of it, and by this
            many nats at least (below one nat) (0: any fall;
            :func:`~rnnkit.training.budget.gained`, which says why relative). It decides
            the patience only: the best weights kept are the lowest loss's.
        log_every: write a training record to the metrics log (and, with ``-v``, a line to
            stderr) every N steps, and at the last step (None:
            :func:`~rnnkit.training.budget.default_log_every`).
        snapshot_every: seconds at least between two resumable snapshots at validations
            that find no new best (0: a snapshot at every validation). A snapshot is
            always taken where the best weights change, where training ends or stops,
            and at the first validation; a run killed in between resumes from the last
            one and repeats the steps since, which give the same run.
        tensorboard: also write the records as TensorBoard scalars into this directory
            (``rnnkit.training.tensorboard``; needs the ``tensorboard`` package).
        on_nonfinite: ``"stop"`` (default) or ``"skip"`` the step.
        precision: ``"fp32"`` (default), ``"bf16"`` or ``"fp16"``: forward and loss under
            ``torch.autocast`` in that dtype (fp16 with a ``GradScaler``); see the docstring of
            :mod:`rnnkit.training.loop`.
        threads: CPU threads for the run (None: ``RNNKIT_THREADS``, else chosen from the
            CPUs free now and re-checked every few seconds: ``rnnkit.threads``); torch's
            previous count is restored when ``fit`` returns.
        rows: batch rows, which bound the thread count (each thread gets >= 8 rows).
        quiet: no progress bar.
        units: what the progress bar shows besides the loss where it is nats per token
            (``counts="tokens"``): ``"bits"`` or ``"ppl"``.
        counts: what the loss's count (``LossOutput.tokens``) counts — ``"tokens"``,
            ``"examples"`` (a classifier), ``"values"`` (a regressor): the unit of the
            rate the progress bar and the ``-v`` lines show (``examples/s``). A loss of
            ``"tokens"`` or ``"examples"`` is a cross-entropy: one a million times the
            first step's stops training as diverged
            (:data:`~rnnkit.training.nonfinite.DIVERGED_RISE`); a regressor's
            (``"values"``) has its data's scale and is not held to that.
        lr_schedule: ``"constant"``, ``"plateau"``, ``"step:E:F"`` or ``"cosine"``
            (``rnnkit.training.schedules``), built here; None: the ``scheduler`` and
            ``plateau`` given to the ``Trainer``, if any.
        warmup: steps of linear learning-rate warm-up, before ``lr_schedule`` (without
            one: up to the constant rate ``lr``).
        lr_decay: the ``plateau`` schedule's factor.
        init_range: re-initialise every parameter uniformly in ``[−R, R]`` (None: keep
            the model's own initialisation).
        restore_best: at the end of ``fit()``, load the best-on-validation weights into
            the model (those of ``model.safetensors``).
        command_line: made from ``rnnkit train``'s options: errors name those options
            (``--warmup``), not these fields (``warmup``, the default).
    """

    epochs: int | None = 1
    steps: int | None = None
    max_time: float | None = None
    clip_norm: float | None = None
    clip_value: float | None = None
    eval_every: int | None = None
    patience: int | None = None
    min_gain: float = MIN_GAIN
    log_every: int | None = None
    snapshot_every: float = 30.0
    tensorboard: str | None = None
    on_nonfinite: str = "stop"
    precision: str = "fp32"
    threads: int | None = None
    rows: int | None = None
    quiet: bool = False
    units: str = "ppl"
    counts: str = "tokens"
    lr_schedule: str | None = None
    warmup: int = 0
    lr_decay: float = 0.5
    init_range: float | None = None
    restore_best: bool = True
    command_line: bool = False

    def __post_init__(self) -> None:
        _check_options(self)

    def argument(self, name: str) -> str:
        """How an error names the field ``name``: as the user gave it, the command line's
        option or the Python argument.

        >>> cli = TrainOptions(command_line=True)
        >>> TrainOptions().argument("log_every"), cli.argument("log_every")
        ('log_every', '--log-every')
        """
        return "--" + name.replace("_", "-") if self.command_line else name


def given(argument: str, value: Any) -> str:
    """``argument`` and ``value`` as the user wrote them: ``--precision bf16`` for an
    option, ``precision='bf16'`` for a Python argument.

    >>> given("--precision", "bf16"), given("precision", "bf16")
    ('--precision bf16', "precision='bf16'")
    """
    return f"{argument} {value}" if argument.startswith("--") else f"{argument}={value!r}"


# Counts that must be whole and at least 1 when given (None: the default or no limit).
_COUNTS = ("epochs", "steps", "eval_every", "patience", "log_every", "threads", "rows")
# Amounts above 0, or None (finite but for max_time).
_AMOUNTS = ("max_time", "clip_norm", "clip_value", "init_range")
#: ``precision``'s values (``rnnkit.training.precision``).
PRECISIONS = ("fp32", "bf16", "fp16")


def _check_options(options: TrainOptions) -> None:
    """A ``ConfigError`` naming the first field of ``options`` out of its range.

    ``rnnkit train`` checks its own options first; from Python, ``steps=0`` trained
    nothing and returned, ``steps=2.5`` trained 3 steps, ``clip_norm=0`` zeroed every
    gradient and ``-1`` turned it around (an ascent), ``patience=0`` stopped at the
    first validation and ``max_time=nan`` never stopped. What depends on the run (the
    warm-up against its length, the device's autocast) is checked by the ``Trainer``,
    ``on_nonfinite`` where it is read.

    >>> TrainOptions(steps=0)
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: TrainOptions: steps must be an integer ≥ 1 or None, got 0
    """
    # the fields' names from Python; the options' when the command line made them
    where = "" if options.command_line else "TrainOptions: "
    for name in _COUNTS:
        value = getattr(options, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ConfigError(
                f"{where}{options.argument(name)} must be an integer ≥ 1 or None, got {value!r}"
            )
    for name in _AMOUNTS:
        value = getattr(options, name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value > 0  # NaN fails too
            or (value == math.inf and name != "max_time")  # no time limit: inf is fine
        ):
            raise ConfigError(
                f"{where}{options.argument(name)} must be a number > 0 or None, got {value!r}"
            )
    every = options.snapshot_every
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every >= 0:
        raise ConfigError(
            f"{where}{options.argument('snapshot_every')} must be a number of seconds ≥ 0, "
            f"got {every!r}"
        )
    gain = options.min_gain
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain < 1:
        raise ConfigError(
            f"{where}{options.argument('min_gain')} must be a number in [0, 1) (a fraction of "
            f"the validation loss), got {gain!r}"
        )
    decay = options.lr_decay
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ConfigError(f"{where}{options.argument('lr_decay')} must be in (0, 1], got {decay!r}")
    if options.units not in ("ppl", "bits"):
        raise ConfigError(f"{where}units must be 'ppl' or 'bits', got {options.units!r}")
    if options.precision not in PRECISIONS:
        raise ConfigError(
            f"{where}{options.argument('precision')} must be one of {', '.join(PRECISIONS)}, "
            f"got {options.precision!r}"
        )
    warmup = options.warmup
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(
            f"{where}{options.argument('warmup')} must be an integer ≥ 0 (steps), got {warmup!r}"
        )
    if options.lr_schedule is not None:
        from rnnkit.training.schedules import parse_lr_schedule

        parse_lr_schedule(options.lr_schedule, where + options.argument("lr_schedule"))


@dataclass
class TrainResult:
    steps: int
    epochs_done: int
    train_loss_nats: float | None
    best_valid: dict[str, Any] | None
    history: list[dict[str, Any]] = field(default_factory=list)  # last HISTORY_EVENTS
    stopped_early: bool = False
    clipped_steps: int = 0
    tokens: int = 0  # target tokens trained on in this call of fit()
    train_seconds: float = 0.0  # wall time of those steps, validation excluded
    threads: str = ""  # one line: the CPU threads used and why (rnnkit.threads)
    stopped: str = ""  # why training ended, one line ("no improvement for 20 validations")
    first_step: int = 0  # the step this call of fit() began from (resumed: the snapshot's)
    # Events the trainer logged, those beyond ``history`` too (the last lines of its
    # metrics.jsonl); 0: not counted, ``history`` is taken as complete.
    events_logged: int = 0
