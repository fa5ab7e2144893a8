"""``--tensorboard DIR``: the training records as TensorBoard scalars.

Through ``torch.utils.tensorboard.SummaryWriter`` (PyTorch's own writer), which needs the
``tensorboard`` package: the optional extra ``rnnkit[tensorboard]``. Without it,
:func:`require_tensorboard` says so in one line before anything is trained.

Each event of ``metrics.jsonl`` becomes scalars at its step:

==========  ====================================================================
``train``   ``train/loss_nats``, ``train/grad_norm``, ``train/lr`` (the rate that
            step used), ``train/tokens_per_s``, ``train/loss_scale`` (fp16)
``valid``   ``valid/<figure>`` for every number of the validation: ``loss_nats``,
            ``perplexity``, ``bits_per_char``, ``accuracy``, … as the task reports them
==========  ====================================================================

Other events (skipped steps, early stop) are not scalars; ``metrics.jsonl`` keeps them.
A resumed run appends a new event file to the same directory, at the run's own steps.
"""

from __future__ import annotations

import os
from typing import Any

from rnnkit.errors import ConfigError
from rnnkit.training.options import given

__all__ = ["TensorBoardWriter", "require_tensorboard", "scalars"]

MISSING = (
    "{what} needs the tensorboard package: pip install 'rnnkit[tensorboard]' "
    "(or pip install tensorboard)"
)
_TRAIN = ("loss_nats", "grad_norm", "lr", "tokens_per_s", "loss_scale")
_NOT_FIGURES = ("event", "step", "epoch", "best", "lr")


def require_tensorboard(what: str = "TensorBoard logging") -> Any:
    """``torch.utils.tensorboard.SummaryWriter``; a ``ConfigError`` naming the extra when
    the ``tensorboard`` package is missing: ``{what} needs the tensorboard package``
    (``rnnkit train`` says ``--tensorboard``)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch raises ImportError naming tensorboard when it is absent
        raise ConfigError(MISSING.format(what=what)) from None
    return SummaryWriter


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars(event: dict[str, Any]) -> dict[str, float]:
    """The scalars (tag → value) one event of ``metrics.jsonl`` becomes.

    >>> scalars({"event": "train", "step": 4, "loss_nats": 1.5, "lr": 0.01, "clipped_total": 0})
    {'train/loss_nats': 1.5, 'train/lr': 0.01}
    >>> scalars({"event": "valid", "step": 4, "loss_nats": 1.2, "accuracy": 0.5, "best": True})
    {'valid/loss_nats': 1.2, 'valid/accuracy': 0.5}
    """
    kind = event.get("event")
    if kind == "train":
        return {f"train/{k}": float(event[k]) for k in _TRAIN if _number(event.get(k))}
    if kind == "valid":
        return {
            f"valid/{k}": float(v) for k, v in event.items() if k not in _NOT_FIGURES and _number(v)
        }
    return {}


class TensorBoardWriter:
    """Writes each event given to it (``writer(event)``) as scalars under ``log_dir``.

    ``name``: how errors name the setting, the Python argument (``tensorboard='runs'``,
    the default) or ``rnnkit train``'s option (``--tensorboard runs``).

    Raises:
        ConfigError: the ``tensorboard`` package is missing, or ``log_dir`` cannot be a
            directory (an existing file, no permission), named.
    """

    def __init__(self, log_dir: str | os.PathLike[str], name: str = "tensorboard") -> None:
        setting = given(name, str(log_dir))
        summary_writer = require_tensorboard(setting)
        try:
            self.writer = summary_writer(log_dir=str(log_dir))
        except OSError as exc:
            raise ConfigError(f"{setting}: cannot write there ({exc.strerror or exc})") from None

    def __call__(self, event: dict[str, Any]) -> None:
        step = event.get("step")
        if step is None or not _number(step):
            return
        for tag, value in scalars(event).items():
            self.writer.add_scalar(tag, value, global_step=int(step))

    def close(self) -> None:
        self.writer.close()  # flushes the event file
