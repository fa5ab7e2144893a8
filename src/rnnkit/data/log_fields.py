"""The fields of one log line: its header format, its session id, its time, its numbers.

A *header format* in the style of the loghub benchmark (``log_format``, e.g.
``<Date> <Time> <Pid> <Level> <Component>: <Content>``) splits every line into its header
fields and its message; only the message ``<Content>`` is mined, so a timestamp, a pid or
a level never ends up inside a template. The session id is then found by the pattern
(anywhere in the line) or taken whole from a header field (``session_field="Pid"``). A
non-blank line that does not fit the format stops the reading with its file and line:
a wrong format would otherwise silently turn every header into template text.

The session id is masked as ``<SESSION>`` in the message, so it never splits a template.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone

from rnnkit.errors import ConfigError, DataError

__all__ = [
    "YEARLESS_YEAR",
    "YEARLESS_YEAR_SECONDS",
    "LineFields",
    "compile_log_format",
    "format_period",
    "parse_log_time",
    "parse_number",
    "yearless",
]


# The command line's options for LineFields' arguments (`option_names=True`).
_OPTIONS = {
    "log_format": "--log-format",
    "session_pattern": "--session-pattern",
    "session_field": "--session-field",
    "params": "--params",
    "time_fields": "--time-field",
    "time_format": "--time-format",
}


def _naming(option_names: bool) -> dict[str, str]:
    """How errors name the arguments: themselves, or the command line's options."""
    return dict(_OPTIONS) if option_names else {name: name for name in _OPTIONS}


def _given(name: str, value: str, quote: bool = True) -> str:
    """``--log-format '<Content>'`` for an option (unquoted: ``--session-field Pid``),
    ``log_format='<Content>'`` in Python."""
    if not name.startswith("--"):
        return f"{name}={value!r}"
    return f"{name} '{value}'" if quote else f"{name} {value}"


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
#: seconds with a fraction (``.`` or ``,``) of any number of digits
_FRACTION = re.compile(r"(\d\d:\d\d:\d\d)[.,](\d+)")


def _iso_for_python310(text: str) -> str:
    """``text`` in the one ISO 8601 form that Python 3.10's ``datetime.fromisoformat``
    reads (it reads only what ``isoformat`` writes; 3.11 reads most of ISO 8601): a
    trailing ``Z`` as ``+00:00``, a fraction of seconds as 6 digits (more are cut, as 3.11
    cuts them).

    >>> _iso_for_python310("2026-12-01T10:00:01.25Z")
    '2026-12-01T10:00:01.250000+00:00'
    """
    if text[-1:] in ("Z", "z"):
        text = text[:-1] + "+00:00"
    return _FRACTION.sub(lambda m: f"{m[1]}.{(m[2] + '000000')[:6]}", text, count=1)


def _from_iso(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        if sys.version_info >= (3, 11):
            raise
        return datetime.fromisoformat(_iso_for_python310(text))


def parse_number(text: str) -> float | None:
    """The value of a parameter that is wholly one finite number, else None.

    >>> parse_number("12"), parse_number("-7.5e-1"), parse_number("size=512"), parse_number("1e999")
    (12.0, -0.75, None, None)
    """
    text = text.strip()
    if not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


#: The year a time format without one is read in: a leap year, so that February 29
#: parses (a year-less ``strptime`` takes 1900, which has no February 29).
YEARLESS_YEAR = 2000
#: Its length: what a year-less time that went back over New Year is moved on by.
YEARLESS_YEAR_SECONDS = 366 * 86400.0


def format_period(time_format: str | None) -> float | None:
    """Seconds after which the times of ``time_format`` repeat: a year (of
    :data:`YEARLESS_YEAR`) for a format with a date but no year (syslog's
    ``%b %d %H:%M:%S``), a day for the time of day alone (``%H:%M:%S``), else None.

    >>> format_period("%b %d %H:%M:%S") / 86400, format_period("%a %H:%M:%S")
    (366.0, 86400.0)
    >>> format_period("%Y%m%d") is None
    True
    """
    if not yearless(time_format):
        return None
    assert time_format is not None
    # a weekday alone gives strptime no date (the time of day), a week number and a
    # weekday together do
    plain = time_format.replace("%%", "")
    dated = re.search(r"%[dmbBhje]", plain) or (
        re.search(r"%[UW]", plain) and re.search(r"%[aAwu]", plain)
    )
    return YEARLESS_YEAR_SECONDS if dated else 86400.0


def yearless(time_format: str | None) -> bool:
    """Whether ``time_format`` reads no year (syslog's ``%b %d %H:%M:%S``).

    >>> yearless("%b %d %H:%M:%S"), yearless("%y%m%d %H%M%S"), yearless("%d%%Y %H"), yearless(None)
    (True, False, True, False)
    """
    if time_format is None:
        return False
    return re.search(r"%[YyGCcx]", time_format.replace("%%", "")) is None


def parse_log_time(text: str, time_format: str | None = None) -> float:
    """A log line's time in seconds (POSIX; a time without a zone is taken as UTC).

    With ``time_format`` (``strptime`` directives, e.g. ``%y%m%d %H%M%S``) the text must
    fit it; without, it is ISO 8601 (``2026-12-01 10:00:01.123``, ``…T10:00:01Z``), else a
    number of seconds. Raises ``ValueError`` when it is neither.

    >>> parse_log_time("2026-12-01 10:00:01.5") - parse_log_time("2026-12-01T10:00:00Z")
    1.5
    >>> parse_log_time("081109 203615", "%y%m%d %H%M%S") - parse_log_time("2008-11-09 20:36:00")
    15.0
    >>> parse_log_time("1764583201.25")
    1764583201.25

    A format without a year reads the time in :data:`YEARLESS_YEAR` (a leap year):

    >>> parse_log_time("Feb 29 00:00:01", "%b %d %H:%M:%S") - parse_log_time("2000-02-29")
    1.0
    """
    text = text.strip()
    if time_format is not None and yearless(time_format):
        moment = datetime.strptime(f"{YEARLESS_YEAR} {text}", f"%Y {time_format}")
    elif time_format is not None:
        moment = datetime.strptime(text, time_format)
    else:
        try:
            moment = _from_iso(text)
        except ValueError:
            value = parse_number(text)
            if value is None:
                raise ValueError("not ISO 8601 and not a number of seconds") from None
            return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def compile_log_format(log_format: str, argument: str = "log_format") -> re.Pattern[str]:
    """A loghub-style header format as a regex with one named group per field.

    ``<Name>`` is a field (a lazy ``.*?``; ``<Content>``, required, takes the rest of the
    line); any run of spaces matches any run of whitespace; other text is literal. A bad
    format is a ``ConfigError`` naming ``argument`` (or the option ``--log-format``).

    >>> rx = compile_log_format("<Date> <Time> <Level> [<Component>] <Content>")
    >>> rx.match("2026-12-01 10:00:01 WARN  [disk] quota: 91% used").groupdict()
    {'Date': '2026-12-01', 'Time': '10:00:01', 'Level': 'WARN', 'Component': 'disk', \
'Content': 'quota: 91% used'}
    """
    parts = re.split(r"(<[^<>\s]+>)", log_format)
    names: list[str] = []
    regex = ""
    for part in parts:
        if len(part) > 2 and part[0] == "<" and part[-1] == ">":
            name = part[1:-1]
            if not name.isidentifier():
                raise ConfigError(f"{argument} field <{name}> is not a name (letters, _)")
            if name in names:
                raise ConfigError(f"{argument} names the field <{name}> twice")
            names.append(name)
            regex += "(?P<Content>.*)" if name == "Content" else f"(?P<{name}>.*?)"
        else:
            regex += r"\s+".join(re.escape(word) for word in re.split(" +", part))
    if "Content" not in names:
        raise ConfigError(
            f"{_given(argument, log_format)} has no <Content> field (the message to mine)"
        )
    return re.compile(f"^{regex}$")


def _compile_session_pattern(
    pattern: str | re.Pattern[str], argument: str
) -> tuple[re.Pattern[str], int | str]:
    """The pattern and which group is the id: ``session``, else the first, else the whole
    match (``blk_-?\\d+``)."""
    try:
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    except re.error as exc:
        given = _given(argument, str(pattern))
        raise ConfigError(f"{given} is not a valid regex: {exc}") from None
    if "session" in compiled.groupindex:
        return compiled, "session"
    return compiled, 1 if compiled.groups >= 1 else 0


class LineFields:
    """How a log line splits into its session id, the message to mine and its header.

    Args:
        session_pattern, log_format, session_field, params, time_fields, time_format:
            as :class:`rnnkit.data.logs.LogSessionizer` takes them.
        option_names: errors name the command line's options (``--log-format``), not
            these arguments (``log_format``, the default).

    Raises:
        ConfigError: a bad pattern, format or field, or time options without ``params``.

    >>> fields = LineFields(log_format="<Time> <Pid>: <Content>", session_field="Pid")
    >>> fields.split("10:00:01 42: disk full", None, 1)[:2]
    ('42', 'disk full')
    """

    def __init__(
        self,
        session_pattern: str | re.Pattern[str] | None = None,
        *,
        log_format: str | None = None,
        session_field: str | None = None,
        params: bool = False,
        time_fields: Sequence[str] | None = None,
        time_format: str | None = None,
        option_names: bool = False,
    ) -> None:
        n = self.names = _naming(option_names)
        fmt, field, times = n["log_format"], n["session_field"], n["time_fields"]
        self.log_format = log_format
        self.format = None if log_format is None else compile_log_format(log_format, fmt)
        if (session_pattern is None) == (session_field is None):
            raise ConfigError(f"give {n['session_pattern']} or {field} (one of them)")
        self.session_field = session_field
        self.pattern: re.Pattern[str] | None = None
        if session_field is not None:
            if self.format is None:
                raise ConfigError(f"{field} names a field of {fmt}: give both")
            if session_field not in self.format.groupindex or session_field == "Content":
                fields = [f for f in self.format.groupindex if f != "Content"]
                raise ConfigError(
                    f"{_given(field, session_field, quote=False)} is not a header field of {fmt} "
                    f"(fields: {', '.join(fields) or 'none'})"
                )
        else:
            assert session_pattern is not None
            self.pattern, self._group = _compile_session_pattern(
                session_pattern, n["session_pattern"]
            )
        self.time_fields = tuple(time_fields or ())
        self.time_format = time_format
        self.period = format_period(time_format)
        if (self.time_fields or time_format is not None) and not params:
            raise ConfigError(
                f"{times} and {n['time_format']} apply with {n['params']} only"
                + ("" if option_names else " (params=True)")
            )
        if time_format is not None and not self.time_fields:
            raise ConfigError(f"{n['time_format']} needs {times} (the fields it reads)")
        if self.time_fields:
            if self.format is None:
                raise ConfigError(f"{times} names fields of {fmt}: give both")
            for name in self.time_fields:
                if name not in self.format.groupindex or name == "Content":
                    fields = [f for f in self.format.groupindex if f != "Content"]
                    raise ConfigError(
                        f"{times} {name} is not a header field of {fmt} "
                        f"(fields: {', '.join(fields) or 'none'})"
                    )

    def split(
        self, line: str, source: str | None, number: int
    ) -> tuple[str | None, str, re.Match[str] | None]:
        """``(session id or None, the message to mine with the id masked, the header)``."""
        content_start, content = 0, line
        header = None
        if self.format is not None:
            header = self.format.match(line)
            if header is None:
                if not line.strip():
                    return None, "", None
                fmt = _given(self.names["log_format"], str(self.log_format))
                raise DataError(
                    f"the line does not match {fmt} (starts {line[:60]!r})",
                    source or "<lines>",
                    number,
                )
            content_start, content = header.start("Content"), header.group("Content")
        if self.session_field is not None:
            assert header is not None
            return header.group(self.session_field).strip() or None, content, header
        assert self.pattern is not None
        match = self.pattern.search(line)
        session_id = match.group(self._group) if match else None
        if not session_id or match is None:
            return None, content, header
        start, end = match.span(self._group)
        if start >= content_start:  # the id is in the message: mask it there
            start, end = start - content_start, end - content_start
            content = f"{content[:start]}<SESSION>{content[end:]}"
        return session_id, content, header

    def time(self, header: re.Match[str] | None, source: str | None, number: int) -> float:
        """The line's time in seconds, from its ``time_fields``.

        Raises:
            DataError: the time fits neither ``time_format`` nor the default forms.
        """
        assert header is not None
        text = " ".join(header.group(name).strip() for name in self.time_fields)
        try:
            return parse_log_time(text, self.time_format)
        except ValueError:
            n = self.names
            how = (
                _given(n["time_format"], self.time_format)
                if self.time_format
                else f"ISO 8601 or a number of seconds (else give {n['time_format']})"
            )
            raise DataError(
                f"the time {text!r} ({n['time_fields']} {','.join(self.time_fields)}) is not {how}",
                source or "<lines>",
                number,
            ) from None
