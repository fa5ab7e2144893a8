"""The optimisation's options: optimizer, learning rate and its schedule, clipping,
batches and backpropagation through time, precision."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rnnkit.app.config.fields import option
from rnnkit.errors import ConfigError

__all__ = ["PRECISIONS", "OptimOptions", "parse_bptt"]

PRECISIONS = ("fp32", "bf16", "fp16")


def parse_bptt(spec: str) -> tuple[str, int | None]:
    """``"full"`` → ("full", None); ``"segment:K"`` / ``"window:K"`` → (mode, K ≥ 1).

    >>> parse_bptt("segment:64")
    ('segment', 64)
    """
    if spec == "full":
        return "full", None
    mode, _, k = spec.partition(":")
    if mode not in ("segment", "window") or not k:
        raise ConfigError(f"--bptt must be full, segment:K or window:K, got {spec!r}")
    try:
        value = int(k)
    except ValueError:
        raise ConfigError(f"--bptt {mode}:K needs an integer K, got {k!r}") from None
    if value < 1:
        raise ConfigError(f"--bptt {mode}:K needs K ≥ 1, got {value}")
    return mode, value


@dataclass(kw_only=True)
class OptimOptions:
    """How the parameters are fitted: every step's batch, gradient and update."""

    title: ClassVar[str] = "optimisation"

    batch_size: int = option(32, positive=True, help="batch size B")
    optimizer: str = option(
        "adam",
        choices=("adam", "sgd"),
        help="adam (default) or sgd with learning-rate decay on plateau",
    )
    lr: float = option(2e-3, help="learning rate (default %(default)s)")
    lr_decay: float = option(
        0.5,
        help="--lr-schedule plateau: factor applied when validation stops improving "
        "(default %(default)s)",
    )
    # None: by optimizer (effective_lr_schedule)
    lr_schedule: str | None = option(
        None,
        metavar="constant|plateau|step:E:F|cosine",
        help="learning-rate schedule: constant; plateau (multiply by --lr-decay when "
        "validation stops improving); step:E:F (multiply by F at the end of epoch E and of "
        "every later epoch, e.g. step:4:0.5); cosine (down to 0 over --steps/--epochs). "
        "Default: plateau with --optimizer sgd, constant with adam",
    )
    warmup: int = option(
        0,
        metavar="N",
        help="raise the learning rate linearly over the first N steps (default 0)",
    )
    init_range: float | None = option(
        None,
        metavar="R",
        help="initialise every parameter uniformly in [-R, R] (default: each layer's own "
        "initialisation)",
    )
    # (--no-clip, a command-line switch, sets it to None.)
    clip_norm: float | None = option(
        5.0, help="clip the global gradient norm to this (default %(default)s)"
    )
    clip_value: float | None = option(None, help="clip each gradient entry to [-v, v]")
    loss_reduction: str = option(
        "token",
        choices=("token", "sequence"),
        tasks=("lm", "tag", "seq2seq", "events"),
        help="how the training loss averages: every target token weighs the same (token, "
        "default) or every sequence (sequence: the mean within each, then over them); the "
        "figures reported stay per token",
    )
    bptt: str = option(
        "segment:64",
        tasks=("lm", "events"),
        help="full | segment:K (state carried across every K-th step, gradient cut there; "
        "lm: streams) | window:K (exact windowed BPTT(K): the loss at step t reaches steps "
        "t-K..t); default %(default)s",
    )
    precision: str = option(
        "fp32",
        choices=PRECISIONS,
        help="fp32 (default), or mixed precision: forward and loss under torch.autocast "
        "in bf16 or fp16 (fp16 with a GradScaler); the recurrence itself stays float32",
    )
    on_nonfinite: str = option(
        "stop",
        choices=("stop", "skip"),
        help="a NaN or inf loss or gradient: stop training (default; the checkpoint keeps "
        "the last good state) or skip that step; either way the step and batch are named",
    )

    def effective_lr_schedule(self) -> str:
        """``--lr-schedule``, or its default: ``plateau`` with SGD, ``constant`` with Adam."""
        if self.lr_schedule is not None:
            return self.lr_schedule
        return "plateau" if self.optimizer == "sgd" else "constant"
