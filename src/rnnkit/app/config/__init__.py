"""The training configuration, split by concern, one module each:

- ``fields``: ``option()``, a dataclass field with its command-line metadata (help,
  choices, the tasks and cells that read it), and the checks it implies;
- ``model``: :class:`ModelOptions`, the cell, its sizes, the embedding, dropout;
- ``data``: :class:`DataOptions`, the files, tokens and sequence lengths;
- ``optim``: :class:`OptimOptions`, optimizer, learning rate, clipping, BPTT, precision,
  and :func:`parse_bptt`;
- ``run``: :class:`RunOptions`, budget, validation, device, records, and
  :data:`RESUME_CHANGEABLE`;
- ``tasks``: the options of one task (lm, classify, tag, seq2seq, regress);
- ``anomaly``: the options of ``events`` and ``params``;
- ``train``: :class:`TrainConfig`, all of them (inherited, so flat: ``cfg.hidden``), its
  checks, ``config.json`` in and out, and the tables :data:`TASK_OPTIONS`,
  :data:`CELL_OPTIONS` and :data:`TASK_DEFAULTS`.

``rnnkit train`` builds its options from these fields (``rnnkit.app.cli.train``): each
help text and choice list is written once, beside its field.
"""

from rnnkit.app.config.anomaly import EventsOptions, ParamsOptions
from rnnkit.app.config.data import BATCH_ORDERS, DOC_BOUNDARIES, UNITS, DataOptions
from rnnkit.app.config.fields import TASKS, TOKEN_TASKS, Option, option
from rnnkit.app.config.model import (
    CELLS,
    NONLINEARITIES,
    REGULARIZERS,
    ModelOptions,
)
from rnnkit.app.config.optim import PRECISIONS, OptimOptions, parse_bptt
from rnnkit.app.config.run import RESUME_CHANGEABLE, RunOptions
from rnnkit.app.config.tasks import (
    CONDITIONS,
    LENGTHS,
    WIRINGS,
    ClassifyOptions,
    LmOptions,
    RegressOptions,
    Seq2seqOptions,
    TagOptions,
)
from rnnkit.app.config.train import (
    CELL_OPTIONS,
    CONCERNS,
    TASK_DEFAULTS,
    TASK_OPTIONS,
    TaskChoice,
    TrainConfig,
    task_defaults,
)

__all__ = [
    "BATCH_ORDERS",
    "CELLS",
    "CELL_OPTIONS",
    "CONCERNS",
    "CONDITIONS",
    "DOC_BOUNDARIES",
    "LENGTHS",
    "NONLINEARITIES",
    "PRECISIONS",
    "REGULARIZERS",
    "RESUME_CHANGEABLE",
    "TASKS",
    "TASK_DEFAULTS",
    "TASK_OPTIONS",
    "TOKEN_TASKS",
    "UNITS",
    "WIRINGS",
    "ClassifyOptions",
    "DataOptions",
    "EventsOptions",
    "LmOptions",
    "ModelOptions",
    "OptimOptions",
    "Option",
    "ParamsOptions",
    "RegressOptions",
    "RunOptions",
    "Seq2seqOptions",
    "TagOptions",
    "TaskChoice",
    "TrainConfig",
    "option",
    "parse_bptt",
    "task_defaults",
]
