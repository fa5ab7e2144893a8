"""Which module implements each task: ``rnnkit.app.tasks.<task>``, a :class:`Task`.

Every task module offers the three functions of :class:`Task` (``train``, ``evaluate``,
``predictor``), so the command line stays one dispatcher (``rnnkit train --task …``,
``rnnkit evaluate``, ``rnnkit predict``) and a new task is one new module.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol, cast

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run_config import load_config
from rnnkit.errors import ConfigError
from rnnkit.training.distributed import launched_processes

__all__ = [
    "DISTRIBUTED_TASKS",
    "Task",
    "check_processes",
    "check_task_options",
    "task_module",
    "task_of_run",
]

# The tasks whose training runs data-parallel over torchrun's processes. Any other task
# launched by torchrun would train once in EVERY process, each writing the same run
# directory (two summaries, a manifest that no longer matches the files): refused.
DISTRIBUTED_TASKS = ("lm",)


class Task(Protocol):
    """What a task module offers (the module itself satisfies it: no class to register).

    ``train`` writes the run directory ``cfg.out`` (model, vocabularies, ``config.json``,
    ``metrics.jsonl``, ``summary.json``) and returns the summary; ``evaluate`` returns the
    metrics of a finished run on another file; ``predictor`` loads a run once and returns
    a function from a batch of input lines to one JSON-able answer per line (``rnnkit
    predict``), with task-specific keyword options (``beam``, ``top``, ...) that other
    tasks ignore.
    """

    def train(
        self, cfg: TrainConfig, resume: bool = False, quiet: bool = False, overwrite: bool = False
    ) -> dict[str, Any]:
        """Train ``cfg.task`` as ``cfg`` says; the summary. ``overwrite``: replace a run
        already in ``cfg.out`` (:func:`rnnkit.app.tasks.run_dir.guarded_run` adds it)."""
        ...

    def evaluate(
        self,
        run_dir: str | Path,
        data_path: str,
        batch_size: int | None = None,
        device: str = "cpu",
    ) -> dict[str, Any]:
        """The metrics of the run in ``run_dir`` on the file ``data_path``, its model on
        ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``)."""
        ...

    def predictor(
        self,
        run_dir: str | Path,
        batch_size: int | None = None,
        device: str = "cpu",
        **options: Any,
    ) -> Any:
        """A function answering batches of input lines with the run in ``run_dir``, its
        model on ``device``."""
        ...


def task_module(task: str) -> Task:
    """The module implementing ``task``; a clear ``ConfigError`` if there is none."""
    try:
        module = importlib.import_module(f"rnnkit.app.tasks.{task}")
    except ModuleNotFoundError as exc:
        if exc.name == f"rnnkit.app.tasks.{task}":
            raise ConfigError(f"--task {task} is not available in this version") from None
        raise
    return cast(Task, module)  # structural: tests/app/tasks/test_registry.py checks each


def check_processes(task: str) -> None:
    """A ``ConfigError`` when ``task`` is launched on several processes (torchrun) but
    trains in one only (not in :data:`DISTRIBUTED_TASKS`)."""
    processes = launched_processes()
    if processes > 1 and task not in DISTRIBUTED_TASKS:
        raise ConfigError(
            f"--task {task} trains in one process only, and torchrun started {processes}; "
            f"run it without torchrun (or with --nproc-per-node 1). Distributed training: "
            f"--task {', '.join(DISTRIBUTED_TASKS)}"
        )


def check_task_options(task: str, cfg: TrainConfig) -> None:
    """A ``ConfigError`` naming the option when ``cfg`` holds a bad value of ``task``'s own
    options (those of ``events`` and ``params``); tasks without their own: nothing."""
    check = getattr(task_module(task), "options", None)  # optional: not part of Task
    if check is not None:
        check(cfg)


def task_of_run(run_dir: str | Path) -> str:
    """The task a run directory was trained for (from its ``config.json``)."""
    cfg, _ = load_config(run_dir)
    return cfg.task
