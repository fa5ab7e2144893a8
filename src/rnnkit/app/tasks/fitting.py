"""Training a task's model with the shared loop: what may change on ``--resume``, the
optimizer, running the :class:`~rnnkit.training.loop.Trainer` into the run directory, and
the ``summary.json`` fields every task shares."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from rnnkit.app.config import RESUME_CHANGEABLE, TrainConfig
from rnnkit.app.tasks.run_config import load_config
from rnnkit.app.tasks.settings import train_options
from rnnkit.errors import CheckpointError
from rnnkit.models.language_model import LossOutput
from rnnkit.training.loop import Trainer, TrainResult

__all__ = ["check_resume", "check_unchanged", "fit", "make_optimizer", "run_summary"]


def check_unchanged(cfg: TrainConfig, saved: TrainConfig, out: Path) -> None:
    """``--resume`` may change how long and where to train, never what is trained: a
    ``CheckpointError`` naming the options of ``cfg`` that differ from the run's ``saved``
    configuration otherwise."""
    # ``out`` is where the run is now (it may have been moved since); train/valid are
    # checked by content (tasks.run_config.resume_data), so may be renamed.
    allowed = RESUME_CHANGEABLE | {"out", "train", "valid"}
    old = saved.to_dict()
    # An option the run does not read is not what is trained (config.json leaves it out;
    # an older run's file holds whatever value it was given, a tagger's "bidirectional").
    bad = [
        k
        for k, v in cfg.to_dict().items()
        if old.get(k) != v and k not in allowed and cfg.applies(k)
    ]
    if bad:
        raise CheckpointError(
            f"{out / 'config.json'}: --resume with different options {bad} "
            "(checkpoint of an incompatible config)"
        )


def check_resume(cfg: TrainConfig, out: Path) -> None:
    """``--resume`` may change how long and where to train, never what is trained."""
    saved, _ = load_config(out)
    if saved.task != cfg.task:
        raise CheckpointError(f"{out / 'config.json'}: task is {saved.task!r}, not {cfg.task!r}")
    check_unchanged(cfg, saved, out)


def make_optimizer(cfg: TrainConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Adam or SGD (the learning-rate schedule, ``--lr-schedule``, is the Trainer's)."""
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr)


# The model a step function and an evaluation of fit() receive.
_M = TypeVar("_M", bound=nn.Module)


def fit(
    cfg: TrainConfig,
    model: _M,
    batches: Any,
    step_fn: Callable[[_M, Any, Any], LossOutput],
    evaluate_fn: Callable[[_M], dict[str, Any]],
    resume: bool,
    quiet: bool,
    callbacks: Any = None,
) -> tuple[TrainResult, float]:
    """Run the shared training loop into ``cfg.out``; return the result and seconds spent."""
    optimizer = make_optimizer(cfg, model)
    trainer = Trainer(
        model,
        optimizer,
        batches,
        step_fn,
        train_options(cfg, quiet),
        evaluate_fn=evaluate_fn,
        out_dir=cfg.out,
        callbacks=callbacks,
    )
    if resume:
        trainer.resume()
    started = time.perf_counter()
    result = trainer.fit()
    return result, time.perf_counter() - started


def run_summary(
    task: str, result: TrainResult, elapsed: float, model: nn.Module, **extra: Any
) -> dict[str, Any]:
    """The ``summary.json`` fields every supervised task shares."""
    train_events = [e for e in result.history if e["event"] == "train"]
    return {
        "task": task,
        "steps": result.steps,
        "threads": result.threads,
        "epoch": result.epochs_done,
        "elapsed_s": elapsed,
        "train_loss_nats": result.train_loss_nats,
        "tokens_per_s": float(np.median([e["tokens_per_s"] for e in train_events]))
        if train_events
        else None,
        "valid": result.best_valid,
        "clipped_steps": result.clipped_steps,
        "stopped_early": result.stopped_early,
        "stopped": result.stopped,
        "parameters": sum(p.numel() for p in model.parameters()),
        **extra,
    }
