"""Tasks: the glue from a ``TrainConfig`` to data, model, training loop and metrics.

One module per task (``lm``, ``tag``, ``classify``, ``seq2seq``, ``regress``; ``events``
and ``params`` are packages of one module per job), each a
:class:`~rnnkit.app.tasks.registry.Task`; beside their task, ``lm_data`` (a language
model's corpora, read and batched as ``--bptt`` says), ``lm_text`` (a trained LM's
prompts, samples and per-line scores), ``tag_data`` (a tagger's vocabularies and encoded
sentences), ``tag_metrics`` (its metrics and the most-frequent-tag baseline),
``seq2seq_data`` (a transducer's pairs, vocabularies, model and loading),
``seq2seq_decode`` (its decoding, output metrics and baselines) and ``seq2seq_generate``
(its outputs for ``rnnkit generate --input``). What the tasks share, one job a module:
``settings`` (the random seed, the device, the model specification, the training
options), ``run_config`` (``config.json`` and what ``--resume`` checks), ``run_dir`` (the
run directory refused, locked and guarded), ``run_outputs`` (the baseline's file,
``summary.json``) and ``pretrained`` (``--pretrained-vectors``), all importable from
``run`` too; ``fitting`` (resume checks, the optimizer, running the Trainer, the common
summary) and ``figures`` (loss and per-class figures); ``registry`` finds a task's module;
``trained`` reloads a finished run for Python use (``rnnkit.load``).
"""

from rnnkit.app.tasks.registry import Task, check_task_options, task_module, task_of_run
from rnnkit.app.tasks.trained import TrainedRun, load

__all__ = ["Task", "TrainedRun", "check_task_options", "load", "task_module", "task_of_run"]
