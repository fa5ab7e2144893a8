"""The names every task shares, from one place; each is defined in the module of its job:

- :mod:`~rnnkit.app.tasks.settings`: the seed, the device, the model's specification and
  the training loop's options, from the configuration;
- :mod:`~rnnkit.app.tasks.run_config`: ``config.json`` written, read back and checked on
  ``--resume``;
- :mod:`~rnnkit.app.tasks.run_dir`: the run directory refused, locked and guarded;
- :mod:`~rnnkit.app.tasks.run_outputs`: the baseline's file and ``summary.json``;
- :mod:`~rnnkit.app.tasks.pretrained`: ``--pretrained-vectors``.

New code imports from those modules; this one keeps the imports written against it.
"""

from rnnkit.app.tasks.pretrained import load_pretrained_vectors
from rnnkit.app.tasks.run_config import (
    check_count,
    check_labels,
    data_fingerprints,
    load_config,
    resume_data,
    save_config,
)
from rnnkit.app.tasks.run_dir import RUN_FILES, guarded_run, lock_run_dir, prepare_run_dir
from rnnkit.app.tasks.run_outputs import (
    BASELINE_FILE,
    finish_summary,
    load_baseline,
    save_baseline,
)
from rnnkit.app.tasks.settings import (
    choose_device,
    device_name,
    model_spec,
    run_settings,
    seed_everything,
    train_options,
)

__all__ = [
    "BASELINE_FILE",
    "RUN_FILES",
    "check_count",
    "check_labels",
    "choose_device",
    "data_fingerprints",
    "device_name",
    "finish_summary",
    "guarded_run",
    "load_baseline",
    "load_config",
    "load_pretrained_vectors",
    "lock_run_dir",
    "model_spec",
    "prepare_run_dir",
    "resume_data",
    "run_settings",
    "save_baseline",
    "save_config",
    "seed_everything",
    "train_options",
]
