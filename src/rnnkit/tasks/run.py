"""What every task's run shares: the config file, device choice, seeding, loop options."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rnnkit.config import TrainConfig
from rnnkit.errors import CheckpointError, ConfigError
from rnnkit.training.checkpoint import FORMAT_VERSION, atomic_write_json, read_json
from rnnkit.training.loop import TrainOptions

__all__ = [
    "check_count",
    "choose_device",
    "load_config",
    "save_config",
    "seed_everything",
    "train_options",
    "warn",
]


def warn(message: str) -> None:
    """A one-line notice for the user on stderr (library code stays silent otherwise)."""
    print(f"rnnkit: warning: {message}", file=sys.stderr)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available here")
    return torch.device(name)


def save_config(out_dir: Path, cfg: TrainConfig, **info: Any) -> None:
    atomic_write_json(
        out_dir / "config.json",
        {"format_version": FORMAT_VERSION, "config": cfg.to_dict(), **info},
    )


def load_config(run_dir: str | Path, task: str | None = None) -> tuple[TrainConfig, dict[str, Any]]:
    """Read ``config.json`` of a run directory; errors name the file. With ``task``, a run
    of another task is a ``CheckpointError`` too."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such checkpoint directory")
    path = run_dir / "config.json"
    data = read_json(path)
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an rnnkit checkpoint of format {FORMAT_VERSION}")
    try:
        cfg = TrainConfig.from_dict(data.get("config"), where=str(path))
    except ConfigError as exc:
        raise CheckpointError(str(exc)) from None
    if task is not None and cfg.task != task:
        raise CheckpointError(f"{path}: task is {cfg.task!r}, not {task!r}")
    return cfg, data


def check_count(path: Path, count: int | None, noun: str, info: dict[str, Any], key: str) -> None:
    """``count`` (what ``path`` holds) must equal ``info[key]`` (what config.json says)."""
    if info.get(key) != count:
        raise CheckpointError(f"{path}: {count} {noun} but config.json says {info.get(key)}")


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
        on_nonfinite=cfg.on_nonfinite,
        precision=cfg.precision,
        threads=cfg.threads,
        rows=cfg.batch_size,
        quiet=quiet,
        units=units,
        lr_schedule=cfg.effective_lr_schedule(),
        warmup=cfg.warmup,
        lr_decay=cfg.lr_decay,
        init_range=cfg.init_range,
    )


def load_pretrained_vectors(
    cfg: TrainConfig, embedding: torch.nn.Embedding, tokens: list[str]
) -> dict[str, Any] | None:
    """``--pretrained-vectors FILE``: copy the vector of every token of ``tokens`` (the
    vocabulary, index order) found in the file into its row of ``embedding``; the other
    rows keep their initialisation. Returns ``{"file", "found", "vocabulary"}`` (None
    without the option) and says it on stderr."""
    if cfg.pretrained_vectors is None:
        return None
    from rnnkit.data.word_vectors import read_word_vectors

    dim = embedding.embedding_dim
    vectors = read_word_vectors(cfg.pretrained_vectors, dim, tokens)
    found = 0
    with torch.no_grad():
        for index, token in enumerate(tokens):
            vector = vectors.get(token)
            if vector is not None:
                embedding.weight[index] = torch.from_numpy(vector).to(embedding.weight)
                found += 1
    print(
        f"rnnkit: pretrained vectors: {found} of {len(tokens)} vocabulary words found in "
        f"{cfg.pretrained_vectors}",
        file=sys.stderr,
    )
    return {"file": cfg.pretrained_vectors, "found": found, "vocabulary": len(tokens)}
