"""``rnnkit sessions``: turn strace output or log files into an ``events`` data file.

::

    rnnkit sessions --from strace trace.txt --out train.jsonl --label 0
    rnnkit sessions --from log app.log --session-pattern 'req=(\\w+)' --out app.jsonl
    rnnkit sessions --from log new.log --session-pattern 'req=(\\w+)' --templates app.jsonl \\
        --out new.jsonl
    rnnkit sessions --from log hdfs.log --out hdfs.jsonl --session-pattern 'blk_-?\\d+' \\
        --log-format '<Date> <Time> <Pid> <Level> <Component>: <Content>'
    rnnkit sessions --from log pg.log --out pg.jsonl --log-format '<Date> <Time> <Zone> \\
        [<Pid>] <Session> <Content>' --session-field Session --params --time-field Date,Time

The output is the JSON-lines format that ``rnnkit train --task events`` reads, written
atomically. A one-line summary goes to stdout unless ``--quiet``. ``--out -`` writes the
JSON lines to stdout instead (and the summary to stderr), for a pipe into
``rnnkit score --data -``. An INPUT ``-`` reads standard input. ``--templates`` names the
lines of new logs by the templates of an earlier mining (its sessions file, or the run
trained on it), so that a model sees the events it was trained on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Literal

from rnnkit.app.cli.stdout import stdin_as_log, write_stdout
from rnnkit.data.events import Session, sessions_text, write_sessions
from rnnkit.data.files import check_replaceable
from rnnkit.errors import ConfigError, DataError, WriteError

__all__ = ["SessionsConfig", "known_templates", "register", "run"]

#: How standard input (INPUT ``-``) is named in sessions and messages.
STDIN = "<stdin>"


@dataclass(frozen=True)
class SessionsConfig:
    """Validated options of ``rnnkit sessions``.

    >>> SessionsConfig.from_args(argparse.Namespace(
    ...     source="log", inputs=["a.log"], out="s.jsonl", session_pattern=None, no_result=False,
    ...     per="pid", label=None, similarity=0.4, quiet=False))
    Traceback (most recent call last):
    ...
    rnnkit.errors.ConfigError: --from log needs --session-pattern (a regex; its group is the id)
    """

    source: Literal["strace", "log"]
    inputs: tuple[str, ...]
    out: str
    session_pattern: str | None = None
    with_result: bool = True
    per: Literal["pid", "file"] = "pid"
    label: int | None = None
    similarity: float = 0.4
    quiet: bool = False
    log_format: str | None = None
    session_field: str | None = None
    drain_depth: int = 4
    drain_max_children: int = 100
    params: bool = False
    time_fields: tuple[str, ...] = ()
    time_format: str | None = None
    templates: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SessionsConfig:
        """Check the options together (argparse checks each alone) and build the config."""
        log_options: dict[str, Any] = {
            "log_format": getattr(args, "log_format", None),
            "session_field": getattr(args, "session_field", None),
            "drain_depth": getattr(args, "drain_depth", None),
            "drain_max_children": getattr(args, "drain_max_children", None),
            "params": getattr(args, "params", False) or None,
            "time_field": getattr(args, "time_field", None),
            "time_format": getattr(args, "time_format", None),
        }
        if args.source == "log" and not (args.session_pattern or log_options["session_field"]):
            raise ConfigError("--from log needs --session-pattern (a regex; its group is the id)")
        # 0 was taken as "not given" (the default), a negative value named Drain's keyword.
        for name, least in (("drain_depth", 3), ("drain_max_children", 2)):
            value = log_options[name]
            if args.source == "log" and value is not None and value < least:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be at least {least}, got {value}")
        if args.source == "strace":
            # Refused rather than ignored: the user expected them to do something.
            if args.session_pattern is not None:
                raise ConfigError("--session-pattern applies to --from log only")
            if args.similarity != 0.4:
                raise ConfigError("--similarity applies to --from log only")
            for name, value in log_options.items():
                if value is not None:
                    raise ConfigError(f"--{name.replace('_', '-')} applies to --from log only")
        elif args.no_result or args.per != "pid":
            raise ConfigError("--no-result and --per apply to --from strace only")
        if not 0.0 <= args.similarity <= 1.0:
            raise ConfigError(f"--similarity must be in [0, 1], got {args.similarity}")
        time_fields: tuple[str, ...] = ()
        if log_options["time_field"] is not None:
            time_fields = tuple(f.strip() for f in log_options["time_field"].split(","))
            if not all(time_fields):
                raise ConfigError(
                    f"--time-field {log_options['time_field']!r}: give field names separated "
                    "by commas (e.g. Date,Time)"
                )
        if (time_fields or log_options["time_format"]) and not log_options["params"]:
            raise ConfigError("--time-field and --time-format apply with --params only")
        if args.inputs.count("-") > 1:
            raise ConfigError("INPUT - (standard input) is given twice")
        seen: set[str] = set()
        for path in args.inputs:
            if path == "-":
                continue
            real = os.path.realpath(path)
            if real in seen:
                raise ConfigError(f"INPUT {path} is given twice")
            seen.add(real)
            if args.out != "-" and real == os.path.realpath(args.out):
                raise ConfigError(f"--out {args.out} is also an INPUT; it would be overwritten")
            if not os.path.exists(path):
                raise DataError("no such file", path=path)
            if os.path.isdir(path):
                # a pipe (<(zcat old.log.gz)) is read as a file is: once, in order
                raise DataError("is a directory, not a file of lines", path=path)
        templates = getattr(args, "templates", None)
        if templates is not None and args.source != "log":
            raise ConfigError("--templates applies to --from log only")
        if templates is not None and not os.path.exists(templates):
            raise DataError("no such file or run directory", path=templates)
        if not args.out:
            raise ConfigError("--out is empty: name the JSON-lines file to write")
        # Checked before any input is read: a file other than a sessions file (a data
        # file named by mistake) is never replaced, and a sessions file only when asked:
        # the training and test files users write (labelled by hand) look the same.
        if args.out != "-":
            check_replaceable(args.out, _is_sessions_file, "a sessions file (JSON lines)")
            if not getattr(args, "overwrite", False) and _holds_data(args.out):
                raise WriteError(
                    f"{args.out}: exists (a sessions file); refusing to replace it: give "
                    "--overwrite to replace it, or choose another path"
                )
        return cls(
            source=args.source,
            inputs=tuple(args.inputs),
            out=args.out,
            session_pattern=args.session_pattern,
            with_result=not args.no_result,
            per=args.per,
            label=args.label,
            similarity=args.similarity,
            quiet=args.quiet,
            log_format=log_options["log_format"],
            session_field=log_options["session_field"],
            drain_depth=4 if log_options["drain_depth"] is None else log_options["drain_depth"],
            drain_max_children=(
                100
                if log_options["drain_max_children"] is None
                else log_options["drain_max_children"]
            ),
            params=bool(log_options["params"]),
            time_fields=time_fields,
            time_format=log_options["time_format"],
            templates=templates,
        )


def register(subparsers: Any) -> None:
    """Add the ``sessions`` subcommand to the ``rnnkit`` parser."""
    parser = subparsers.add_parser(
        "sessions",
        help="build an events data file from strace output or log files",
        description=(
            "Turn strace output (one session per process) or log files (one session per "
            "session id, each line's event its Drain3 template) into the JSON-lines "
            "events format."
        ),
    )
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        choices=("strace", "log"),
        help="what the inputs are: strace output (-f, -ff, -tt... all read) or log lines",
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="input files, read in order; '-' reads standard input (a pipe works too)",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="JSON-lines file to write; '-' writes to stdout (the summary then goes to stderr)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out if it is an existing sessions file (any other file is never replaced)",
    )
    _add_log_options(parser)
    parser.add_argument(
        "--no-result",
        action="store_true",
        help="(strace) events are bare syscall names, not name:result (openat:ENOENT)",
    )
    parser.add_argument(
        "--per",
        choices=("pid", "file"),
        default="pid",
        help="(strace) one session per traced process (default) or per input file",
    )
    parser.add_argument(
        "--label",
        type=int,
        choices=(0, 1),
        help="label every session 0 (normal) or 1 (anomalous); default unlabelled",
    )
    parser.set_defaults(func=run)


def _add_log_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``--from log``: where the session id is, the line format, Drain's
    settings, the parameter values and their times."""
    parser.add_argument(
        "--session-pattern",
        metavar="REGEX",
        help="(log) regex finding a line's session id: group 'session', else the first "
        "group, else the whole match (e.g. 'blk_-?\\d+'); lines without one are skipped",
    )
    parser.add_argument(
        "--log-format",
        metavar="FORMAT",
        help="(log) header format of each line, loghub style, e.g. '<Date> <Time> <Pid> "
        "<Level> <Component>: <Content>': only <Content> is mined into templates; a line "
        "that does not fit stops with its file and line",
    )
    parser.add_argument(
        "--session-field",
        metavar="NAME",
        help="(log) with --log-format: the header field that is the session id (e.g. Pid), "
        "instead of --session-pattern",
    )
    parser.add_argument(
        "--drain-depth",
        type=int,
        metavar="N",
        help="(log) depth of Drain's prefix tree, at least 3 (default 4)",
    )
    parser.add_argument(
        "--drain-max-children",
        type=int,
        metavar="N",
        help="(log) most children of a node of Drain's prefix tree, at least 2 (default 100)",
    )
    parser.add_argument(
        "--params",
        action="store_true",
        help='(log) also write each event\'s parameter values ("params": the numbers of '
        "its template's variable parts, null where not a number), for rnnkit train --task "
        "params",
    )
    parser.add_argument(
        "--time-field",
        metavar="NAME[,NAME]",
        help="(log) with --params and --log-format: the header field(s) holding the line's "
        "time (e.g. Date,Time); the seconds since the session's previous line then come "
        "first in each event's params",
    )
    parser.add_argument(
        "--time-format",
        metavar="FORMAT",
        help="(log) strptime format of the --time-field text (e.g. '%%y%%m%%d %%H%%M%%S'; "
        "default: ISO 8601, else a number of seconds)",
    )
    parser.add_argument(
        "--templates",
        metavar="PATH",
        help="(log) name lines by the templates of an earlier mining: a sessions file it "
        "wrote, or a run of --task events trained on one; a line that fits one of them is "
        "that event, only the others are mined anew (new logs for a trained model)",
    )
    parser.add_argument(
        "--similarity",
        type=float,
        default=0.4,
        metavar="X",
        help="(log) Drain similarity threshold in [0, 1]; higher gives more, finer templates "
        "(default 0.4)",
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _from_strace(config: SessionsConfig) -> tuple[list[Session], str]:
    from rnnkit.data.strace import parse_strace

    sessions: list[Session] = []
    skipped: list[tuple[str, int]] = []
    skipped_count = 0
    for path in config.inputs:
        with contextlib.ExitStack() as stack:
            source: Any = stack.enter_context(stdin_as_log()) if path == "-" else path
            found, stats = parse_strace(
                source,
                with_result=config.with_result,
                per=config.per,
                label=config.label,
                name=STDIN if path == "-" else None,
            )
        sessions.extend(found)
        skipped_count += stats.skipped
        skipped.extend(stats.first_skipped)
    note = ""
    if skipped_count:
        source, line = skipped[0]
        note = f"; skipped {_count(skipped_count, 'unparseable line')} (first at {source}:{line})"
    return sessions, note


def _from_logs(config: SessionsConfig) -> tuple[list[Session], str]:
    from rnnkit.data.logs import LogSessionizer, no_session_message

    # One sessionizer for all inputs: a session may span rotated files, and every file
    # must name the same kind of line by the same template.
    sessionizer = LogSessionizer(
        config.session_pattern,
        log_format=config.log_format,
        session_field=config.session_field,
        similarity=config.similarity,
        depth=config.drain_depth,
        max_children=config.drain_max_children,
        params=config.params,
        time_fields=config.time_fields,
        time_format=config.time_format,
        templates=None if config.templates is None else known_templates(config.templates),
        option_names=True,  # its errors name --log-format, not log_format
    )
    for path in config.inputs:
        if path == "-":
            with stdin_as_log() as stream:
                sessionizer.add_stream(stream, STDIN)
        else:
            sessionizer.add_file(path)
    sessions = sessionizer.sessions(config.label)
    if not sessions:
        named = (STDIN if p == "-" else p for p in config.inputs)
        raise DataError(no_session_message(sessionizer), path=", ".join(named))
    stats = sessionizer.stats
    if config.templates is None:
        note = f"; {_count(stats.templates, 'template')}"
    else:
        note = (
            f"; {_count(stats.known, 'line')} fitting the --templates, "
            f"{_count(stats.templates, 'new template')} mined"
        )
    note += f"; skipped {_count(stats.no_session, 'line')} without a session id"
    if stats.first_no_session is not None:
        source, line = stats.first_no_session
        note += f" (first at {source}:{line})"
    if stats.too_long:
        note += f" and {_count(stats.too_long, 'overlong line')}"
    if stats.empty:
        note += f" and {_count(stats.empty, 'line')} with an empty message"
    if config.params:
        width = {len(v) for s in sessions for v in s.params or []}
        note += f"; parameter values of widths {sorted(width)}"
        if stats.unmatched_params:
            note += (
                f" ({_count(stats.unmatched_params, 'line')} no longer fitting its template: "
                "values null)"
            )
    return sessions, note


def known_templates(path: str) -> list[str]:
    """The event names of an earlier mining: every event of a sessions file (in order of
    first appearance), or the events vocabulary of a run of ``--task events``
    (``vocab.json``; a run of ``--task params`` keeps only the keys with values: give its
    training sessions file).

    Raises:
        DataError: a file that is not a sessions file, a directory that is no such run.
    """
    from rnnkit.data.events import iter_sessions

    if not os.path.isdir(path):
        names: dict[str, None] = {}
        with open(path, "rb") as fileobj:
            for _, session in iter_sessions(fileobj, path, unique=False):
                names.update(dict.fromkeys(session.events))
        if not names:
            raise DataError("no events in it (--templates)", path=path)
        return list(names)
    from rnnkit.app.tasks.events.data import EventVocabulary
    from rnnkit.app.tasks.run_config import load_config
    from rnnkit.data.vocab import SPECIALS

    if not os.path.isfile(os.path.join(path, "config.json")):
        raise DataError(
            "not a run of --task events (no config.json); give its training sessions file",
            path=path,
        )
    cfg, _ = load_config(path, verify=False)
    if cfg.task != "events":  # an LM's words would be one-word templates
        raise DataError(
            f"a run of --task {cfg.task}, not events; give its training sessions file",
            path=path,
        )
    events = EventVocabulary.load(os.path.join(path, "vocab.json")).itos[len(SPECIALS) :]
    if not events:
        raise DataError("no events in its vocabulary (--templates)", path=path)
    return events


def _holds_data(path: str) -> bool:
    """Whether ``path`` is an existing regular file with something in it."""
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


def _is_sessions_file(head: bytes) -> bool:
    """The first bytes of a file :func:`write_sessions` wrote (what ``--out`` may replace)."""
    return head.startswith(b'{"session": ')


def run(args: argparse.Namespace) -> int:
    """Run ``rnnkit sessions``; returns the exit status."""
    config = SessionsConfig.from_args(args)
    sessions, note = _from_strace(config) if config.source == "strace" else _from_logs(config)
    if config.out == "-":
        # Checked whole before the first byte: a reader never gets half a file.
        write_stdout(sessions_text(sessions, "<stdout>").encode("utf-8"))
    else:
        directory = os.path.dirname(config.out)
        if directory:
            os.makedirs(directory, exist_ok=True)
        write_sessions(config.out, sessions)
    if not config.quiet:
        events = sum(len(s.events) for s in sessions)
        where = "stdout" if config.out == "-" else config.out
        print(
            f"wrote {_count(len(sessions), 'session')} ({_count(events, 'event')}) "
            f"to {where}{note}",
            file=sys.stderr if config.out == "-" else sys.stdout,
        )
    return 0
