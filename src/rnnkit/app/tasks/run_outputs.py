"""What a run writes beside its model: the fitted baseline (``baseline.safetensors``)
and the end-of-run ``summary.json``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file as save_numpy

from rnnkit import messages
from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.settings import device_name, run_settings
from rnnkit.data.files import atomic_write
from rnnkit.errors import CheckpointError
from rnnkit.training.baseline_check import behind_baseline
from rnnkit.training.checkpoint import atomic_write_json, load_arrays
from rnnkit.training.options import TrainResult
from rnnkit.training.run_files import read_metrics
from rnnkit.training.trajectory import run_events, trajectory

__all__ = [
    "BASELINE_FILE",
    "finish_summary",
    "load_baseline",
    "save_baseline",
]


BASELINE_FILE = "baseline.safetensors"


def save_baseline(out: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Write the fitted baseline of a run (``baseline.safetensors``: numpy arrays, no
    pickling), so that ``rnnkit evaluate`` scores it beside the model on new data."""
    atomic_write(Path(out) / BASELINE_FILE, write_path=lambda tmp: save_numpy(arrays, tmp))


def load_baseline(run_dir: str | Path) -> dict[str, np.ndarray] | None:
    """The arrays of ``baseline.safetensors`` (None for a run that has none: one from
    before the file existed). A damaged file is a ``CheckpointError`` naming it."""
    path = Path(run_dir) / BASELINE_FILE
    if not os.path.lexists(path):
        return None
    return load_arrays(path)


def finish_summary(
    cfg: TrainConfig, summary: dict[str, Any], result: TrainResult
) -> dict[str, Any]:
    """Add ``trajectory`` (the course of the run, read from its events:
    :mod:`rnnkit.training.trajectory`), ``behind_baseline`` (the model against its best
    baseline, one line saying why when it is behind:
    :mod:`rnnkit.training.baseline_check`), ``resumed_at`` (a resumed run: the step this
    attempt began from, its time and rate being this attempt's) and write
    ``summary.json``. Returns the summary."""
    # regress trains on its ``loss`` (mse or Gaussian NLL); its ``loss_nats`` differs for mse
    loss_key = "loss" if cfg.task == "regress" else "loss_nats"
    events = _whole_run(Path(cfg.out), result)
    summary["trajectory"] = trajectory(events, (summary.get("valid") or {}).get("step"), loss_key)
    summary["behind_baseline"] = behind_baseline(summary, cfg.task, run_settings(cfg))
    summary["device"] = device_name(cfg.device)
    if result.first_step > 0:  # elapsed_s and tokens_per_s are this attempt's, not the run's
        summary["resumed_at"] = result.first_step
    atomic_write_json(Path(cfg.out) / "summary.json", summary)
    return summary


def _whole_run(out: Path, result: TrainResult) -> list[dict[str, Any]]:
    """The events of the whole run: those in memory when they are all of them; else,
    from ``metrics.jsonl``, those logged before a resume (its unreadable lines skipped)
    and, when the memory kept only the latest events (``HISTORY_EVENTS`` of a long run),
    this attempt's own: its log's last ``result.events_logged`` lines. A log that cannot
    be read, or whose last lines are not the events in memory, leaves the events in
    memory, with a warning."""
    history = result.history
    dropped = result.events_logged > len(history)  # the memory's window begins later
    if result.first_step == 0 and not dropped:
        return history
    left_out = "the course of the run before " + (
        f"its last {len(history):,} events" if dropped else "the resume"
    )
    try:
        logged, _ = read_metrics(out)
    except CheckpointError as exc:
        messages.warning(f"{left_out} is left out: {exc}")
        return history
    if dropped:
        # this attempt's events are the log's last lines, ending with those in memory
        n = result.events_logged
        mine = logged[-n:] if n <= len(logged) else []
        if len(mine) != n or _marks(mine[n - len(history) :]) != _marks(history):
            log = out / "metrics.jsonl"
            messages.warning(f"{left_out} is left out: {log} does not end with this run's events")
            return history
        logged, history = logged[:-n], mine
    else:
        # this attempt's own events follow its mark (the resumed event at its first step),
        # the last such mark in the log: those before it are the earlier attempts'
        mark = {"event": "resumed", "step": result.first_step}
        at = max((i for i, e in enumerate(logged) if e == mark), default=None)
        if at is not None:
            logged = logged[:at]
    return run_events(logged, history, result.first_step)


def _marks(events: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """What tells events apart (their kind and step): the log's copy of an event read
    back is equal to the one in memory but for what JSON cannot hold (a tuple, a NaN)."""
    return [(e.get("event"), e.get("step")) for e in events]
