"""The line format of streamed events (``rnnkit score --follow``): one JSON object a line.

::

    {"session": "web-17", "event": "openat:ok"}
    {"session": "web-17", "events": ["read:ok", "close:ok"]}
    {"session": "web-17", "end": true}
    {"session": "web-18", "event": "exit_group:noreturn", "end": true}

Keys: ``session`` (a string, or an integer read as its decimal string), ``event`` (one
non-empty string) or ``events`` (a list of them), ``end`` (``true``: the session is over;
its end ``</s>`` is scored, as in batch scoring). Nothing else; a bad line is reported
(``file:line: problem``) and skipped, never fatal. An event after a session's end opens a
new session with the same id (:class:`~rnnkit.anomaly.streaming.StreamScorer`).
"""

from __future__ import annotations

from typing import NamedTuple

from rnnkit.anomaly.follow import OVERLONG
from rnnkit.data.events import MAX_LINE_BYTES
from rnnkit.data.limits import MAX_JSON_LINE_BYTES, loads_json
from rnnkit.data.utf8 import decode_utf8
from rnnkit.errors import DataError

__all__ = ["StreamItem", "parse_stream_line"]

_KEYS = ("session", "event", "events", "end")


class StreamItem(NamedTuple):
    """One input line: events of a session, and whether the session ends after them."""

    session: str
    events: tuple[str, ...]
    end: bool = False


def parse_stream_line(
    text: str | bytes, path: str | None = None, line: int | None = None
) -> StreamItem:
    """Parse one line of the streaming format (see the module docstring).

    Raises:
        DataError: naming ``path:line`` and the problem.

    >>> parse_stream_line('{"session": 7, "event": "open", "end": true}')
    StreamItem(session='7', events=('open',), end=True)
    >>> parse_stream_line('{"session": "a"}', "in.jsonl", 3)
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: in.jsonl:3: session 'a': no "event", "events" or "end": true
    """

    def fail(message: str) -> DataError:
        return DataError(message, path=path, line=line)

    if isinstance(text, bytes):
        if text is OVERLONG:
            limit = MAX_JSON_LINE_BYTES.value(default=MAX_LINE_BYTES)
            raise fail(MAX_JSON_LINE_BYTES.exceeded("line too long", limit))
        text = decode_utf8(text, path, line)
    # Deep nesting and 5,000-digit integers are DataErrors naming path:line here too.
    record = loads_json(text, path, line, only_text=True)
    if not isinstance(record, dict):
        raise fail("expected a JSON object")
    unknown = [k for k in record if k not in _KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (expected session, event or events, end)")
    sid = record.get("session")
    if isinstance(sid, bool) or not isinstance(sid, (str, int)) or sid == "":
        raise fail("'session' must be a non-empty string or an integer")
    sid = str(sid)
    if "event" in record and "events" in record:
        raise fail(f"session {sid!r}: both 'event' and 'events'")
    events = [record["event"]] if "event" in record else record.get("events", [])
    if not isinstance(events, list):
        raise fail(f"session {sid!r}: 'events' must be a list")
    for e in events:
        if not isinstance(e, str) or not e:
            raise fail(f"session {sid!r}: an event must be a non-empty string, got {e!r}")
    end = record.get("end", False)
    if not isinstance(end, bool):
        raise fail(f"session {sid!r}: 'end' must be true or false")
    if not events and not end:
        raise fail(f'session {sid!r}: no "event", "events" or "end": true')
    return StreamItem(sid, tuple(events), end)
