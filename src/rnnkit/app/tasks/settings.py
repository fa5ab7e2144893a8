"""What a run's configuration sets up before training: the random seed, the device, the
model's specification and the training loop's options (the library never reads a
``TrainConfig``: each of these is the option of its name)."""

from __future__ import annotations

import dataclasses

import torch

from rnnkit.app.config import TrainConfig
from rnnkit.errors import ConfigError
from rnnkit.models.spec import ModelSpec
from rnnkit.training.baseline_check import RunSettings
from rnnkit.training.loop import TrainOptions
from rnnkit.training.run_log import counted

__all__ = [
    "choose_device",
    "device_name",
    "model_spec",
    "run_settings",
    "seed_everything",
    "train_options",
]


def seed_everything(seed: int) -> None:
    """Seed torch's global generator, the one rnnkit draws from (initial weights, dropout,
    sampling). Python's ``random`` and NumPy's global generator are the program's own:
    rnnkit never draws from them (its batch orders have their own generators), and
    reseeding them changed a calling program's streams for nothing."""
    torch.manual_seed(seed)


def choose_device(name: str, argument: str = "device") -> torch.device:
    """The device ``--device`` (``device=`` of ``rnnkit.load``) names; ``auto``: CUDA if
    there is one. A name torch does not know, or CUDA where there is none, is a
    ``ConfigError`` naming it (torch's own message lists every backend it was built
    with, and ``cuda:0`` without CUDA failed only when the weights moved) and the
    ``argument`` it came in: the Python one (``device``, the default) or the option
    (``--device``: a training configuration's, and the command line's).

    >>> choose_device("cpu")
    device(type='cpu')
    >>> choose_device("gpu")
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: device='gpu' is not a device: cpu, cuda, cuda:N or auto
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # as the user wrote it: `--device cuda` on the command line, `device='cuda'` in Python
    option = argument.startswith("--")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        given = f"{argument} {name!r}" if option else f"{argument}={name!r}"
        raise ConfigError(f"{given} is not a device: cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        given = f"{argument} {name}" if option else f"{argument}={name!r}"
        raise ConfigError(f"{given}: no CUDA device is available here")
    return device


def device_name(name: str) -> str:
    """The device ``--device NAME`` trains on, as the summary names it (``cpu``, or
    ``cuda (the card's name)``).

    >>> device_name("cpu")
    'cpu'
    """
    device = choose_device(name, "--device")
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def model_spec(cfg: TrainConfig) -> ModelSpec:
    """The model part of ``cfg`` for the builders of :mod:`rnnkit.models` (which never see
    the configuration: each :class:`~rnnkit.models.spec.ModelSpec` field is the option of
    its name).

    >>> model_spec(TrainConfig(train="x", cell="gru", hidden=8)).hidden
    8
    """
    return ModelSpec(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelSpec)})


def run_settings(cfg: TrainConfig) -> RunSettings:
    """The budget and knobs of ``cfg`` that the behind-the-baseline advice names
    (:class:`~rnnkit.training.baseline_check.RunSettings`: each field the option of its
    name)."""
    return RunSettings(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(RunSettings)})


def train_options(cfg: TrainConfig, quiet: bool, units: str = "ppl") -> TrainOptions:
    """The training loop's options from the command line's config (every task the same).

    >>> train_options(TrainConfig(steps=3), quiet=True).steps
    3
    """
    return TrainOptions(
        epochs=cfg.epochs,
        steps=cfg.steps,
        max_time=cfg.max_time,
        clip_norm=cfg.clip_norm,
        clip_value=cfg.clip_value,
        eval_every=cfg.eval_every,
        patience=cfg.patience,
        min_gain=cfg.min_gain,
        log_every=cfg.log_every,
        snapshot_every=cfg.snapshot_every,
        tensorboard=cfg.tensorboard,
        on_nonfinite=cfg.on_nonfinite,
        precision=cfg.precision,
        threads=cfg.threads,
        rows=cfg.batch_size,
        quiet=quiet,
        units=units,
        counts=counted(cfg.task),
        lr_schedule=cfg.effective_lr_schedule(),
        warmup=cfg.warmup,
        lr_decay=cfg.lr_decay,
        init_range=cfg.init_range,
        command_line=True,  # errors name the options (--warmup), not the fields
    )
