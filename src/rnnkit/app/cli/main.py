"""Entry point of the ``rnnkit`` command: registers one small module per subcommand.

Each subcommand module exposes ``register(subparsers)`` (adds its parser and sets
``func``) and a ``run(args) -> int``. Errors a user can fix (``RnnkitError``, ``OSError``)
become one line on stderr and exit status 2; nothing prints a traceback.

Every command takes ``-q/--quiet`` and ``-v/--verbose`` (added here, so they mean the same
everywhere): their count sets the level of the ``rnnkit`` logger (``rnnkit.messages``),
and ``args.quiet`` becomes the boolean "below the default level" the commands read.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any

from rnnkit import __version__, messages
from rnnkit.app.cli.ranks import is_other_rank, say_error
from rnnkit.errors import RnnkitError
from rnnkit.tuning import loaded

# Subcommand modules, imported lazily so `rnnkit --help` stays fast and one broken
# optional dependency cannot take down unrelated subcommands.
SUBCOMMANDS: tuple[str, ...] = (
    "train",
    "evaluate",
    "generate",
    "predict",
    "report",
    "score",
    "sessions",
    "gradcheck",
    "build_native",
)


#: The arguments being parsed, for a hint when a required option is missing because it
#: was mistyped (argparse says so before it names the unknown ones)
_parsing: list[str] = []


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option as one line naming the option (exit 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("the following arguments are required"):
            message += _suggestion(self, _parsing, named=True)
        say_error(f"{self.prog}: error: {message}")  # under torchrun: once, by rank 0
        self.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rnnkit", description="Recurrent sequence models with explicit BPTT.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    # Not `required`: `rnnkit` alone prints the list of commands (main), not argparse's
    # bare "arguments are required: COMMAND".
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, title="commands"
    )
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"rnnkit.app.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"rnnkit.app.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    for name, command in sub.choices.items():
        add_verbosity_options(command)
        if name in RUN_READERS:
            command.add_argument(
                "--skip-checksums",
                action="store_true",
                help="read the run without checking its files against its manifest.json "
                "(a run cut short, or written by an older rnnkit)",
            )
    return parser


#: The commands that read a trained run: they check its files against its manifest.
RUN_READERS = ("train", "evaluate", "generate", "predict", "report", "score")


def add_verbosity_options(p: argparse.ArgumentParser) -> None:
    """``-q/--quiet`` and ``-v/--verbose``, counted: the level is verbose − quiet."""
    g = p.add_argument_group("output")
    g.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=0,
        help="say less on stderr: -q no progress bar or notes (warnings and errors only), "
        "-qq errors only; stdout (results, train's summary) is unchanged",
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say more on stderr: details (train: a line per training record and per "
        "validation, and the effective configuration)",
    )


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The commands' parsers by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def explicit_options(argv: Sequence[str] | None) -> set[str]:
    """The destinations ``argv`` sets itself (not by default): a second parse in which
    every default is suppressed. ``--resume`` needs it: an option given with its default
    value (``--length eos``) is still a request, not an omission.

    >>> sorted(explicit_options(["train", "--train", "a.txt", "--out", "r", "--lr", "0.002"]))
    ['command', 'lr', 'out', 'train']
    """
    parser = build_parser()
    pending = [parser]
    while pending:
        for action in pending.pop()._actions:
            action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    given = vars(parser.parse_args(argv))
    return {k for k in given if k != "func"}


def _json_escape(error: UnicodeError) -> tuple[str, int]:
    """A codec error handler: what an encoding cannot hold as JSON's ``\\uXXXX`` (a pair
    above U+FFFF), so JSON lines stay JSON and text stays readable."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    out = []
    for char in error.object[error.start : error.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), error.end


def _usable_streams() -> Callable[[], None]:
    """Standard streams the commands can use whatever the caller left: a closed one
    (``>&-``: Python's ``None``) reads and writes nothing, text that the stream's
    encoding cannot hold (``PYTHONIOENCODING=ascii``) is written as JSON's ``\\u00e9``
    escapes rather than failing once the work is done (``UnicodeEncodeError``), and a
    path that is not UTF-8 as its own bytes."""
    closed: list[tuple[str, Any]] = []  # (name, the devnull put there)
    errors: list[tuple[Any, str]] = []  # (stream, its error handler before)
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            devnull = open(os.devnull, mode, encoding="utf-8")  # noqa: SIM115
            setattr(sys, name, devnull)
            closed.append((name, devnull))
    for stream in (sys.stdout, sys.stderr):
        if not hasattr(stream, "reconfigure"):
            continue
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        before = getattr(stream, "errors", None) or "strict"
        if encoding != "utf8":
            codecs.register_error("rnnkit.json_escape", _json_escape)
            stream.reconfigure(errors="rnnkit.json_escape")
        elif before == "strict":
            # a path of other bytes than UTF-8 (lone surrogates) is written as its bytes
            stream.reconfigure(errors="surrogateescape")
        else:
            continue
        errors.append((stream, before))

    def restore() -> None:
        """The caller's streams as they were (``main()`` called from a program)."""
        for stream, before in errors:
            with contextlib.suppress(OSError, ValueError):
                stream.reconfigure(errors=before)
        for name, devnull in closed:
            setattr(sys, name, None)
            devnull.close()

    return restore


class Terminated(SystemExit):
    """SIGTERM or SIGHUP (``timeout``, a service stopped, a terminal closed) while a
    command runs: raised so that the file being written is removed (the kill left a
    half-written hidden file); the process then dies by the signal all the same, as its
    parent expects (torchrun and systemd read a death by SIGTERM, not a status 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def _ended_cleanly_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command as an exception while it runs (training's own
    loop turns them into a stop after the step, with a snapshot), where they had their
    default action, which killed it mid-write; a handler or ``nohup``'s ignore is kept.
    Once the exception has unwound, the signal's default action ends the process."""
    names = ("SIGTERM", "SIGHUP")
    signums = [getattr(signal, n) for n in names if hasattr(signal, n)]
    main_thread = threading.current_thread() is threading.main_thread()
    mine = [s for s in signums if main_thread and signal.getsignal(s) is signal.SIG_DFL]
    for signum in mine:
        signal.signal(signum, _terminate)
    try:
        yield
    except Terminated as stop:
        for signum in mine:
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        os.kill(os.getpid(), stop.signum)  # dies here, by the signal
        raise  # (where the signal cannot end a process)
    finally:
        for signum in mine:
            if signal.getsignal(signum) is _terminate:
                signal.signal(signum, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    loaded()  # Ctrl-C from here on is KeyboardInterrupt, said in one line below
    restore = _usable_streams()
    try:
        with _ended_cleanly_by_signals():
            return _main(argv)
    except KeyboardInterrupt:  # while the options are read (commands catch their own)
        print("rnnkit: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`rnnkit score ... | head -3`): stop quietly, as other Unix
        # tools do. Python's documented recipe: point stdout at devnull, so the flush at
        # exit does not fail a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    finally:
        restore()


def _suggestion(parser: argparse.ArgumentParser, given: Sequence[str], named: bool = False) -> str:
    """`` (did you mean --hidden?)`` for the first unknown option of ``given`` close to
    one of the command's (a typo: ``--hiden``), as a configuration file's unknown key is
    told; ``named``: the typo is named too (``--checkpont: did you mean ...``)."""
    known = [o for action in parser._actions for o in action.option_strings if o[:2] == "--"]
    for arg in given:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
            if close:
                return (
                    f" ({name}: did you mean {close[0]}?)"
                    if named
                    else f" (did you mean {close[0]}?)"
                )
    return ""


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    _parsing[:] = sys.argv[1:] if argv is None else argv
    args, extras = parser.parse_known_args(argv)
    if extras:  # named by the command's parser ("rnnkit score: error: ..."), not rnnkit's
        owner = _commands(parser).get(args.command, parser)
        owner.error(f"unrecognized arguments: {' '.join(extras)}{_suggestion(owner, extras)}")
    if args.command is None:
        # No command is a usage error (status 2, like any other), shown with the list.
        parser.print_help(sys.stderr)
        print("rnnkit: error: no command given (one of the commands above)", file=sys.stderr)
        return 2
    args.explicit = explicit_options(argv)
    level = args.verbose - args.quiet
    args.quiet = level < 0  # what the commands read: below the default level
    before = messages.LOGGER.level
    messages.set_verbosity(level)
    try:
        return _run(args)
    finally:
        messages.LOGGER.setLevel(before)  # main() called in-process leaves the level as it was


def _check_device(args: argparse.Namespace) -> None:
    """``--device`` of a command that loads a run, checked here to name the option: the
    loaders are also the Python API's, whose message names their ``device=`` argument.
    (``train`` checks its configuration's ``--device`` itself, when it trains.)"""
    device = getattr(args, "device", None)
    if args.command != "train" and isinstance(device, str):
        from rnnkit.app.tasks.settings import choose_device

        choose_device(device, "--device")


def _run(args: argparse.Namespace) -> int:
    from rnnkit.training.interrupt import hold_sigterm_until_said

    # Training ended by an error: a SIGTERM (torchrun's, after another process died)
    # waits until the error's line below is said, instead of killing before it.
    with hold_sigterm_until_said():
        return _said(args)


def _said(args: argparse.Namespace) -> int:
    """Run the command; its error as one line (:func:`~rnnkit.app.cli.ranks.say_error`)."""
    from rnnkit.training.manifest import skipping_checksums

    try:
        _check_device(args)
        with skipping_checksums() if getattr(args, "skip_checksums", False) else nullcontext():
            code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit after the last line
        return code
    except BrokenPipeError:
        raise
    except (RnnkitError, OSError) as exc:
        code = getattr(exc, "exit_code", 2)
        kind = "error" if code == 2 else "stopped"
        text = _os_error(exc) if isinstance(exc, OSError) else str(exc)
        after_peer = getattr(exc, "after_peer", False)
        if kind == "stopped" and not after_peer and is_other_rank():
            # a stop every process takes at the same step (Ctrl-C to torchrun): rank 0
            # says it, once
            return code
        # another process's failure reaching this one: that one says the cause
        say_error(f"rnnkit {args.command}: {kind}: {text}", after_peer)
        return code
    except KeyboardInterrupt:
        print(f"rnnkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as exc:
        # torch reports a failed allocation as RuntimeError ("DefaultCPUAllocator: can't
        # allocate memory", "CUDA out of memory"); any other RuntimeError is a bug to show.
        if not isinstance(exc, MemoryError) and not _out_of_memory(exc):
            raise
        if args.command == "train":
            hint = "use smaller sizes (--hidden, --embedding, --batch-size, --max-len)"
        elif args.command == "gradcheck":
            hint = "use smaller sizes (--hidden, --layers, --batch, --steps)"
        elif hasattr(args, "batch_size"):  # the model is the run's: only the batch is given
            hint = "free memory, or give a smaller --batch-size"
        elif hasattr(args, "checkpoint"):
            hint = "free memory (the run's model and data need it)"
        else:
            hint = "free memory, or give smaller inputs"
        print(
            f"rnnkit {args.command}: error: out of memory ({_first_line(exc)}); {hint}",
            file=sys.stderr,
        )
        return 2


#: An OSError's kind in the words of rnnkit's own messages (``PATH: file not found``).
_OS_REASONS: tuple[tuple[type[OSError], str], ...] = (
    (FileNotFoundError, "file not found"),
    (IsADirectoryError, "is a directory, not a file"),
    (NotADirectoryError, "a part of the path is not a directory"),
    (PermissionError, "permission denied"),
)


def _os_error(exc: OSError) -> str:
    """``PATH: reason`` for an OSError that names a file, as every reader of rnnkit says
    it (Python's own text is ``[Errno 2] No such file or directory: 'x'``).

    >>> _os_error(FileNotFoundError(2, "No such file or directory", "in.txt"))
    'in.txt: file not found'
    >>> _os_error(OSError(28, "No space left on device", "out.jsonl"))
    'out.jsonl: No space left on device'
    """
    if exc.filename is None:
        return exc.strerror or str(exc)
    reason = next((text for kind, text in _OS_REASONS if isinstance(exc, kind)), None)
    return f"{exc.filename}: {reason or exc.strerror or exc}"


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
