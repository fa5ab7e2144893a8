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
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rnnkit import messages
from rnnkit.anomaly.scores import SCORES
from rnnkit.anomaly.thresholds import THRESHOLD_METHODS
from rnnkit.errors import ConfigError, DataError

__all__ = ["ScoreConfig", "register", "run"]

_STRACE_LINE = re.compile(r"^\s*(?:\[pid\s+\d+\]\s+|\d+\s+)?(?:[\d:.]+\s+)?[a-z_0-9]+\(")


@dataclass(frozen=True)
class ScoreConfig:
    """Validated options of ``rnnkit score``.

    >>> ScoreConfig.from_args(argparse.Namespace(
    ...     checkpoint="r", data="-", source="strace", no_result=False, per="pid", top=5,
    ...     batch_size=64, score=None, target_fpr=None, threshold=None, ngram=False,
    ...     follow=True, max_sessions=10000, idle_timeout=300.0, until_idle=None, poll=0.2,
    ...     quiet=False))
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --follow reads event lines; --from strace is for whole files
    """

    checkpoint: str
    data: str
    source: str = "sessions"
    with_result: bool = True
    per: str = "pid"
    top: int = 5
    batch_size: int = 64
    score: str | None = None
    target_fpr: float | None = None
    threshold: float | None = None
    ngram: bool = False
    follow: bool = False
    max_sessions: int = 10_000
    idle_timeout: float | None = 300.0
    until_idle: float | None = None
    poll: float = 0.2
    quiet: bool = False
    threshold_method: str | None = None
    params: str | None = None
    confidence: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ScoreConfig:
        """Check the options together and build the config."""
        if args.follow and args.source != "sessions":
            raise ConfigError("--follow reads event lines; --from strace is for whole files")
        if args.follow and args.ngram:
            raise ConfigError("--ngram applies to batch scoring, not --follow")
        if args.target_fpr is not None and args.threshold is not None:
            raise ConfigError("give --target-fpr or --threshold, not both")
        if args.threshold is not None and not math.isfinite(args.threshold):
            # A NaN threshold compares false with every score: detection silently off.
            raise ConfigError(f"--threshold must be a finite number, got {args.threshold}")
        if args.target_fpr is not None and not 0 < args.target_fpr < 1:
            raise ConfigError(f"--target-fpr must be in (0, 1), got {args.target_fpr}")
        for name in ("top", "batch_size", "max_sessions"):
            value = getattr(args, name)
            minimum = 0 if name == "top" else 1
            if value < minimum:
                raise ConfigError(f"--{name.replace('_', '-')} must be ≥ {minimum}, got {value}")
        for name in ("idle_timeout", "until_idle", "poll"):
            value = getattr(args, name)
            if value is not None and not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
        if not args.follow and (args.until_idle is not None):
            raise ConfigError("--until-idle applies to --follow only")
        if args.source == "sessions" and (args.no_result or args.per != "pid"):
            raise ConfigError("--no-result and --per apply to --from strace only")
        params = getattr(args, "params", None)
        confidence = getattr(args, "confidence", None)
        if params is not None and args.follow:
            raise ConfigError("--params applies to batch scoring, not --follow")
        if params is not None and args.source != "sessions":
            raise ConfigError("--params reads sessions with parameter values, not --from strace")
        if confidence is not None and not 0 < confidence < 1:
            raise ConfigError(f"--confidence must be in (0, 1), got {confidence}")
        return cls(
            checkpoint=args.checkpoint,
            data=args.data,
            source=args.source,
            with_result=not args.no_result,
            per=args.per,
            top=args.top,
            batch_size=args.batch_size,
            score=args.score,
            target_fpr=args.target_fpr,
            threshold=args.threshold,
            ngram=args.ngram,
            follow=args.follow,
            max_sessions=args.max_sessions,
            idle_timeout=args.idle_timeout,
            until_idle=args.until_idle,
            poll=args.poll,
            quiet=args.quiet,
            threshold_method=_threshold_method(args),
            params=params,
            confidence=confidence,
        )


def _threshold_method(args: argparse.Namespace) -> str | None:
    method = getattr(args, "threshold_method", None)
    if method is not None and args.target_fpr is None:
        raise ConfigError("--threshold-method re-picks thresholds: give --target-fpr too")
    return method


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
    p.add_argument(
        "--score",
        choices=SCORES,
        help="session score giving the verdict: max or mean surprise, count of top-g misses, "
        "end (surprise of the session's end), norm (surprise against each event's typical "
        "one) or combined (default: the run's; --follow: max, mean or count)",
    )
    p.add_argument(
        "--target-fpr",
        type=float,
        help="re-pick thresholds at this false-positive rate from the run's validation scores "
        "(a params run as --checkpoint: its session threshold)",
    )
    p.add_argument(
        "--threshold-method",
        choices=THRESHOLD_METHODS,
        help="with --target-fpr: the empirical quantile, or a generalized Pareto tail fit "
        "(gpd) for rates the validation sessions are too few to show",
    )
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
    p.add_argument(
        "--confidence",
        type=float,
        metavar="C",
        help="the params run's per-vector confidence interval, re-picked (default: the "
        "run's); the session threshold is never below its bound",
    )
    g = p.add_argument_group("streaming")
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
    p.set_defaults(func=run)


def _print(record: dict[str, Any]) -> None:
    from rnnkit.training.checkpoint import dumps_strict

    sys.stdout.write(dumps_strict(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _note(message: str) -> None:
    messages.info(message, who="rnnkit score")


def _hint_strace(path: str) -> str:
    if path == "-":
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline(4096)
    except OSError:
        return ""
    return (
        " (this looks like strace output: add --from strace)" if _STRACE_LINE.match(first) else ""
    )


def _sessions(config: ScoreConfig) -> Iterator[Any]:
    for session, _, _ in _items(config):
        yield session


def _items(config: ScoreConfig) -> Iterator[tuple[Any, str, int]]:
    """``(session, file, line)`` of every input session (strace sessions: line 0)."""
    if config.source == "strace":
        from rnnkit.data.strace import parse_strace

        if config.data == "-":
            sessions, stats = parse_strace(
                sys.stdin,
                with_result=config.with_result,
                per=config.per,  # type: ignore[arg-type]
            )
        else:
            sessions, stats = parse_strace(
                config.data,
                with_result=config.with_result,
                per=config.per,  # type: ignore[arg-type]
            )
        if stats.skipped and not config.quiet:
            source, line = stats.first_skipped[0]
            _note(f"skipped {stats.skipped} non-strace line(s) (first at {source}:{line})")
        for session in sessions:
            yield session, config.data, 0
        return
    from rnnkit.data.events import iter_sessions

    def read(fileobj: Any, path: str) -> Iterator[tuple[Any, str, int]]:
        try:
            for line, session in iter_sessions(fileobj, path):
                yield session, path, line
        except DataError as exc:
            if exc.line == 1 and exc.message.startswith("invalid JSON"):
                raise DataError(exc.message + _hint_strace(config.data), exc.path, 1) from None
            raise

    if config.data == "-":
        yield from read(sys.stdin.buffer, "<stdin>")
    else:
        with open(config.data, "rb") as fileobj:
            yield from read(fileobj, config.data)


def _thresholds(config: ScoreConfig, run: Any) -> dict[str, dict[str, float]]:
    from rnnkit.app.tasks.events import repick_thresholds

    name = config.score or run.thresholds["score"]
    if config.target_fpr is not None:
        limits = repick_thresholds(
            config.checkpoint, config.target_fpr, config.threshold_method or "quantile"
        )
    else:
        limits = {m: dict(run.thresholds[m]) for m in ("rnn", "ngram")}
    if config.threshold is not None:
        limits["rnn"][name] = config.threshold
    return limits


def _run_batch(config: ScoreConfig, run: Any, params_run: Any = None) -> int:
    from collections import deque

    from rnnkit.app.tasks.events import score_sessions

    limits = _thresholds(config, run)
    count = anomalous = unknown = by_params = 0
    empty = True
    pending: deque[tuple[Any, str, int]] = deque()

    def tap() -> Iterator[Any]:
        # The sessions pass to the key model one by one; the params model gets each
        # again, with its file and line, when its verdict comes out (in order).
        for item in _items(config):
            pending.append(item)
            yield item[0]

    records = score_sessions(
        run,
        tap(),
        batch_size=config.batch_size,
        top_k=config.top,
        score=config.score,
        thresholds=limits,
        ngram=config.ngram,
    )
    for record in records:
        empty = False
        count += 1
        if params_run is not None:
            from rnnkit.app.tasks.params import combine
            from rnnkit.app.tasks.params import score_sessions as score_params

            item = pending.popleft()
            (params_record,) = score_params(
                params_run, [item], top_k=config.top, confidence=config.confidence
            )
            by_params += params_record["verdict"] == "anomalous"
            record = combine(record, params_record)
        anomalous += record["verdict"] == "anomalous"
        unknown += record["unknown"]
        _print(record)
    if empty:
        raise DataError("no sessions (the input is empty)", config.data)
    if not config.quiet:
        name = config.score or run.thresholds["score"]
        either = f" (parameter values: {by_params})" if params_run is not None else ""
        _note(
            f"{count} session(s), {anomalous} anomalous{either} ({name} score above "
            f"{limits['rnn'][name]:.4g}); {unknown} event(s) never seen in training (<unk>)"
        )
    return 0


def _run_params(config: ScoreConfig) -> int:
    """A params run alone: one record per session."""
    from rnnkit.app.tasks.params import load_params, repick_session_score, score_sessions

    for flag, value in (
        ("--ngram", config.ngram),
        ("--score", config.score),
        ("--threshold", config.threshold),
        ("--params", config.params),
    ):
        if value:
            raise ConfigError(f"{flag} applies to an events checkpoint, not a params run")
    if config.follow or config.source != "sessions":
        raise ConfigError("a params run scores JSON-lines sessions in batch (no --follow, strace)")
    run = load_params(config.checkpoint)
    session_score = None
    if config.target_fpr is not None:
        session_score = repick_session_score(
            config.checkpoint, config.target_fpr, config.threshold_method or "quantile"
        )
    limit = run.limit(config.confidence, session_score)
    count = anomalous = 0
    for record in score_sessions(
        run,
        _items(config),
        batch_size=config.batch_size,
        top_k=config.top,
        confidence=config.confidence,
        session_score=session_score,
    ):
        count += 1
        anomalous += record["verdict"] == "anomalous"
        _print(record)
    if not count:
        raise DataError("no sessions (the input is empty)", config.data)
    if not config.quiet:
        _note(
            f"{count} session(s), {anomalous} anomalous (largest error z above {limit:.4g}: "
            f"the validated session threshold, at least the "
            f"{config.confidence or run.confidence:g} interval's {run.z(config.confidence):.4g})"
        )
    return 0


def _run_follow(config: ScoreConfig, run: Any) -> int:
    from rnnkit.anomaly.follow import follow_lines
    from rnnkit.anomaly.stream_format import parse_stream_line
    from rnnkit.anomaly.streaming import StreamScorer

    name = config.score or run.thresholds["score"]
    if run.thresholds.get("window"):
        # Streaming carries one state per session over all its events: it cannot score
        # with the run's history window, and different scores would be silent.
        raise ConfigError(
            f"--follow carries each session's whole history; this run predicts from a "
            f"window of {run.thresholds['window']} events: score it in batch"
        )
    scorer = StreamScorer(
        run.model,
        run.vocab,
        threshold=_thresholds(config, run)["rnn"][name],
        score=name,
        top_g=int(run.thresholds["top_g"]),
        top_k=config.top,
        max_sessions=config.max_sessions,
        idle_timeout=config.idle_timeout,
    )
    path = "<stdin>" if config.data == "-" else config.data
    bad = 0
    for lines in follow_lines(config.data, poll=config.poll, until_idle=config.until_idle):
        items = []
        for number, raw in lines:
            try:
                items.append(parse_stream_line(raw, path, number))
            except DataError as exc:
                bad += 1
                messages.warning(f"{exc} (line skipped)", who="rnnkit score")
        for verdict in scorer.feed(items):
            _print(verdict)
    for verdict in scorer.close_all("input ended"):
        _print(verdict)
    if not config.quiet:
        st = scorer.stats
        _note(
            f"{st['events']} event(s) in {st['sessions']} session(s), {st['anomalous']} "
            f"anomalous; {st['unknown']} event(s) never seen in training (<unk>); "
            f"{st['evicted']} evicted, {st['idle']} idle; {bad} bad line(s)"
            + (
                f"; {st['ends_without_session']} end(s) of no open session"
                if st["ends_without_session"]
                else ""
            )
        )
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``rnnkit score``; returns the exit status."""
    config = ScoreConfig.from_args(args)
    from rnnkit.app.tasks.events import load_events
    from rnnkit.app.tasks.registry import task_of_run

    if task_of_run(config.checkpoint) == "params":
        return _run_params(config)
    events_run = load_events(config.checkpoint)
    if config.follow:
        return _run_follow(config, events_run)
    params_run = None
    if config.params is not None:
        from rnnkit.app.tasks.params import load_params

        params_run = load_params(config.params)
    elif config.confidence is not None:
        raise ConfigError("--confidence applies to a params run: give --params RUN")
    return _run_batch(config, events_run, params_run)
