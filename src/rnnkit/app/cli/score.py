"""``rnnkit score``: anomaly verdicts of event sessions with a trained ``events`` run.

::

    rnnkit score --checkpoint runs/sys --data sessions.jsonl      # one JSON line per session
    rnnkit score --checkpoint runs/sys --data trace.txt --from strace
    tail -F events.jsonl | rnnkit score --checkpoint runs/sys --data - --follow
    rnnkit score --checkpoint runs/keys --params runs/values --data sessions.jsonl
    rnnkit score --checkpoint runs/values --data sessions.jsonl   # a params run alone

Batch mode prints, per session, ``{"session", "score", "verdict", "threshold", "scores",
"events", "unknown", "top": [{"position", "event", "surprise", "miss"}...]}`` (see
:func:`rnnkit.app.tasks.events.score_sessions`). ``--follow`` reads one event per line
(:mod:`rnnkit.anomaly.stream_format` documents the format) and prints a verdict line when a session
becomes anomalous or closes. A one-line summary goes to stderr unless ``--quiet``.

``--params RUN`` adds the verdict of a parameter-value run (``rnnkit train --task
params``, :func:`rnnkit.app.tasks.params.combine`): ``verdict`` is then anomalous when either
model says so, ``keys_verdict`` is the key-sequence model's own and ``params`` the
parameter model's record. A ``params`` run given as ``--checkpoint`` scores alone.
"""

from __future__ import annotations

import argparse
from typing import Any

from rnnkit.app.cli.run_options import add_device_option, add_run_option
from rnnkit.app.cli.score_config import ScoreConfig
from rnnkit.app.cli.score_modes import run_batch, run_follow, run_params
from rnnkit.errors import ConfigError

__all__ = ["ScoreConfig", "register", "run"]


def register(subparsers: Any) -> None:
    """Add the ``score`` subcommand to the ``rnnkit`` parser."""
    p = subparsers.add_parser(
        "score",
        help="anomaly scores of event sessions (events task)",
        description="Score event sessions with a trained events run: one JSON line per "
        "session (batch), or verdict lines as events arrive (--follow).",
    )
    p.add_argument("--checkpoint", required=True, help="run directory of an events run")
    p.add_argument(
        "--data",
        required=True,
        metavar="PATH",
        help="sessions (JSON lines), strace output (--from strace), or event lines "
        "(--follow); '-' reads standard input",
    )
    p.add_argument(
        "--from",
        dest="source",
        choices=("sessions", "strace"),
        default="sessions",
        help="what --data holds (default: JSON-lines sessions)",
    )
    p.add_argument(
        "--no-result",
        action="store_true",
        help="(strace) events are bare syscall names; must match how the run was trained",
    )
    p.add_argument(
        "--per",
        choices=("pid", "file"),
        default="pid",
        help="(strace) one session per traced process (default) or per file",
    )
    p.add_argument(
        "--top", type=int, default=5, help="list the K most surprising events (default 5)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="sessions per forward pass")
    add_device_option(p)
    # As `rnnkit train` declares them (the fields of rnnkit.app.config); left out: the run's.
    add_run_option(p, "score", note="--follow: max, mean or count")
    add_run_option(
        p, "target_fpr", note="given: the thresholds are re-picked from the run's validation scores"
    )
    add_run_option(p, "threshold_method", note="with --target-fpr")
    p.add_argument("--threshold", type=float, help="anomalous when the score is above this")
    p.add_argument(
        "--ngram", action="store_true", help="add the n-gram baseline's scores (batch mode)"
    )
    p.add_argument(
        "--params",
        metavar="RUN",
        help="also judge each event's parameter values with this params run (rnnkit train "
        "--task params): a session is anomalous when either model says so",
    )
    add_run_option(
        p,
        "confidence",
        note="with --params: re-picked; the session threshold is never below its bound",
    )
    _add_streaming_options(p.add_argument_group("streaming"))
    p.set_defaults(func=run)


def _add_streaming_options(g: Any) -> None:
    """The options of ``--follow``."""
    g.add_argument(
        "--follow",
        action="store_true",
        help="read event lines as they arrive (a growing file, or '-' for a pipe); "
        'format: {"session": ID, "event": E} / {"session": ID, "end": true}',
    )
    g.add_argument(
        "--max-sessions",
        type=int,
        default=10_000,
        help="most sessions open at once; the least recently active is closed (default "
        "%(default)s)",
    )
    g.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="close a session after this many seconds without events (default %(default)s)",
    )
    g.add_argument(
        "--until-idle",
        type=float,
        help="stop when no input arrived for this many seconds (default: follow forever)",
    )
    g.add_argument("--poll", type=float, default=0.2, help="seconds between checks for new input")


def run(args: argparse.Namespace) -> int:
    """Run ``rnnkit score``; returns the exit status."""
    config = ScoreConfig.from_args(args)
    from rnnkit.app.tasks.events import load_events
    from rnnkit.app.tasks.registry import task_of_run

    if task_of_run(config.checkpoint) == "params":
        return run_params(config, args.device)
    events_run = load_events(config.checkpoint, args.device)
    if config.follow:
        return run_follow(config, events_run)
    params_run = None
    if config.params is not None:
        from rnnkit.app.tasks.params import load_params

        params_run = load_params(config.params, args.device)
    elif config.confidence is not None:
        raise ConfigError("--confidence applies to a params run: give --params RUN")
    return run_batch(config, events_run, params_run)
