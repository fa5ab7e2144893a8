"""Which module implements each task: ``rnnkit.app.tasks.<task>`` with ``train``/``evaluate``.

Every task module offers::

    train(cfg: TrainConfig, resume: bool = False, quiet: bool = False) -> dict  # summary
    evaluate(run_dir, data_path: str, batch_size: int | None = None) -> dict     # metrics

so the command line stays one dispatcher (``rnnkit train --task …``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from rnnkit.app.tasks.run import load_config
from rnnkit.errors import ConfigError

__all__ = ["task_module", "task_of_run"]


def task_module(task: str) -> ModuleType:
    """The module implementing ``task``; a clear ``ConfigError`` if there is none."""
    try:
        return importlib.import_module(f"rnnkit.app.tasks.{task}")
    except ModuleNotFoundError as exc:
        if exc.name == f"rnnkit.app.tasks.{task}":
            raise ConfigError(f"--task {task} is not available in this version") from None
        raise


def task_of_run(run_dir: str | Path) -> str:
    """The task a run directory was trained for (from its ``config.json``)."""
    cfg, _ = load_config(run_dir)
    return cfg.task
