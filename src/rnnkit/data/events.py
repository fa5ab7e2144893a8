"""Event sessions on disk: the JSON-lines format of the ``events`` task, read and written.

One line is one session (one process's system calls, one request's log lines, ...)::

    {"session": "web-17", "events": ["openat:ok", "read:ok", "close:ok"], "label": 0}

Rules, each broken rule a :class:`~rnnkit.errors.DataError` naming file and line:

- ``session``: a non-empty string, or an integer (stored as its decimal string, because
  ids such as process ids are often numbers); unique within a file.
- ``events``: a non-empty list of non-empty strings. Numbers are *not* converted: ``1``,
  ``1.0`` and ``"1"`` would silently become one token or three, so the writer of the file
  must say which it means by quoting.
- ``label`` (optional): ``0`` (normal) or ``1`` (anomalous), or ``null`` for unlabelled.
  ``true``/``false`` are refused so a boolean column is not mistaken for a label.
- No other keys: a misspelt ``"lable"`` would otherwise leave a session silently
  unlabelled.
- ``params`` (optional): one list per event, in the events' order, of that event's
  *parameter values*: finite numbers, or ``null`` where the event's line held no number
  in that place (``rnnkit sessions --from log --params`` writes them: the numbers of the
  template's variable parts, the seconds since the session's previous event first).
  The parameter-value model (``rnnkit train --task params``) reads them; the ``events``
  task ignores them.
- Blank lines are skipped; objects may not repeat a key.
- Size limits (:mod:`rnnkit.data.limits`): a line is at most :data:`MAX_LINE_BYTES`
  (10 MiB), a session at most 1,000,000 events, JSON nested at most 100 levels; each is
  raised with an environment variable or a keyword argument, as the error says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from os import PathLike
from typing import IO, Any

from rnnkit.data.files import atomic_write_bytes
from rnnkit.data.limits import MAX_JSON_LINE_BYTES, MAX_SEQ_LEN, loads_json
from rnnkit.data.lines import invalid_utf8_in_text_stream, text_stream_start
from rnnkit.data.utf8 import decode_utf8
from rnnkit.errors import DataError

__all__ = [
    "MAX_LINE_BYTES",
    "Session",
    "iter_sessions",
    "parse_session",
    "read_sessions",
    "sessions_text",
    "write_sessions",
]

#: Longest accepted line. A session of a few hundred thousand events fits comfortably;
#: beyond this, a file is more likely hostile or corrupt than real, and reading it whole
#: into memory would be the failure.
MAX_LINE_BYTES = 10 * 1024 * 1024

_KEYS = ("session", "events", "label", "params")

# Said where a line is not a JSON object at all (plain text, CSV, a list): what one is.
_FORMAT_HINT = (
    'each line is one session, a JSON object such as {"session": "s1", "events": ["open", '
    '"read"]} (rnnkit sessions writes them from strace output or log files)'
)


@dataclass
class Session:
    """One example of the ``events`` task: an id, its events in order, an optional label.

    Args:
        session: identifier, unique within a file.
        events: the tokens, in the order they happened (at least one).
        label: ``0`` normal, ``1`` anomalous, ``None`` unlabelled.
        params: per event, its parameter values (numbers, ``None`` where missing), or
            ``None`` for a session without them.

    >>> Session("p1", ["openat:ok", "read:ok"], label=0)
    Session(session='p1', events=['openat:ok', 'read:ok'], label=0)
    """

    session: str
    events: list[str] = field(default_factory=list)
    label: int | None = None
    # Not in the repr when absent: most sessions have none (system calls, plain logs).
    params: list[list[float | None]] | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        params = "" if self.params is None else f", params={self.params!r}"
        return (
            f"Session(session={self.session!r}, events={self.events!r}, "
            f"label={self.label!r}{params})"
        )

    def to_json(self) -> str:
        """The session as one JSON line (without newline); ``label`` omitted when None.

        >>> Session("p1", ["a", "b"]).to_json()
        '{"session": "p1", "events": ["a", "b"]}'
        """
        record: dict[str, Any] = {"session": self.session, "events": self.events}
        if self.label is not None:
            record["label"] = self.label
        if self.params is not None:
            record["params"] = self.params
        # ensure_ascii=False keeps non-ASCII tokens readable and the file smaller.
        return json.dumps(record, ensure_ascii=False)


def _type_name(value: object) -> str:
    return {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def parse_session(
    text: str,
    path: str | PathLike[str] | None = None,
    line: int | None = None,
    *,
    max_seq_len: int | None = None,
) -> Session:
    """Parse and validate one JSON line into a :class:`Session`.

    Args:
        text: the line, with or without its newline.
        path, line: where it came from, only for error messages.
        max_seq_len: most events of one session (default :data:`~rnnkit.data.limits.MAX_SEQ_LEN`).

    Raises:
        DataError: anything wrong with the line, located by ``path:line``.

    >>> parse_session('{"session": 7, "events": ["a", "b"], "label": 1}')
    Session(session='7', events=['a', 'b'], label=1)
    >>> parse_session('{"session": "s", "events": []}', "x.jsonl", 4)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: x.jsonl:4: session 's' has no events
    """

    def fail(message: str) -> DataError:
        return DataError(message, path=path, line=line)

    # loads_json turns deep nesting ("[[[[..."), 5,000-digit integers and a key given
    # twice (two labels on one line: a broken writer) into DataError naming path:line.
    try:
        record = loads_json(text, path, line, only_text=True)
    except DataError as exc:
        if text.lstrip("\ufeff \t").startswith("{"):  # a broken object: the error says it
            raise
        raise fail(f"{exc.message}; {_FORMAT_HINT}") from None  # another format altogether
    if not isinstance(record, dict):
        raise fail(f"expected a JSON object, got {_type_name(record)}; {_FORMAT_HINT}")
    unknown = [key for key in record if key not in _KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (expected session, events, label, params)")

    if "session" not in record:
        raise fail("missing key 'session'")
    session_id = record["session"]
    if isinstance(session_id, bool) or not isinstance(session_id, (str, int)):
        raise fail(f"'session' must be a string or an integer, got {_type_name(session_id)}")
    session_id = str(session_id)
    if not session_id:
        raise fail("'session' is an empty string")

    if "events" not in record:
        raise fail(f"session {session_id!r}: missing key 'events'")
    events = record["events"]
    if not isinstance(events, list):
        raise fail(f"session {session_id!r}: 'events' must be a list, got {_type_name(events)}")
    if not events:
        raise fail(f"session {session_id!r} has no events")
    limit = MAX_SEQ_LEN.value(max_seq_len)
    if len(events) > limit:
        raise fail(
            MAX_SEQ_LEN.exceeded(f"session {session_id!r} has {len(events):,} events", limit)
        )
    for index, event in enumerate(events):
        if not isinstance(event, str):
            raise fail(
                f"session {session_id!r}: events[{index}] is {_type_name(event)}, "
                "expected a string (quote numeric events)"
            )
        if not event:
            raise fail(f"session {session_id!r}: events[{index}] is an empty string")

    label = record.get("label")
    if label is not None and (isinstance(label, bool) or label not in (0, 1)):
        raise fail(f"session {session_id!r}: 'label' must be 0 or 1, got {json.dumps(label)}")
    params = record.get("params")
    if params is not None:
        params = _parse_params(params, session_id, len(events), fail)
    # label in (0, 1) also admits 1.0; store the int so the written file round-trips.
    return Session(session_id, events, None if label is None else int(label), params)


def _parse_params(
    params: Any, session_id: str, n_events: int, fail: Any
) -> list[list[float | None]]:
    """``params`` checked: one list per event of finite numbers or nulls."""
    if not isinstance(params, list):
        raise fail(f"session {session_id!r}: 'params' must be a list, got {_type_name(params)}")
    if len(params) != n_events:
        raise fail(
            f"session {session_id!r}: 'params' has {len(params)} entries for {n_events} events "
            "(one list per event)"
        )
    out: list[list[float | None]] = []
    for index, values in enumerate(params):
        if not isinstance(values, list):
            raise fail(
                f"session {session_id!r}: params[{index}] is {_type_name(values)}, expected a "
                "list of numbers"
            )
        row: list[float | None] = []
        for j, value in enumerate(values):
            if value is None:
                row.append(None)
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise fail(
                    f"session {session_id!r}: params[{index}][{j}] is {_type_name(value)}, "
                    "expected a number or null"
                )
            try:
                number = float(value)
            except OverflowError:  # an integer of 400 digits
                number = math.inf
            if not math.isfinite(number):
                raise fail(f"session {session_id!r}: params[{index}][{j}] is not finite")
            row.append(number)
        out.append(row)
    return out


def _read_line(
    fileobj: IO[Any], path: str | PathLike[str] | None, line: int, limit: int, start: int | None
) -> str | None:
    """The next line as text, None at end of file; refuses lines over ``limit`` bytes.

    ``start``: :func:`~rnnkit.data.lines.text_stream_start` of a text stream, so that its
    decoding error can name the exact line."""
    # Never more than limit + 1 in memory: a 5 GB line costs one bounded read.
    try:
        raw: str | bytes = fileobj.readline(limit + 1)
    except UnicodeDecodeError as exc:  # a text stream: it decodes ahead of this line
        raise invalid_utf8_in_text_stream(fileobj, exc, path, line, start, 4 * limit) from None
    if not raw:
        return None
    # On a text stream the limit counts characters (up to 4 bytes each): still bounded.
    if len(raw) > limit:
        message = MAX_JSON_LINE_BYTES.exceeded("line too long", limit)
        raise DataError(message, path=path, line=line)
    if isinstance(raw, bytes):
        return decode_utf8(raw, path, line)
    return raw


def iter_sessions(
    fileobj: IO[Any],
    path: str | PathLike[str] | None = None,
    *,
    unique: bool = True,
    max_line_bytes: int | None = None,
    max_seq_len: int | None = None,
) -> Iterator[tuple[int, Session]]:
    """Stream sessions from an open file, one per JSON line, as ``(line_number, session)``.

    Reads one line at a time, so it serves growing files and pipes (``--follow``).

    Args:
        fileobj: a binary or text file object (binary is decoded as UTF-8). Invalid UTF-8
            in a text stream (``open(path)``) is the same error naming the exact line
            where the stream's ``buffer`` can be read again, else the line being read.
        path: file name for error messages (default: ``fileobj.name`` when it has one).
        unique: refuse a session id seen earlier in the stream.
        max_line_bytes: longest line (default :data:`MAX_LINE_BYTES`, or the environment
            variable ``RNNKIT_MAX_JSON_LINE_BYTES``).
        max_seq_len: most events of a session (:data:`~rnnkit.data.limits.MAX_SEQ_LEN`).

    Raises:
        DataError: on the first bad line, naming ``path:line``.

    >>> import io
    >>> stream = io.StringIO(
    ...     '{"session": "a", "events": ["x"]}\\n\\n{"session": "b", "events": ["y"]}\\n'
    ... )
    >>> [(n, s.session) for n, s in iter_sessions(stream)]
    [(1, 'a'), (3, 'b')]
    """
    if path is None:
        name = getattr(fileobj, "name", None)
        path = name if isinstance(name, str) else None
    limit = MAX_JSON_LINE_BYTES.value(max_line_bytes, default=MAX_LINE_BYTES)
    seen: dict[str, int] = {}
    start = text_stream_start(fileobj)
    line = 0
    while True:
        line += 1
        text = _read_line(fileobj, path, line, limit, start)
        if text is None:
            return
        if line == 1 and text.startswith("\ufeff"):
            text = text[1:]  # a byte-order mark from a Windows editor is not content
        if not text.strip():
            continue
        # Without its newline, so a "column" in a JSON error is on this line.
        session = parse_session(text.rstrip("\r\n"), path, line, max_seq_len=max_seq_len)
        if unique:
            if session.session in seen:
                raise DataError(
                    f"duplicate session id {session.session!r} (first at line "
                    f"{seen[session.session]})",
                    path=path,
                    line=line,
                )
            seen[session.session] = line
        yield line, session


def read_sessions(
    path: str | PathLike[str],
    *,
    max_line_bytes: int | None = None,
    max_seq_len: int | None = None,
) -> list[Session]:
    """Read a whole JSON-lines session file (the ``events`` data format).

    Args:
        path: the file.
        max_line_bytes, max_seq_len: size limits (see :func:`iter_sessions`).

    Raises:
        DataError: a bad line (``path:line: problem``), or a file with no session.
        OSError: the file cannot be opened.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "s.jsonl")
    >>> write_sessions(path, [Session("a", ["x", "y"], 1)])
    >>> read_sessions(path)
    [Session(session='a', events=['x', 'y'], label=1)]
    """
    with open(path, "rb") as fileobj:
        sessions = [
            session
            for _, session in iter_sessions(
                fileobj, path, max_line_bytes=max_line_bytes, max_seq_len=max_seq_len
            )
        ]
    if not sessions:
        raise DataError("no sessions (the file is empty)", path=path)
    return sessions


def sessions_text(sessions: Iterable[Session], path: str | PathLike[str] = "<sessions>") -> str:
    """The JSON-lines text of sessions, each line checked by :func:`read_sessions`' rules.

    Args:
        sessions: the sessions, in order.
        path: where the text is going, for error messages only.

    Raises:
        DataError: a session that breaks the format (named by its id), or a duplicate id.

    >>> print(sessions_text([Session("a", ["x"]), Session("b", ["y", "z"], 0)]), end="")
    {"session": "a", "events": ["x"]}
    {"session": "b", "events": ["y", "z"], "label": 0}
    """
    lines: list[str] = []
    seen: set[str] = set()
    for index, session in enumerate(sessions):
        try:
            text = session.to_json()
            # Round-trip through the reader: one set of rules, and what is written reads.
            parse_session(text)
        except (DataError, TypeError, ValueError) as exc:
            message = exc.message if isinstance(exc, DataError) else str(exc)
            raise DataError(f"cannot write session #{index}: {message}", path=path) from None
        if session.session in seen:
            raise DataError(f"duplicate session id {session.session!r}", path=path)
        seen.add(session.session)
        lines.append(text + "\n")
    return "".join(lines)


def write_sessions(path: str | PathLike[str], sessions: Iterable[Session]) -> None:
    """Write sessions as JSON lines, atomically: readers see the old file or the new one.

    The sessions are validated by the same rules as :func:`read_sessions` first (see
    :func:`sessions_text`), so what is written can always be read back.

    Args:
        path: destination; its directory must exist.
        sessions: the sessions, written in order.

    Raises:
        DataError: a session that breaks the format (named by its id), before anything is
            written.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "s.jsonl")
    >>> write_sessions(path, [Session("a", ["x"]), Session("b", ["y", "z"], 0)])
    >>> from pathlib import Path
    >>> print(Path(path).read_text(), end="")
    {"session": "a", "events": ["x"]}
    {"session": "b", "events": ["y", "z"], "label": 0}
    """
    text = sessions_text(sessions, path)
    # The one atomic writer: the umask's permissions, and never a device or FIFO replaced.
    atomic_write_bytes(path, text.encode("utf-8"))
