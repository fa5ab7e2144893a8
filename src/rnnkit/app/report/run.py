"""What the report reads from a run directory: its configuration (required), its summary
and its logged events (optional; a bad log line is counted, never fatal)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rnnkit.app.config import TrainConfig
from rnnkit.app.tasks.run_config import load_config
from rnnkit.data.files import sha256_file
from rnnkit.training.run_files import read_metrics, read_summary
from rnnkit.training.trajectory import run_events

__all__ = ["Run", "data_file", "data_files", "last_step", "read_run"]


@dataclass
class Run:
    """What the report reads from a run directory."""

    path: Path
    cfg: TrainConfig
    info: dict[str, Any]
    summary: dict[str, Any]
    events: list[dict[str, Any]]
    bad_lines: int = 0
    notes: list[str] = field(default_factory=list)
    device: str = "cpu"  # where the report's model computes (rnnkit report --device)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


def read_run(run_dir: str | Path) -> Run:
    """Config (required), summary and logged events (optional) of a run directory."""
    path = Path(run_dir)
    cfg, info = load_config(path)
    # One set of rules for the logs (training.run_files): a tampered summary is one line;
    # a bad log line (cut by a crash, wrong types) is counted and shown, never fatal.
    summary = read_summary(path)
    events, bad = read_metrics(path)
    # An attempt killed past its last snapshot logged steps that the resumed attempt
    # trained again: the run's course is the later attempt's (no step drawn twice).
    events = run_events(events, [])
    notes = []
    steps, last = summary.get("steps"), last_step(events)
    if isinstance(steps, int) and last is not None and last > steps:
        # resumed past the end its summary.json tells, then stopped before a new one (a
        # Ctrl-C): that summary is an earlier attempt's
        notes.append(
            f"summary.json is that of an earlier attempt, which ended at step {steps:,}; the "
            f"run went on to step {last:,} and stopped before writing another: the figures "
            "below are from its log."
        )
        summary = {}
    return Run(path, cfg, info, summary, events, bad, notes)


def last_step(events: list[dict[str, Any]]) -> int | None:
    """The last step any event names (None: none does)."""
    steps = [e["step"] for e in events if isinstance(e.get("step"), int)]
    return max(steps, default=None)


def data_file(run: Run, key: str) -> list[Path]:
    """Where the run's ``key`` file (``"train"`` or ``"valid"``) may be, the places that
    exist: the absolute path ``config.json`` recorded, as given, in the run directory.
    The recorded path first: a report made from another directory found no relative
    ``--valid`` and left out the sections that read it."""
    name = getattr(run.cfg, key)
    if not name:
        return []
    candidates = [Path(name), run.path / name]
    record = run.info.get("data")
    recorded = record.get(key) if isinstance(record, dict) else None
    if isinstance(recorded, dict) and isinstance(recorded.get("path"), str):
        candidates.insert(0, Path(recorded["path"]))
    found: list[Path] = []
    for c in candidates:
        if c.exists() and not any(c.resolve() == f.resolve() for f in found):
            found.append(c)
    if isinstance(recorded, dict) and {"size", "sha256"} <= set(recorded):
        same = [f for f in found if _is_recorded(f, recorded)]
        if found and not same:  # edited since training: its pictures would be of other data
            text = (
                f"The {key} file ({found[0]}) has changed since training (its size or "
                "SHA-256 differs from the run's record); the sections that read it are left out."
            )
            if text not in run.notes:
                run.notes.append(text)
        found = same
    return found


def _is_recorded(path: Path, recorded: dict[str, Any]) -> bool:
    """Whether ``path`` holds the content training recorded (size, then SHA-256)."""
    try:
        stat = path.stat()
        if not path.is_file() or stat.st_size != recorded["size"]:
            return False
        return _sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns) == recorded["sha256"]
    except OSError:
        return False


@functools.lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """A file's SHA-256, once per content the report reads (several sections ask)."""
    return sha256_file(path)


def data_files(run: Run) -> list[Path]:
    """The run's validation file, then its training file, where they can be found
    (:func:`data_file`: the first place of each)."""
    return [places[0] for places in (data_file(run, "valid"), data_file(run, "train")) if places]
