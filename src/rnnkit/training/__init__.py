"""Training: the model-agnostic loop, atomic checkpoints, distributed, schedules and progress.

* ``loop``: the :class:`Trainer`, one step after another, validation and early stopping;
* ``options``: what a run is asked to do and what it did (``TrainOptions``, ``TrainResult``);
* ``budget``: how long a run trains and how often it validates and records;
* ``nonfinite``: a NaN or infinite loss or gradient (stop, skip, float16 overflow);
* ``precision``: autocast and the GradScaler of mixed precision;
* ``snapshots``: what a resumable snapshot holds and how a run resumes from it;
* ``run_log``: ``metrics.jsonl``, ``metrics.csv``, TensorBoard and the ``-v`` lines;
* ``interrupt``: SIGINT and SIGTERM finish the step in flight and save it;
* ``checkpoint``, ``run_files``: atomic files of a run and reading them back;
* ``manifest``: ``manifest.json``, the SHA-256 of every file of a finished run, checked
  on every read;
* ``schedules``, ``scheduled_sampling``, ``distributed``, ``progress``, ``tensorboard``,
  ``baseline_check``: as their names say;
* ``trajectory``: the course of a run (smoothed training loss at the best step and at
  the end), which tells overfitting from underfitting.

The ``SCHEDULES`` of ``scheduled_sampling`` and ``schedules`` differ in meaning and stay in
their modules.
"""

from rnnkit.training.baseline_check import (
    HEADLINE,
    LABELS,
    RunSettings,
    baseline_figures,
    behind_baseline,
    compare,
)
from rnnkit.training.budget import (
    CAP_EPOCHS,
    CAP_MIN_STEPS,
    CAP_SECONDS,
    MIN_GAIN,
    default_eval_every,
    default_log_every,
    default_patience,
    gained,
)
from rnnkit.training.checkpoint import (
    FORMAT_VERSION,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    dumps_strict,
    load_arrays,
    load_model_weights,
    load_snapshot,
    read_json,
    save_model_weights,
    save_snapshot,
    save_tensors,
    sha256_file,
    tensors_sha256,
    utf8_path,
)
from rnnkit.training.distributed import (
    DistContext,
    PeerLost,
    ShardedBatches,
    StepModule,
    init_distributed,
    launched_processes,
    peer_lost,
    peer_lost_said,
    shutdown_distributed,
)
from rnnkit.training.interrupt import (
    TrainingInterrupted,
    hold_sigterm_until_said,
    release_sigterm,
)
from rnnkit.training.loop import Trainer
from rnnkit.training.manifest import (
    MANIFEST,
    MANIFEST_FORMAT,
    RUN_SAVED,
    SKIP_HINT,
    checksums_skipped,
    covered_files,
    saved_files,
    skipping_checksums,
    verify_run,
    write_manifest,
    writing_run,
)
from rnnkit.training.nonfinite import (
    DIVERGED_RISE,
    MAX_SCALER_SKIPS,
    MAX_SKIPPED_STEPS,
    TrainingDiverged,
)
from rnnkit.training.options import TrainOptions, TrainResult
from rnnkit.training.precision import autocast_setup
from rnnkit.training.progress import RATE_KEYS, Progress, postfix
from rnnkit.training.run_files import (
    CSV_FIRST_COLUMNS,
    METRIC_FIELDS,
    metrics_csv,
    read_metrics,
    read_summary,
    write_metrics_csv,
)
from rnnkit.training.run_log import COUNTED, counted, describe_event
from rnnkit.training.scheduled_sampling import SamplingSchedule, parse_schedule
from rnnkit.training.schedules import LRSchedule, build_lr_schedulers, parse_lr_schedule
from rnnkit.training.tensorboard import TensorBoardWriter, require_tensorboard, scalars
from rnnkit.training.trajectory import SMOOTH_RECORDS, run_events, smoothed_loss, trajectory

__all__ = [
    "CAP_EPOCHS",
    "CAP_MIN_STEPS",
    "CAP_SECONDS",
    "COUNTED",
    "CSV_FIRST_COLUMNS",
    "DIVERGED_RISE",
    "FORMAT_VERSION",
    "HEADLINE",
    "LABELS",
    "MANIFEST",
    "MANIFEST_FORMAT",
    "MAX_SCALER_SKIPS",
    "MAX_SKIPPED_STEPS",
    "METRIC_FIELDS",
    "MIN_GAIN",
    "RATE_KEYS",
    "RUN_SAVED",
    "SKIP_HINT",
    "SMOOTH_RECORDS",
    "DistContext",
    "LRSchedule",
    "PeerLost",
    "Progress",
    "RunSettings",
    "SamplingSchedule",
    "ShardedBatches",
    "StepModule",
    "TensorBoardWriter",
    "TrainOptions",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "append_jsonl",
    "atomic_write_bytes",
    "atomic_write_json",
    "autocast_setup",
    "baseline_figures",
    "behind_baseline",
    "build_lr_schedulers",
    "checksums_skipped",
    "compare",
    "counted",
    "covered_files",
    "default_eval_every",
    "default_log_every",
    "default_patience",
    "describe_event",
    "dumps_strict",
    "gained",
    "hold_sigterm_until_said",
    "init_distributed",
    "launched_processes",
    "load_arrays",
    "load_model_weights",
    "load_snapshot",
    "metrics_csv",
    "parse_lr_schedule",
    "parse_schedule",
    "peer_lost",
    "peer_lost_said",
    "postfix",
    "read_json",
    "read_metrics",
    "read_summary",
    "release_sigterm",
    "require_tensorboard",
    "run_events",
    "save_model_weights",
    "save_snapshot",
    "save_tensors",
    "saved_files",
    "scalars",
    "sha256_file",
    "shutdown_distributed",
    "skipping_checksums",
    "smoothed_loss",
    "tensors_sha256",
    "trajectory",
    "utf8_path",
    "verify_run",
    "write_manifest",
    "write_metrics_csv",
    "writing_run",
]
