"""One log line's fields: the header format as a regex, the session id found and masked,
the time read from header fields; bad formats, lines and times named."""

from __future__ import annotations

import re
import sys
from datetime import datetime, timedelta, timezone

import pytest

from rnnkit.data.log_fields import (
    LineFields,
    _iso_for_python310,
    compile_log_format,
    parse_log_time,
)
from rnnkit.errors import ConfigError, DataError

FORMAT = "<Date> <Time> <Pid> <Level> <Content>"


def test_log_format_regex_by_hand() -> None:
    rx = compile_log_format("<Date> <Time> [<Thread>] <Level>  <Component> - <Content>")
    assert rx.pattern == (
        r"^(?P<Date>.*?)\s+(?P<Time>.*?)\s+\[(?P<Thread>.*?)\]\s+(?P<Level>.*?)\s+"
        r"(?P<Component>.*?)\s+\-\s+(?P<Content>.*)$"
    )
    m = rx.match("2026-12-01 10:00:00,1 [main-3] ERROR   a.b.C - req 7: failed - retry")
    assert m is not None and m.groupdict() == {
        "Date": "2026-12-01",
        "Time": "10:00:00,1",
        "Thread": "main-3",
        "Level": "ERROR",
        "Component": "a.b.C",
        "Content": "req 7: failed - retry",
    }
    for bad, message in (
        ("<Date> <Date> <Content>", "names the field <Date> twice"),
        ("<1x> <Content>", "field <1x> is not a name"),
        ("<Date> <Time>", "has no <Content> field"),
    ):
        with pytest.raises(ConfigError, match=message):
            compile_log_format(bad)


def test_the_session_id_is_masked_in_the_message_only() -> None:
    fields = LineFields(r"req=(\w+)", log_format=FORMAT)
    session, message, header = fields.split("2026-12-01 10:00:01 42 INFO req=ab7 GET /", None, 1)
    assert (session, message) == ("ab7", "req=<SESSION> GET /")
    assert header is not None and header.group("Pid") == "42"
    # Found in the header (the pid), the id leaves the message as it is.
    fields = LineFields(r"^\S+ \S+ (\d+)", log_format=FORMAT)
    assert fields.split("2026-12-01 10:00:01 42 INFO req=ab7 GET /", None, 1)[:2] == (
        "42",
        "req=ab7 GET /",
    )
    by_field = LineFields(log_format=FORMAT, session_field="Level")
    assert by_field.split("2026-12-01 10:00:01 42 WARN disk full", None, 1)[:2] == (
        "WARN",
        "disk full",
    )


def test_blank_and_unfitting_lines() -> None:
    fields = LineFields(r"req=(\w+)", log_format=FORMAT)
    assert fields.split("   ", "app.log", 3) == (None, "", None)
    with pytest.raises(DataError) as info:
        fields.split("a stack trace line", "app.log", 4)
    assert str(info.value) == (
        f"app.log:4: the line does not match log_format='{FORMAT}' (starts 'a stack trace line')"
    )
    cli = LineFields(r"req=(\w+)", log_format=FORMAT, option_names=True)
    with pytest.raises(DataError) as info:
        cli.split("a stack trace line", "app.log", 4)
    assert str(info.value) == (
        f"app.log:4: the line does not match --log-format '{FORMAT}' (starts 'a stack trace line')"
    )


def test_time_from_header_fields() -> None:
    fields = LineFields(r"req=(\w+)", log_format=FORMAT, params=True, time_fields=("Date", "Time"))
    first = fields.split("2026-12-01 10:00:01.25 42 INFO req=a x", None, 1)[2]
    later = fields.split("2026-12-01 10:01:00 42 INFO req=a y", None, 2)[2]
    assert fields.time(later, None, 2) - fields.time(first, None, 1) == 58.75
    bad = fields.split("2026-13-01 10:00:00 42 INFO req=a z", "app.log", 9)[2]
    with pytest.raises(DataError, match=r"app.log:9: the time '2026-13-01 10:00:00'"):
        fields.time(bad, "app.log", 9)


@pytest.mark.parametrize(
    ("options", "python", "command_line"),
    [
        ({}, "give session_pattern or session_field (one of them)",
         "give --session-pattern or --session-field (one of them)"),
        ({"session_pattern": "a", "session_field": "Pid"}, "give session_pattern or",
         "give --session-pattern or"),
        ({"session_field": "Pid"}, "session_field names a field of log_format: give both",
         "--session-field names a field of --log-format: give both"),
        ({"session_field": "Content", "log_format": FORMAT},
         "session_field='Content' is not a header field of log_format (fields: ",
         "--session-field Content is not a header field of --log-format (fields: "),
        ({"session_pattern": "(", "log_format": FORMAT},
         "session_pattern='(' is not a valid regex", "--session-pattern '(' is not a valid regex"),
        ({"session_pattern": "a", "time_fields": ("Date",)},
         "time_fields and time_format apply with params only (params=True)",
         "--time-field and --time-format apply with --params only"),
        ({"session_pattern": "a", "params": True, "time_format": "%H"},
         "time_format needs time_fields (the fields it reads)",
         "--time-format needs --time-field (the fields it reads)"),
        ({"session_pattern": "a", "params": True, "time_fields": ("Date",)},
         "time_fields names fields of log_format: give both",
         "--time-field names fields of --log-format: give both"),
        ({"session_pattern": "a", "params": True, "time_fields": ("Nope",), "log_format": FORMAT},
         "time_fields Nope is not a header field of log_format",
         "--time-field Nope is not a header field of --log-format"),
        ({"session_pattern": "a", "log_format": "<Date> <Date> <Content>"},
         "log_format names the field <Date> twice", "--log-format names the field <Date> twice"),
        ({"session_pattern": "a", "log_format": "<Date>"},
         "log_format='<Date>' has no <Content> field", "--log-format '<Date>' has no <Content>"),
    ],
)  # fmt: skip
def test_bad_options_are_named_as_given(options: dict, python: str, command_line: str) -> None:
    """From Python the arguments (``log_format``); the command line's options where it
    made them (``rnnkit sessions``: ``option_names=True``)."""
    with pytest.raises(ConfigError, match=f"^{re.escape(python)}"):
        LineFields(**options)
    with pytest.raises(ConfigError, match=f"^{re.escape(command_line)}"):
        LineFields(**options, option_names=True)


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-12-01T10:00:01.25Z", datetime(2026, 12, 1, 10, 0, 1, 250000, timezone.utc)),
        ("2026-12-01 10:00:01,5", datetime(2026, 12, 1, 10, 0, 1, 500000)),
        (
            "2026-12-01 10:00:01.1234567+02:00",
            datetime(2026, 12, 1, 10, 0, 1, 123456, timezone(timedelta(hours=2))),
        ),
        ("2026-12-01 10:00:01", datetime(2026, 12, 1, 10, 0, 1)),
    ],
)
def test_iso_times_read_alike_on_every_python(text, moment):
    # Python 3.10's fromisoformat reads only isoformat's own output ("...01.25" and "Z"
    # failed there: every such log time was refused); the normalised form it reads is
    # the same moment, and on 3.11+ the same as the text read directly
    assert datetime.fromisoformat(_iso_for_python310(text)) == moment
    if sys.version_info >= (3, 11):
        assert datetime.fromisoformat(text) == moment
    seconds = moment.replace(tzinfo=moment.tzinfo or timezone.utc).timestamp()
    assert parse_log_time(text) == seconds
