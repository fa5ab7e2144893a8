"""Training: the model-agnostic loop, atomic checkpoints, distributed and scheduled sampling."""

from rnnkit.training.checkpoint import (
    FORMAT_VERSION,
    atomic_write_bytes,
    atomic_write_json,
    load_model_weights,
    load_snapshot,
    read_json,
    save_model_weights,
    save_snapshot,
    sha256_file,
)
from rnnkit.training.distributed import (
    DistContext,
    ShardedBatches,
    StepModule,
    init_distributed,
    shutdown_distributed,
)
from rnnkit.training.loop import (
    MAX_SCALER_SKIPS,
    Trainer,
    TrainingDiverged,
    TrainingInterrupted,
    TrainOptions,
    TrainResult,
    autocast_setup,
)
from rnnkit.training.scheduled_sampling import SCHEDULES, SamplingSchedule, parse_schedule

__all__ = [
    "FORMAT_VERSION",
    "MAX_SCALER_SKIPS",
    "SCHEDULES",
    "DistContext",
    "SamplingSchedule",
    "ShardedBatches",
    "StepModule",
    "TrainOptions",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "atomic_write_bytes",
    "atomic_write_json",
    "autocast_setup",
    "init_distributed",
    "load_model_weights",
    "load_snapshot",
    "parse_schedule",
    "read_json",
    "save_model_weights",
    "save_snapshot",
    "sha256_file",
    "shutdown_distributed",
]
