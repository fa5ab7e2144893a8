"""The logs of a run directory, read by one set of rules: ``summary.json`` and
``metrics.jsonl``; and ``metrics.csv``, the same events as a table.

Both are read as run files (:func:`rnnkit.data.files.read_run_file`: a regular file of
bounded size) and as strict JSON with bounded nesting (:func:`rnnkit.data.limits.loads_json`).
Then the fields a reader uses are checked for their types, so that a tampered or damaged
file is one line naming it (``summary.json``) or a skipped, counted line
(``metrics.jsonl``, which a crash may cut at its end) — never a traceback further on.

=================  =============================================================
``summary.json``   a JSON object; ``steps``, ``epoch``, ``parameters``,
                   ``clipped_steps`` integers or null; ``elapsed_s``,
                   ``tokens_per_s``, ``train_loss_nats`` numbers or null;
                   ``valid`` and ``ngram`` objects (or null) whose metrics
                   (:data:`METRIC_FIELDS`) are numbers or null; ``baselines``
                   an object of such objects (``kind`` a string);
                   ``behind_baseline`` null or an object with a string ``line``
a line of          a JSON object with a string ``event``; ``step``,
``metrics.jsonl``  ``clipped_total`` integers ≥ 0; ``best`` a boolean; metrics
                   (:data:`METRIC_FIELDS`) and ``grad_norm`` numbers or null
=================  =============================================================

``metrics.csv`` is derived, never read back: :func:`write_metrics_csv` writes the events of
``metrics.jsonl`` that follow these rules, one row each, atomically (a reader sees the
previous table or the new one). The columns are ``event``, ``step``, ``epoch``, then every
other field in the order it first appears; a field an event does not have (or a null) is
an empty cell; numbers are written as in the JSON (``repr``: the same float back), booleans
``true``/``false``, a nested value as its JSON text.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from rnnkit.data.files import atomic_write_bytes, read_run_file
from rnnkit.data.limits import loads_json
from rnnkit.errors import CheckpointError, DataError
from rnnkit.training.checkpoint import read_json
from rnnkit.training.trajectory import run_events

__all__ = [
    "CSV_FIRST_COLUMNS",
    "METRIC_FIELDS",
    "metrics_csv",
    "read_metrics",
    "read_summary",
    "write_metrics_csv",
]

# Fields that are numbers (or null) wherever they appear in a run's logs.
METRIC_FIELDS = (
    "loss_nats",
    "perplexity",
    "bits_per_char",
    "accuracy",
    "macro_f1",
    "span_f1",
    "exact_match",
    "token_error_rate",
    "character_error_rate",
    "bleu",
    "oov_accuracy",
    "mse",
    "tokens",
    "lr",
    "grad_norm",
    "elapsed_s",
)
_INT_FIELDS = ("steps", "epoch", "parameters", "clipped_steps", "resumed_at")
_NUMBER_FIELDS = ("elapsed_s", "tokens_per_s", "train_loss_nats")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _metrics_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with the metrics of one evaluation (None: nothing)."""
    for key in METRIC_FIELDS:
        if key in obj and obj[key] is not None and not _is_number(obj[key]):
            return f"{key} must be a number, got {type(obj[key]).__name__}"
    for key in ("step", "order", "epoch"):
        if key in obj and obj[key] is not None and not (_is_int(obj[key]) and obj[key] >= 0):
            return f"{key} must be an integer ≥ 0, got {obj[key]!r}"[:120]
    return None


def read_summary(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """``summary.json`` of a run, checked ({} when there is none: a run cut short).

    Raises:
        CheckpointError: not a file, too large, not strict JSON, nested too deeply, or a
            field of the wrong type; one line naming the file.
    """
    path = Path(run_dir) / "summary.json"
    if not os.path.lexists(path):
        return {}
    doc = read_json(path)
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    for key in _INT_FIELDS:
        if doc.get(key) is not None and not _is_int(doc[key]):
            raise CheckpointError(f"{path}: {key} must be an integer, got {doc[key]!r}"[:200])
    for key in _NUMBER_FIELDS:
        if doc.get(key) is not None and not _is_number(doc[key]):
            raise CheckpointError(f"{path}: {key} must be a number, got {doc[key]!r}"[:200])
    for key in ("valid", "ngram"):
        part = doc.get(key)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise CheckpointError(f"{path}: {key} must be an object, got {type(part).__name__}")
        problem = _metrics_problem(part)
        if problem:
            raise CheckpointError(f"{path}: {key}: {problem}")
    baselines = doc.get("baselines")
    if baselines is not None:
        if not isinstance(baselines, dict):
            raise CheckpointError(f"{path}: baselines must be an object")
        for name, part in baselines.items():
            problem = (
                "must be an object"
                if not isinstance(part, dict)
                else "kind must be a string"
                if not isinstance(part.get("kind", ""), str)
                else _metrics_problem(part)
            )
            if problem:
                raise CheckpointError(f"{path}: baselines: {name}: {problem}"[:200])
    behind = doc.get("behind_baseline")
    if behind is not None and not (
        isinstance(behind, dict) and isinstance(behind.get("line"), str)
    ):
        raise CheckpointError(f"{path}: behind_baseline must be null or an object with a line")
    return doc


def read_metrics(run_dir: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """The events of ``metrics.jsonl`` that follow the rules, and how many lines did not
    (cut by a crash, invalid UTF-8, wrong types): those are skipped and counted, never
    fatal, since the log is evidence, not input to the model. ``([], 0)`` without a log.

    Raises:
        CheckpointError: the log is not a regular file, or is larger than the cap.
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not os.path.lexists(path):
        return [], 0
    try:
        raw = read_run_file(path)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    events: list[dict[str, Any]] = []
    bad = 0
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = loads_json(line, path, number)
        except DataError:
            bad += 1
            continue
        if (
            not isinstance(event, dict)
            or not isinstance(event.get("event"), str)
            or _metrics_problem(event) is not None
            or ("clipped_total" in event and not _is_int(event["clipped_total"]))
            or ("best" in event and not isinstance(event["best"], bool))
        ):
            bad += 1
            continue
        events.append(event)
    return events, bad


CSV_FIRST_COLUMNS = ("event", "step", "epoch")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value if isinstance(value, str) else repr(value)
    return json.dumps(value, allow_nan=False, separators=(",", ":"), sort_keys=True)


def metrics_csv(events: list[dict[str, Any]]) -> str:
    """``events`` as CSV text (see the module docstring for the columns and cells).

    >>> print(metrics_csv([{"event": "train", "step": 2, "loss_nats": 0.5},
    ...                    {"event": "valid", "step": 2, "best": True}]), end="")
    event,step,epoch,loss_nats,best
    train,2,,0.5,
    valid,2,,,true
    """
    columns = list(CSV_FIRST_COLUMNS)
    seen = set(columns)
    for event in events:
        for key in event:
            if key not in seen:
                seen.add(key)
                columns.append(key)
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(columns)
    for event in events:
        writer.writerow([_cell(event.get(key)) for key in columns])
    return text.getvalue()


def write_metrics_csv(run_dir: str | os.PathLike[str]) -> Path:
    """Write ``RUN/metrics.csv`` from ``RUN/metrics.jsonl`` (atomically); returns its path.

    The table is the run's course: where an attempt killed past its last snapshot logged
    steps that the resumed attempt trained again, only the later attempt's rows are
    there (no step twice, none going back); ``metrics.jsonl`` keeps both attempts.

    Raises:
        CheckpointError: ``metrics.jsonl`` is not a regular file or is over the size cap.
        WriteError: ``metrics.csv`` cannot be written (named).
    """
    path = Path(run_dir) / "metrics.csv"
    events, _ = read_metrics(run_dir)
    events = run_events(events, [])  # every attempt, to its last step
    atomic_write_bytes(path, metrics_csv(events).encode("utf-8"))
    return path
