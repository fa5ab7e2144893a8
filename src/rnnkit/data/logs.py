"""Log lines to event sessions: a regex finds each line's session, Drain3 its template.

A session is every line that carries the same session id (a request id, a block id, a
connection); its events are the lines' *templates*, the constant text with the variable
parts masked: ``user alice logged in from 10.0.0.1`` and ``user bob logged in from
10.0.0.2`` are both the event ``user <*> logged in from <IP>``. Templates are mined with
Drain3 (He et al., 2017) in memory, no persistence.

Two passes: every line is first mined, then each line is given the template its cluster
has at the *end* of mining. Drain generalises a template as lines arrive, so a one-pass
labelling would call the same kind of line by two names depending on when it came.

The session id is masked as ``<SESSION>`` before mining, so it never splits a template.

With ``params=True`` every event also gets its *parameter values* (DeepLog's parameter
value vector): the numbers of the template's variable parts, in order, read back from
the line by its final template (``<NUM>`` and every other ``<…>`` slot; a slot whose text
is not wholly a number, such as an address or ``size=512``, gives ``None``). With
``time_fields`` (header fields of the format holding the line's time), the seconds since
the same session's previous line come first (0 for its first line).

A *header format* in the style of the loghub benchmark (``log_format``) splits every line
into header fields and the message that is mined; how a line splits into its session id,
its message, its header and its time is :mod:`rnnkit.data.log_fields`.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from os import PathLike
from typing import IO, Any

from rnnkit.data.events import Session
from rnnkit.data.lines import bounded_text_lines
from rnnkit.data.log_fields import (
    LineFields,
    compile_log_format,
    parse_log_time,
    parse_number,
)
from rnnkit.errors import ConfigError, DataError

__all__ = [
    "DEFAULT_MASKS",
    "KnownTemplates",
    "LogSessionizer",
    "LogStats",
    "compile_log_format",
    "parse_log_time",
    "parse_number",
    "sessions_from_logs",
]

# drain3 logs at INFO ("Starting Drain3 template miner") through the root logger's
# handlers; a user who turns on INFO logging for their own code should not get it.
logging.getLogger("drain3").setLevel(logging.WARNING)

#: Variable fields masked before mining, in order: (regex, mask name). Masks make
#: templates readable (``<IP>`` rather than ``<*>``) and group lines whose first tokens
#: vary, which Drain's prefix tree would otherwise split.
DEFAULT_MASKS: tuple[tuple[str, str], ...] = (
    (r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "UUID"),
    (r"(?<![\w.])\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?", "DATE"),
    (r"(?<![\w.:])\d\d:\d\d:\d\d(?:[.,]\d+)?(?![\w.])", "TIME"),
    (r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?(?![\w.])", "IP"),
    (r"(?<![\w.])0x[0-9a-fA-F]+(?![\w.])", "HEX"),
    (r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?![\w.])", "NUM"),
)

#: Longest log line kept; longer ones are skipped and counted (a binary blob or a runaway
#: stack dump would otherwise be mined, and held in memory, whole).
MAX_LINE_CHARS = 1024 * 1024


@dataclass
class LogStats:
    """What :class:`LogSessionizer` read.

    Attributes:
        lines: lines read (blank ones included).
        used: lines that carried a session id and became events.
        no_session: lines skipped because the pattern found no session id in them.
        too_long: lines skipped for being over :data:`MAX_LINE_CHARS`.
        templates: distinct templates mined (the known ones not counted).
        known: lines that fitted a known template (``templates=``).
        empty: lines skipped because their message (the part mined) is empty.
        sessions: sessions produced.
        first_no_session: ``(file, line)`` of the first line without a session id (the
            file is ``None`` for lines given in code).
        unmatched_params: lines (with ``params``) whose text did not match their final
            template when the parameters were read back: all their values are ``None``.
    """

    lines: int = 0
    used: int = 0
    no_session: int = 0
    too_long: int = 0
    templates: int = 0
    known: int = 0
    empty: int = 0
    sessions: int = 0
    first_no_session: tuple[str | None, int] | None = None
    unmatched_params: int = 0


_END = ""  # a trie node's key for the template that ends there (never a token)


class KnownTemplates:
    """Templates of an earlier mining, and which of them a masked message fits.

    A message fits a template of as many tokens when each constant token is equal and
    each ``<*>`` takes any one token. Where several fit, the most specific one (fewest
    ``<*>``), then the first by name, is the answer: the same whatever the order the
    templates came in. (Drain's own ``match`` keeps the first it meets, so the same line
    was named by one template when they were read from a sessions file and by another
    from a run's vocabulary, which lists them most frequent first.)

    Held as one token trie per length, so a message walks only the templates that agree
    with it so far (a line that fits none costs its tokens, not a scan of every template).

    >>> known = KnownTemplates(["disk <*> <*>", "<*> disk <*>", "disk full"])
    >>> known.match("disk disk disk".split()), known.match(["disk", "full"])
    ('<*> disk <*>', 'disk full')
    >>> known.match(["disk", "ok"]) is None
    True
    """

    def __init__(self, templates: Iterable[str]) -> None:
        self._roots: dict[int, dict[str, Any]] = {}
        self.names: list[str] = []
        for template in dict.fromkeys(templates):
            tokens = template.split()
            node = self._roots.setdefault(len(tokens), {})
            for token in tokens:
                node = node.setdefault(token, {})
            node[_END] = template
            self.names.append(template)

    def match(self, tokens: Sequence[str]) -> str | None:
        """The template ``tokens`` fit (see the class), or None."""
        root = self._roots.get(len(tokens))
        if root is None:
            return None
        best: tuple[int, str] | None = None
        stack = [(root, 0, 0)]  # (node, tokens matched, wildcards taken)
        while stack:
            node, i, wild = stack.pop()
            if i == len(tokens):
                candidate = (wild, node[_END])
                best = candidate if best is None or candidate < best else best
                continue
            exact = node.get(tokens[i])
            if exact is not None:
                stack.append((exact, i + 1, wild))
            any_token = node.get("<*>")
            if any_token is not None and tokens[i] != "<*>":
                stack.append((any_token, i + 1, wild + 1))
        return None if best is None else best[1]


class LogSessionizer:
    """Collects log lines (from one or many files) into sessions of template events.

    Args:
        session_pattern: regex searched in each line; its group ``session`` (or else its
            first group, or else the whole match) is the session id. Lines where it does
            not match, or the group is empty, are skipped and counted.
        log_format: a loghub-style header format (:func:`compile_log_format`): only the
            ``<Content>`` of each line is mined; a line that does not fit is a DataError.
        session_field: with ``log_format``, the header field that is the session id
            (instead of ``session_pattern``).
        masks: ``(regex, name)`` pairs masked as ``<name>`` before mining.
        similarity: Drain's similarity threshold (0..1); higher makes more templates.
        depth: Drain's prefix-tree depth (at least 3).
        max_children: most children of a node of Drain's prefix tree (at least 2).
        params: also read every event's parameter values (see the module's text).
        time_fields: with ``params`` and ``log_format``, the header fields holding the
            line's time (joined by a space, e.g. ``("Date", "Time")``): the seconds since
            the session's previous line become each vector's first value.
        time_format: ``strptime`` format of that time (default: ISO 8601 or seconds).
        templates: known templates (those of an earlier mining, the events a model was
            trained on): a line that fits one (its constant tokens equal, each ``<*>``
            one token) is that event, with the template's name unchanged; only the other
            lines are mined, into templates of their own.
        option_names: errors name the command line's options (``--log-format``), not
            these arguments (``log_format``, the default).

    Raises:
        ConfigError: a bad pattern, format, field, threshold, depth or max_children;
            drain3 not installed.

    >>> sessionizer = LogSessionizer(r"req=(\\w+)")
    >>> sessionizer.add_lines([
    ...     "req=a GET /index took 12 ms",
    ...     "req=b GET /about took 7 ms",
    ...     "heartbeat",
    ...     "req=a disk quota exceeded for user 42",
    ... ])
    >>> for session in sessionizer.sessions():
    ...     print(session.session, session.events)
    a ['req=<SESSION> GET <*> took <NUM> ms', 'req=<SESSION> disk quota exceeded for user <NUM>']
    b ['req=<SESSION> GET <*> took <NUM> ms']
    >>> sessionizer.stats.no_session
    1
    """

    def __init__(
        self,
        session_pattern: str | re.Pattern[str] | None = None,
        *,
        log_format: str | None = None,
        session_field: str | None = None,
        masks: Iterable[tuple[str, str]] = DEFAULT_MASKS,
        similarity: float = 0.4,
        depth: int = 4,
        max_children: int = 100,
        params: bool = False,
        time_fields: Sequence[str] | None = None,
        time_format: str | None = None,
        templates: Iterable[str] | None = None,
        option_names: bool = False,
    ) -> None:
        # The line options are checked first, then Drain's.
        self.fields = LineFields(
            session_pattern,
            log_format=log_format,
            session_field=session_field,
            params=params,
            time_fields=time_fields,
            time_format=time_format,
            option_names=option_names,
        )
        self.log_format = log_format
        self.format = self.fields.format
        self.session_field = session_field
        self.pattern = self.fields.pattern
        self.params = params
        self.time_fields = self.fields.time_fields
        self.time_format = time_format
        if max_children < 2:
            raise ConfigError(f"max_children must be at least 2, got {max_children}")
        if not 0.0 <= similarity <= 1.0:
            raise ConfigError(f"similarity must be in [0, 1], got {similarity}")
        if depth < 3:
            raise ConfigError(f"depth must be at least 3, got {depth}")
        try:
            # Imported here: only log sessions need drain3.
            from drain3 import TemplateMiner
            from drain3.masking import MaskingInstruction
            from drain3.template_miner_config import TemplateMinerConfig
        except ImportError:
            raise ConfigError(
                "log sessions need drain3, an optional dependency: pip install 'rnnkit[logs]'"
            ) from None
        # A config object built in code: TemplateMiner() without one would look for a
        # drain3.ini in the working directory (and warn when there is none).
        config = TemplateMinerConfig()
        config.drain_sim_th = similarity
        config.drain_depth = depth
        config.drain_max_children = max_children
        config.profiling_enabled = False  # its profiler prints to stdout
        mask_list = list(masks)
        for regex, _ in mask_list:
            try:
                re.compile(regex)
            except re.error as exc:
                raise ConfigError(f"mask {regex!r} is not a valid regex: {exc}") from None
        config.masking_instructions = [MaskingInstruction(rx, name) for rx, name in mask_list]
        self._miner: Any = TemplateMiner(persistence_handler=None, config=config)
        # The known templates: a line that fits one is that event, by its name (never
        # changed by what is mined); their ids are negative, apart from Drain's clusters.
        self._known: KnownTemplates | None = None
        self._known_ids: dict[str, int] = {}
        if templates is not None:
            self._known = KnownTemplates(templates)
            for name in self._known.names:
                masked = " ".join(self._miner.masker.mask(name).split())
                if masked != name:
                    raise ConfigError(
                        f"template {name!r} is not one this mining writes (it reads as {masked!r})"
                    )
            self._known_ids = {name: -1 - i for i, name in enumerate(self._known.names)}
        # Cluster id of each line, per session in order of first appearance; the final
        # template of each cluster is only known once every line is in.
        self._clusters: dict[str, list[int]] = {}
        # With params: each line's mined message (its parameters are read back once the
        # templates are final) and its seconds since the session's previous line.
        self._messages: dict[str, list[str]] = {}
        self._deltas: dict[str, list[float]] = {}
        self._last_time: dict[str, float] = {}
        self.stats = LogStats()

    def _cluster(self, message: str) -> int:
        """The cluster of one masked message: a known template's (negative id) if it
        matches one, else the one Drain mines it into."""
        if self._known is not None:
            found = self._known.match(self._miner.masker.mask(message).split())
            if found is not None:
                self.stats.known += 1
                return self._known_ids[found]
        return int(self._miner.add_log_message(message)["cluster_id"])

    def add_line(self, line: str, source: str | None = None, number: int | None = None) -> bool:
        """Mine one line; True if it carried a session id (and became an event).

        Args:
            line: the text (a trailing newline is dropped).
            source, number: where the line is from (file and 1-based line), for errors
                and the count of lines without a session id.

        Raises:
            DataError: with a header format, a non-blank line that does not fit it.
        """
        self.stats.lines += 1
        number = self.stats.lines if number is None else number
        line = line.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            self.stats.too_long += 1
            return False
        session_id, message, header = self.fields.split(line, source, number)
        if not session_id:
            self.stats.no_session += 1
            if self.stats.first_no_session is None:
                self.stats.first_no_session = (source, number)
            return False
        # Drain tokenises on whitespace, but the parameters are read back from the text
        # itself: outer spaces would make it fit no template ("took 3 ms  ").
        message = message.strip()
        if not message:  # a header without a message (--session-field): no event to name
            self.stats.empty += 1
            return False
        delta = self._delta(session_id, header, source, number) if self.time_fields else 0.0
        cluster_id = self._cluster(message)
        self._clusters.setdefault(session_id, []).append(cluster_id)
        if self.params:
            self._messages.setdefault(session_id, []).append(message)
            self._deltas.setdefault(session_id, []).append(delta)
        self.stats.used += 1
        return True

    def _delta(
        self, session_id: str, header: re.Match[str] | None, source: str | None, number: int
    ) -> float:
        """Seconds since the session's previous line (0 for its first)."""
        now = self.fields.time(header, source, number)
        last = self._last_time.get(session_id)
        self._last_time[session_id] = now
        if last is None:
            return 0.0
        delta = now - last
        period = self.fields.period
        if period is not None and abs(delta) > period / 2:
            # Dec 31 23:59:59, then Jan 1 00:00:01 of a format without a year: the next
            # year's, 2 s later, not a year back (both were read in one year); the other
            # way, a step back over New Year. A format of the time of day alone: a day.
            delta -= math.copysign(period, delta)
        # To the microsecond, a datetime's resolution: POSIX seconds near 1.7e9 carry
        # float noise in the 7th decimal.
        return round(delta, 6)

    def add_lines(self, lines: Iterable[str], source: str | None = None) -> None:
        """Mine each line of an iterable (an open file, a list of strings)."""
        for number, line in enumerate(lines, 1):
            self.add_line(line, source, number)

    def add_file(self, path: str | PathLike[str]) -> None:
        """Mine every line of a text file.

        Bytes that are not UTF-8 are replaced rather than refused: logs mix encodings,
        and one bad byte should cost one character, not the file.
        """
        # newline="\n": a line ends at "\n" (and "\r\n") only, as grep and an editor count
        # lines; a lone "\r" (a progress bar's) stays inside its line.
        with open(path, encoding="utf-8", errors="replace", newline="\n") as fileobj:
            self.add_stream(fileobj, os.fspath(path))

    def add_stream(self, fileobj: IO[str], source: str) -> None:
        """Mine every line of an open text stream (a file, standard input), each line
        read in bounded pieces: one over :data:`MAX_LINE_CHARS` is skipped and counted,
        never held whole."""
        for number, line in enumerate(bounded_text_lines(fileobj, MAX_LINE_CHARS), 1):
            if line is None:  # over MAX_LINE_CHARS: counted, never held
                self.stats.lines += 1
                self.stats.too_long += 1
                continue
            self.add_line(line, source, number)

    def templates(self) -> dict[int, str]:
        """The mined templates by Drain cluster id.

        >>> sessionizer = LogSessionizer(r"id=(\\d+)")
        >>> sessionizer.add_lines(["id=1 start", "id=2 start"])
        >>> sessionizer.templates()
        {1: 'id=<SESSION> start'}
        """
        mined = {c.cluster_id: c.get_template() for c in self._miner.drain.clusters}
        return {**{v: k for k, v in self._known_ids.items()}, **mined}

    def sessions(self, label: int | None = None) -> list[Session]:
        """The sessions so far, in order of first appearance, every event a template.

        Args:
            label: label for every session (``0``/``1``) or None.
        """
        templates = self.templates()
        self.stats.templates = len(self._miner.drain.clusters)
        self.stats.sessions = len(self._clusters)
        self.stats.unmatched_params = 0
        out = []
        for session_id, cluster_ids in self._clusters.items():
            events = [templates[c] for c in cluster_ids]
            params: list[list[float | None]] | None = None
            if self.params:
                messages, deltas = self._messages[session_id], self._deltas[session_id]
                params = []
                for template, message, delta in zip(events, messages, deltas, strict=True):
                    values: list[float | None] = [delta] if self.time_fields else []
                    params.append(values + self._values(template, message))
            out.append(Session(session_id, events, label, params))
        return out

    def _values(self, template: str, message: str) -> list[float | None]:
        """The numbers of a message's template slots, in order (None: not a number)."""
        found = self._miner.extract_parameters(template, message, exact_matching=True)
        if found is None:  # the line no longer fits the template it was mined into
            self.stats.unmatched_params += 1
            return [None] * len(self._slots.findall(template))
        return [parse_number(p.value) for p in found]

    @property
    def _slots(self) -> re.Pattern[str]:
        """A template's parameter slots: ``<*>`` and the masks."""
        names = ["\\*", *(re.escape(n) for n in self._miner.masker.mask_names)]
        return re.compile("<(?:" + "|".join(names) + ")>")


def sessions_from_logs(
    source: str | PathLike[str] | Iterable[str],
    session_pattern: str | re.Pattern[str] | None = None,
    *,
    label: int | None = None,
    log_format: str | None = None,
    session_field: str | None = None,
    masks: Iterable[tuple[str, str]] = DEFAULT_MASKS,
    similarity: float = 0.4,
    depth: int = 4,
    max_children: int = 100,
    params: bool = False,
    time_fields: Sequence[str] | None = None,
    time_format: str | None = None,
) -> tuple[list[Session], LogStats]:
    """Sessions of template events from one log file (a path) or from lines.

    Args:
        source: a path (``str`` or ``PathLike``: a ``str`` is always a path), or an
            iterable of lines.
        session_pattern: and ``log_format``, ``session_field``, ``masks``,
            ``similarity``, ``depth``, ``max_children``, ``params``, ``time_fields``,
            ``time_format``: see :class:`LogSessionizer`.
        label: label given to every session (``0``/``1``), or None.

    Returns:
        The sessions in order of first appearance, and the counts of what was read.

    Raises:
        DataError: no line carries a session id (naming the file).
        ConfigError: a bad option (see :class:`LogSessionizer`).
        OSError: the file cannot be read.

    >>> sessions, stats = sessions_from_logs(
    ...     ["conn 7 open", "conn 9 open", "conn 7 closed by peer"], r"conn (?P<session>\\d+)"
    ... )
    >>> for session in sessions:
    ...     print(session.session, session.events)
    7 ['conn <SESSION> open', 'conn <SESSION> closed by peer']
    9 ['conn <SESSION> open']
    >>> stats.used, stats.no_session
    (3, 0)
    """
    sessionizer = LogSessionizer(
        session_pattern,
        log_format=log_format,
        session_field=session_field,
        masks=masks,
        similarity=similarity,
        depth=depth,
        max_children=max_children,
        params=params,
        time_fields=time_fields,
        time_format=time_format,
    )
    path = None
    if isinstance(source, (str, PathLike)):
        path = os.fspath(source)
        sessionizer.add_file(path)
    else:
        sessionizer.add_lines(source)
    sessions = sessionizer.sessions(label)
    if not sessions:
        raise DataError(no_session_message(sessionizer), path=path)
    return sessions, sessionizer.stats


def no_session_message(sessionizer: LogSessionizer) -> str:
    """The error text for input in which no line carried a session id.

    >>> sessionizer = LogSessionizer(r"req=(\\w+)")
    >>> sessionizer.add_lines(["hello"])
    >>> print(no_session_message(sessionizer))
    no line matches the session pattern 'req=(\\w+)' (1 line read)
    """
    stats = sessionizer.stats
    read = f"{stats.lines} line{'s' if stats.lines != 1 else ''} read"
    if stats.too_long:
        read += f", {stats.too_long} over {MAX_LINE_CHARS} characters"
    if sessionizer.pattern is None:
        return f"the field <{sessionizer.session_field}> is empty on every line ({read})"
    # Quoted by hand: repr() would double every backslash of the regex.
    return f"no line matches the session pattern '{sessionizer.pattern.pattern}' ({read})"
