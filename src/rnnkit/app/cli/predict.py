"""``rnnkit predict``: apply a trained model to new, unlabelled input, one JSON line out per
input line.

::

    rnnkit predict --checkpoint runs/tagger --input sentences.txt
    echo "the cat sat" | rnnkit predict --checkpoint runs/tagger --input -

What a line is and what comes out depends on the run's task (each task module's
``predictor``):

* ``tag``: whitespace-separated tokens → ``{"tokens", "tags", "unknown"}``;
* ``classify``: a text → ``{"label", "probabilities": {label: p}, "tokens", "unknown"}``
  (``--inputs vectors``: a sequence as JSON, ``{"seq": [...]}`` → ``{"label",
  "probabilities", "steps"}``);
* ``seq2seq``: a source → ``{"input", "output", "unknown"}`` (batched, ``--beam``);
* ``lm``: a text (``label<TAB>text`` for a class-conditional run) → ``{"tokens",
  "logprobs" (nats), "surprise" (bits), "nats", "unknown"}``;
* ``events``: a session as JSON → the verdict record of ``rnnkit score`` (with ``--params
  RUN``, also a parameter-value run's verdict: anomalous when either model says so);
* ``params``: a session as JSON with its ``"params"`` → the parameter model's record;
* ``regress``: a sequence as JSON (``{"seq": [...]}``) → ``{"prediction"[, "variance"]}``.

Input is read line by line and answered in batches of at most ``--batch-size`` lines; a
batch is cut early whenever no further line is waiting on the input, so a pipe gets each
answer as soon as its line arrives (streaming). A bad line is a one-line error naming the
file (``<stdin>``) and line (invalid UTF-8 too: each line is decoded alone), after the
answers of every line before it, in its batch too. Every line is read in one bounded
``readline``: a line of more than ``max_json_line_bytes`` bytes (a JSON line:
``events``, ``params``, ``regress``) or ``max_line_chars`` characters (a text line: the
other tasks) is refused (see :mod:`rnnkit.data.limits`), so ``--input /dev/zero`` fails
at once.
"""

from __future__ import annotations

import argparse
import io
import os
import select
import stat
import sys
from collections.abc import Iterator
from typing import IO, Any

from rnnkit.app.cli.aliases import add_max_len_option, warn_deprecated
from rnnkit.app.cli.run_options import add_device_option, add_run_option
from rnnkit.data.limits import MAX_JSON_LINE_BYTES, MAX_LINE_CHARS, Limit
from rnnkit.data.lines import text_lines
from rnnkit.errors import ConfigError, DataError
from rnnkit.generation.options import MAX_BEAM, MAX_GENERATE_TOKENS

__all__ = ["read_batches", "register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "predict",
        help="apply a trained model to new input (JSON lines out)",
        description="Apply a trained model to unlabelled input: one JSON line per input line "
        "(tags, a label with probabilities, a transduction, per-token log-probabilities, "
        "or a session verdict, by the run's task).",
    )
    p.add_argument("--checkpoint", required=True, help="run directory written by train")
    p.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="one input per line (UTF-8); '-' reads standard input as it arrives",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="most lines per forward pass (default: the run's batch size; events 64)",
    )
    add_run_option(p, "beam", note="seq2seq; 1 = greedy")
    add_max_len_option(p, "seq2seq: most output tokens (default: the run's --max-len)")
    p.add_argument(
        "--top", type=int, default=5, help="events: list the K most surprising events (default 5)"
    )
    p.add_argument(
        "--params",
        metavar="RUN",
        help="events: also judge each event's parameter values with this params run",
    )
    add_device_option(p)
    p.set_defaults(func=run)


def _flag(option: str) -> str:
    """The option as it is spelled now: ``max_length`` is ``--max-len`` (``--max-length``,
    its older spelling, was what the messages named)."""
    return "--max-len" if option == "max_length" else "--" + option.replace("_", "-")


#: Options of one task only, refused for the others (what argv set counts).
TASK_ONLY = {"beam": "seq2seq", "max_length": "seq2seq", "top": "events", "params": "events"}


def _waiting(stream: IO[bytes]) -> bool:
    """Whether another line can be read at once: always for a regular file (or a stream
    without a descriptor), else when the descriptor is readable (a line still in the
    stream's own buffer may end a batch early: only the batch is smaller)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return True
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return True
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


#: Tasks whose input line is a JSON document (bounded as a JSON line, not a text line).
JSON_TASKS = ("events", "params", "regress")


def read_batches(
    stream: IO[bytes], name: str, batch_size: int, limit: Limit = MAX_LINE_CHARS
) -> Iterator[tuple[list[str], list[tuple[str, int]]]]:
    """``(lines, [(name, line number)])`` batches of at most ``batch_size`` lines, without
    their line ends; a batch ends early when no further line is waiting (streaming). Each
    line is read in one bounded read and decoded alone (:func:`~rnnkit.data.lines.text_lines`):
    a line over ``limit`` or not UTF-8 is a :class:`DataError` naming its own line."""
    lines: list[str] = []
    where: list[tuple[str, int]] = []
    read = text_lines(stream, name, limit)
    while True:
        try:
            number, text = next(read)
        except StopIteration:
            break
        except DataError as exc:  # a line not UTF-8, or too long: the lines before it
            if lines:  # are answered first, as those before any other bad line are
                yield lines, where
            raise exc from None
        lines.append(text.rstrip("\r\n"))
        where.append((name, number))
        if len(lines) >= batch_size or not _waiting(stream):
            yield lines, where
            lines, where = [], []
    if lines:
        yield lines, where


def _print(record: dict[str, Any]) -> None:
    # strict JSON: a non-finite float is null (``json.dumps`` writes ``Infinity``/``NaN``,
    # which a strict reader refuses; its ``default`` is never asked about a float)
    from rnnkit.training.checkpoint import dumps_strict

    sys.stdout.write(dumps_strict(record, ensure_ascii=False) + "\n")


def run(args: argparse.Namespace) -> int:
    from rnnkit.app.tasks.registry import task_module, task_of_run

    warn_deprecated(args)
    if not args.input:
        raise ConfigError("--input is empty: name a file, or - for standard input")
    task = task_of_run(args.checkpoint)
    explicit = getattr(args, "explicit", None)  # set by cli.main
    for option, owner in TASK_ONLY.items():
        if explicit is not None:
            given = option in explicit
        else:
            given = option != "top" and getattr(args, option, None) is not None
        if option == "top" and task == "params":
            continue  # a params run lists its most unusual vectors
        if given and task != owner:
            flag = _flag(option)
            raise ConfigError(
                f"{flag} does not apply to a checkpoint of --task {task} (only to {owner})"
            )
    for option in ("batch_size", "beam", "max_length", "top"):
        value = getattr(args, option)
        minimum = 0 if option == "top" else 1
        flag = _flag(option)
        if value is not None and value < minimum:
            raise ConfigError(f"{flag} must be ≥ {minimum}, got {value}")
    if args.beam is not None and args.beam > MAX_BEAM:
        raise ConfigError(f"--beam must be at most {MAX_BEAM}, got {args.beam}")
    if args.max_length is not None and args.max_length > MAX_GENERATE_TOKENS:
        raise ConfigError(
            f"--max-len must be at most {MAX_GENERATE_TOKENS:,}, got {args.max_length:,}"
        )
    module = task_module(task)
    predict = module.predictor(
        args.checkpoint,
        batch_size=args.batch_size,
        device=args.device,
        beam=args.beam,
        max_length=args.max_length,
        top=args.top,
        params=getattr(args, "params", None),
    )
    batch_size = args.batch_size or 32
    limit = MAX_JSON_LINE_BYTES if task in JSON_TASKS else MAX_LINE_CHARS
    if args.input == "-":
        # The bytes, decoded line by line as strict UTF-8 whatever the locale says.
        stream: IO[bytes] | None = getattr(sys.stdin, "buffer", None)
        if stream is None:  # a text stream put in place by a program (io.StringIO): in memory
            stream = io.BytesIO(sys.stdin.read().encode("utf-8"))
        return _answer(predict, stream, "<stdin>", batch_size, limit)
    try:
        with open(args.input, "rb") as f:
            return _answer(predict, f, args.input, batch_size, limit)
    except IsADirectoryError:
        raise DataError("is a directory, not a file of lines", args.input) from None


def _answer(predict: Any, stream: IO[bytes], name: str, batch_size: int, limit: Limit) -> int:
    for lines, where in read_batches(stream, name, batch_size, limit):
        _answer_batch(predict, lines, where)
        sys.stdout.flush()
    return 0


def _answer_batch(predict: Any, lines: list[str], where: list[tuple[str, int]]) -> None:
    """Print the answers of one batch. A bad line fails the whole batch (it is answered
    in one pass), so the lines before it are answered again without it and printed
    first: the output holds every answer up to the line the error names."""
    try:
        records = list(predict(lines, where))
    except DataError as exc:
        place = (exc.path, exc.line)
        if place in where and where.index(place) > 0:
            k = where.index(place)
            _answer_batch(predict, lines[:k], where[:k])  # (an earlier bad line raises)
        raise
    for record in records:
        _print(record)
