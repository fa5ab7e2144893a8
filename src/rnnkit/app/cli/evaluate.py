"""``rnnkit evaluate``: score a data file with a trained checkpoint (and its baseline)."""

from __future__ import annotations

import argparse
from typing import Any

from rnnkit.app.cli.run_options import add_device_option, check_run_option
from rnnkit.app.cli.train_summary import UNDEFINED as DETECTION_UNDEFINED
from rnnkit.errors import ConfigError

__all__ = ["plain_text", "register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "evaluate",
        help="evaluate a checkpoint on data",
        description="Score a data file with a trained model.",
    )
    p.add_argument("--checkpoint", required=True, help="run directory written by train")
    p.add_argument("--data", required=True, help="data file in the task's format")
    p.add_argument("--batch-size", type=int, help="evaluation batch size (default: the run's)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument(
        "--beam",
        type=int,
        help="seq2seq: the beam width of the decoding scored (default: the run's --beam; "
        "1 = greedy)",
    )
    add_device_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rnnkit.app.tasks.registry import task_module, task_of_run

    # Before the run is read: 0 meant the run's batch size, -1 a traceback (events).
    check_run_option("batch_size", args.batch_size)
    if not args.data:
        raise ConfigError("--data is empty: name a data file")
    name = task_of_run(args.checkpoint)
    task = task_module(name)
    beam = getattr(args, "beam", None)
    if beam is None:
        metrics = task.evaluate(args.checkpoint, args.data, args.batch_size, args.device)
    else:
        from rnnkit.generation.options import MAX_BEAM

        if name != "seq2seq":
            raise ConfigError(f"--beam does not apply to a checkpoint of --task {name} "
                              "(only to seq2seq)")  # fmt: skip
        if not 1 <= beam <= MAX_BEAM:
            raise ConfigError(f"--beam must be in [1, {MAX_BEAM}], got {beam}")
        from rnnkit.app.tasks.seq2seq import evaluate as evaluate_seq2seq

        metrics = evaluate_seq2seq(args.checkpoint, args.data, args.batch_size, args.device, beam)
    if args.json:
        from rnnkit.training.checkpoint import dumps_strict

        print(dumps_strict(metrics))
        return 0
    print(plain_text(metrics))
    return 0


def plain_text(metrics: dict[str, Any]) -> str:
    """The figures one per line, ``name: value``; each baseline on a line of its own.

    Written for a reader, not as Python reprs: a float to 4 significant digits, an
    undefined figure (None, JSON's null) as ``—`` (at the top level with why, where the
    name says it: ``n/a (no anomalous sessions)``), a list comma-separated, a list of
    rows (a confusion matrix) with ``;`` between rows, a table (a dict) as ``key value,
    ...`` and an empty one as ``—``.

    >>> print(plain_text({"recall": None, "labels": ["a", "b"], "per": {"a": 0.5, "b": None},
    ...                   "counts": {}, "confusion_matrix": [[1, 0], [2, 3]]}))
    recall: n/a (no anomalous sessions)
    labels: a, b
    per: a 0.5, b —
    counts: —
    confusion_matrix: 1 0; 2 3
    """
    lines = []
    for key, value in metrics.items():
        if key == "baselines" and isinstance(value, dict):
            for name, figures in value.items():
                rest = {k: v for k, v in figures.items() if k != "kind"}
                lines.append(f"baseline {name} ({figures.get('kind', name)}): {_inner(rest)}")
        elif isinstance(value, dict):
            lines.append(f"{key}: {_inner(value)}")
        elif value is None and key in UNDEFINED:
            lines.append(f"{key}: n/a ({UNDEFINED[key]})")
        else:
            lines.append(f"{key}: {_value(value)}")
    return "\n".join(lines)


#: Why a figure is None, by its name (the detection ratios' reasons from the summary's).
UNDEFINED = {**DETECTION_UNDEFINED, "oov_accuracy": "no out-of-vocabulary token"}


def _value(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, (list, tuple)) for v in value):
            return "; ".join(" ".join(_value(x) for x in row) for row in value)
        return ", ".join(_value(v) for v in value) or "—"
    return str(value)


def _inner(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k} {_value(v)}" for k, v in figures.items()) or "—"
