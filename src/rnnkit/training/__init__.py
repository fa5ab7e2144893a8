"""Training: the model-agnostic loop, atomic checkpoints, distributed, schedules and progress.

The ``SCHEDULES`` of ``scheduled_sampling`` and ``schedules`` differ in meaning and stay in
their modules.
"""

from rnnkit.training.baseline_check import (
    HEADLINE,
    LABELS,
    baseline_figures,
    behind_baseline,
    compare,
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
)
from rnnkit.training.distributed import (
    DistContext,
    ShardedBatches,
    StepModule,
    init_distributed,
    shutdown_distributed,
)
from rnnkit.training.loop import (
    CAP_EPOCHS,
    CAP_MIN_STEPS,
    CAP_SECONDS,
    MAX_SCALER_SKIPS,
    Trainer,
    TrainingDiverged,
    TrainingInterrupted,
    TrainOptions,
    TrainResult,
    autocast_setup,
    default_eval_every,
    default_patience,
)
from rnnkit.training.progress import Progress
from rnnkit.training.run_files import METRIC_FIELDS, read_metrics, read_summary
from rnnkit.training.scheduled_sampling import SamplingSchedule, parse_schedule
from rnnkit.training.schedules import LRSchedule, build_lr_schedulers, parse_lr_schedule

__all__ = [
    "CAP_EPOCHS",
    "CAP_MIN_STEPS",
    "CAP_SECONDS",
    "FORMAT_VERSION",
    "HEADLINE",
    "LABELS",
    "MAX_SCALER_SKIPS",
    "METRIC_FIELDS",
    "DistContext",
    "LRSchedule",
    "Progress",
    "SamplingSchedule",
    "ShardedBatches",
    "StepModule",
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
    "compare",
    "default_eval_every",
    "default_patience",
    "dumps_strict",
    "init_distributed",
    "load_arrays",
    "load_model_weights",
    "load_snapshot",
    "parse_lr_schedule",
    "parse_schedule",
    "read_json",
    "read_metrics",
    "read_summary",
    "save_model_weights",
    "save_snapshot",
    "save_tensors",
    "sha256_file",
    "shutdown_distributed",
    "tensors_sha256",
]
