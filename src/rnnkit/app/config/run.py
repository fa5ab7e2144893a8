"""The run's options: how long to train, where, with what randomness, and what is
recorded on the way. Most of them may change on ``--resume`` (:data:`RESUME_CHANGEABLE`):
they say how long, where and how verbosely to train, never what is trained."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from rnnkit.app.config.fields import option, option_of

__all__ = ["RESUME_CHANGEABLE", "RunOptions"]


@dataclass(kw_only=True)
class RunOptions:
    """The run directory, the budget, validation, the device and the records."""

    title: ClassVar[str] = "run"

    out: str = option(
        "runs/default",
        command_line=None,  # required on the command line (here or in --config)
        help="run directory for checkpoints and reports (required, here or in --config)",
    )
    # No budget (epochs, steps and max_time all None: the command line's default): train
    # until validation stops improving (rnnkit.training.loop).
    epochs: int | None = option(
        1,
        command_line=None,
        positive=True,
        resume=True,
        help="passes over the data (default, with no --steps or --max-time either: train "
        "until validation stops improving, validating ~10 times per epoch, with a cap of "
        "100 epochs or an hour; see docs/training.md)",
    )
    steps: int | None = option(
        None, positive=True, resume=True, help="optimizer steps (overrides --epochs)"
    )
    max_time: float | None = option(
        None,
        resume=True,
        help="stop after this many seconds of training (then validate and save)",
    )
    eval_every: int | None = option(
        None,
        positive=True,
        resume=True,
        help="validate every N steps (default: each epoch; with no budget, or --max-time "
        "alone, about 10 times an epoch)",
    )
    patience: int | None = option(
        None,
        positive=True,
        resume=True,
        help="early stop after N validations without gain",
    )
    # TrainOptions.min_gain's default (rnnkit.training.budget.MIN_GAIN: torch's threshold)
    min_gain: float = option(
        1e-4,
        metavar="F",
        resume=True,
        help="what counts as a gain for --patience: a validation loss below that of the "
        "last gain by more than this fraction of it, and by this many nats at least "
        "below one nat; 0: any fall (default %(default)s). The best weights are the "
        "lowest loss's whatever it is",
    )
    seed: int = option(0, help="random seed")
    device: str = option(
        "cpu",
        choices=("cpu", "cuda", "auto"),
        resume=True,
        help="where the model computes: cpu, cuda (a GPU), auto (a GPU when there is one) "
        "(default %(default)s)",
    )
    # None: from RNNKIT_THREADS, else chosen by load
    threads: int | None = option(
        None,
        resume=True,
        help="CPU threads to train with (default: RNNKIT_THREADS, else chosen from the CPUs "
        "free now, the cgroup quota and the batch size, and re-checked as the load changes)",
    )
    log_every: int | None = option(
        None,
        metavar="N",
        positive=True,
        resume=True,
        help="steps between training records in metrics.jsonl (and lines with -v); "
        "default: every ⌊steps/50⌋ steps, 1 to 50, when the run's length is known "
        "(--steps, --epochs), else every ⌈S/20⌉ for S steps per epoch, 1 to 50",
    )
    snapshot_every: float = option(
        30.0,
        metavar="SECONDS",
        resume=True,
        help="seconds at least between two resumable snapshots at validations that find "
        "no new best; 0: at every validation (default %(default)s). A new best, the end "
        "of training and Ctrl-C always take one",
    )
    tensorboard: str | None = option(
        None,
        metavar="DIR",
        resume=True,
        help="also write the training records and validation figures as TensorBoard "
        "scalars into DIR (train/loss_nats, train/lr, valid/…; needs the extra: "
        "pip install 'rnnkit[tensorboard]')",
    )


#: The options ``--resume`` may change (those declared with ``resume=True``): how long,
#: where and how verbosely to train, never what is trained. Every task checks its saved
#: config against this one set.
RESUME_CHANGEABLE: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(RunOptions) if option_of(f).resume
)
