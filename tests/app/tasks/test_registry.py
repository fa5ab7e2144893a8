"""Every task module is a ``Task``: the functions the command line calls, with the
parameters it passes (checked on the signatures, so a task that drops one fails here
rather than at a user's ``rnnkit predict``)."""

from __future__ import annotations

import inspect

import pytest

from rnnkit.app.config import TASKS
from rnnkit.app.tasks.registry import DISTRIBUTED_TASKS, Task, check_processes, task_module
from rnnkit.errors import ConfigError


def _accepts(function: object, positional: int, keywords: tuple[str, ...]) -> bool:
    """Whether ``function`` takes ``positional`` positional arguments and ``keywords``."""
    signature = inspect.signature(function)  # type: ignore[arg-type]
    try:
        signature.bind(*range(positional), **dict.fromkeys(keywords))
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("task", TASKS)
def test_every_task_module_offers_the_protocol(task: str) -> None:
    module = task_module(task)
    assert _accepts(module.train, 1, ("resume", "quiet"))  # the task's own function
    train = inspect.signature(module.train, follow_wrapped=False)
    assert "overwrite" in train.parameters  # added by guarded_run around it
    assert _accepts(module.evaluate, 2, ("batch_size",))
    # The command line passes its own options to any predictor; others must be ignored.
    assert _accepts(module.predictor, 1, ("batch_size", "beam", "max_length", "top"))
    protocol = {n for n, _ in inspect.getmembers(Task, inspect.isfunction) if n[0] != "_"}
    assert protocol == {"train", "evaluate", "predictor"}


def test_the_check_sees_a_missing_parameter() -> None:
    def train(cfg: object) -> dict[str, object]:
        return {}

    assert not _accepts(train, 1, ("resume", "quiet"))


def test_task_options_are_checked_where_a_task_has_them() -> None:
    from rnnkit.app.config import TrainConfig
    from rnnkit.app.tasks.registry import check_task_options

    check_task_options("lm", TrainConfig(train="x"))  # no options of its own: nothing
    with pytest.raises(ConfigError, match="--target-fpr"):
        check_task_options("events", TrainConfig(train="x", target_fpr=2.0))


def test_an_unknown_task_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="--task nope is not available"):
        task_module("nope")


@pytest.mark.parametrize("task", TASKS)
def test_under_torchrun_only_the_distributed_tasks_train(task: str, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    check_processes(task)  # one process: every task
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_processes(task)
    monkeypatch.setenv("WORLD_SIZE", "2")
    if task in DISTRIBUTED_TASKS:
        check_processes(task)
    else:
        with pytest.raises(ConfigError, match=f"--task {task} trains in one process only"):
            check_processes(task)
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        check_processes(task)
