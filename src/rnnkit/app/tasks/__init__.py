"""Tasks: the glue from a ``TrainConfig`` to data, model, training loop and metrics.

One module per task (``lm``, ``tag``, ``classify``, ``seq2seq``, ``events``, ``regress``,
``params``), each a :class:`~rnnkit.app.tasks.registry.Task`; ``run`` holds what they
share (run directories, the random seed, the model specification, the training
options); ``registry`` finds a task's module; ``trained`` reloads a finished run for
Python use (``rnnkit.load``).
"""

from rnnkit.app.tasks.registry import Task, check_task_options, task_module, task_of_run
from rnnkit.app.tasks.trained import TrainedRun, load

__all__ = ["Task", "TrainedRun", "check_task_options", "load", "task_module", "task_of_run"]
