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
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from os import PathLike
from typing import Any

from rnnkit.data.events import Session
from rnnkit.errors import ConfigError, DataError

__all__ = ["DEFAULT_MASKS", "LogSessionizer", "LogStats", "sessions_from_logs"]

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
        templates: distinct templates mined.
        sessions: sessions produced.
    """

    lines: int = 0
    used: int = 0
    no_session: int = 0
    too_long: int = 0
    templates: int = 0
    sessions: int = 0


def _compile_session_pattern(pattern: str | re.Pattern[str]) -> tuple[re.Pattern[str], int | str]:
    try:
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
    except re.error as exc:
        raise ConfigError(f"--session-pattern '{pattern}' is not a valid regex: {exc}") from None
    if "session" in compiled.groupindex:
        return compiled, "session"
    if compiled.groups >= 1:
        return compiled, 1
    raise ConfigError(
        f"--session-pattern '{compiled.pattern}' has no group: mark the id with "
        r"(?P<session>...) or (...), e.g. 'req=(\w+)'"
    )


class LogSessionizer:
    """Collects log lines (from one or many files) into sessions of template events.

    Args:
        session_pattern: regex searched in each line; its group ``session`` (or else its
            first group) is the session id. Lines where it does not match, or the group
            is empty, are skipped and counted.
        masks: ``(regex, name)`` pairs masked as ``<name>`` before mining.
        similarity: Drain's similarity threshold (0..1); higher makes more templates.
        depth: Drain's prefix-tree depth (at least 3).

    Raises:
        ConfigError: a bad pattern, threshold, or depth; drain3 not installed.

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
        session_pattern: str | re.Pattern[str],
        *,
        masks: Iterable[tuple[str, str]] = DEFAULT_MASKS,
        similarity: float = 0.4,
        depth: int = 4,
    ) -> None:
        self.pattern, self._group = _compile_session_pattern(session_pattern)
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
            raise ConfigError("log sessions need drain3: pip install drain3==0.9.11") from None
        # A config object built in code: TemplateMiner() without one would look for a
        # drain3.ini in the working directory (and warn when there is none).
        config = TemplateMinerConfig()
        config.drain_sim_th = similarity
        config.drain_depth = depth
        config.profiling_enabled = False  # its profiler prints to stdout
        mask_list = list(masks)
        for regex, _ in mask_list:
            try:
                re.compile(regex)
            except re.error as exc:
                raise ConfigError(f"mask {regex!r} is not a valid regex: {exc}") from None
        config.masking_instructions = [MaskingInstruction(rx, name) for rx, name in mask_list]
        self._miner: Any = TemplateMiner(persistence_handler=None, config=config)
        # Cluster id of each line, per session in order of first appearance; the final
        # template of each cluster is only known once every line is in.
        self._clusters: dict[str, list[int]] = {}
        self.stats = LogStats()

    def add_line(self, line: str) -> bool:
        """Mine one line; True if it carried a session id (and became an event)."""
        self.stats.lines += 1
        line = line.rstrip("\r\n")
        if len(line) > MAX_LINE_CHARS:
            self.stats.too_long += 1
            return False
        match = self.pattern.search(line)
        session_id = match.group(self._group) if match else None
        if not session_id:
            self.stats.no_session += 1
            return False
        assert match is not None
        start, end = match.span(self._group)
        message = f"{line[:start]}<SESSION>{line[end:]}"
        cluster_id = self._miner.add_log_message(message)["cluster_id"]
        self._clusters.setdefault(session_id, []).append(cluster_id)
        self.stats.used += 1
        return True

    def add_lines(self, lines: Iterable[str]) -> None:
        """Mine each line of an iterable (an open file, a list of strings)."""
        for line in lines:
            self.add_line(line)

    def add_file(self, path: str | PathLike[str]) -> None:
        """Mine every line of a text file.

        Bytes that are not UTF-8 are replaced rather than refused: logs mix encodings,
        and one bad byte should cost one character, not the file.
        """
        with open(path, encoding="utf-8", errors="replace") as fileobj:
            while True:
                line = fileobj.readline(MAX_LINE_CHARS + 1)
                if not line:
                    return
                if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
                    # Drain the rest of the long line in bounded pieces, then count it.
                    while line and not line.endswith("\n"):
                        line = fileobj.readline(MAX_LINE_CHARS)
                    self.stats.lines += 1
                    self.stats.too_long += 1
                    continue
                self.add_line(line)

    def templates(self) -> dict[int, str]:
        """The mined templates by Drain cluster id.

        >>> sessionizer = LogSessionizer(r"id=(\\d+)")
        >>> sessionizer.add_lines(["id=1 start", "id=2 start"])
        >>> sessionizer.templates()
        {1: 'id=<SESSION> start'}
        """
        return {c.cluster_id: c.get_template() for c in self._miner.drain.clusters}

    def sessions(self, label: int | None = None) -> list[Session]:
        """The sessions so far, in order of first appearance, every event a template.

        Args:
            label: label for every session (``0``/``1``) or None.
        """
        templates = self.templates()
        self.stats.templates = len(templates)
        self.stats.sessions = len(self._clusters)
        return [
            Session(session_id, [templates[c] for c in cluster_ids], label)
            for session_id, cluster_ids in self._clusters.items()
        ]


def sessions_from_logs(
    source: str | PathLike[str] | Iterable[str],
    session_pattern: str | re.Pattern[str],
    *,
    label: int | None = None,
    masks: Iterable[tuple[str, str]] = DEFAULT_MASKS,
    similarity: float = 0.4,
    depth: int = 4,
) -> tuple[list[Session], LogStats]:
    """Sessions of template events from one log file (a path) or from lines.

    Args:
        source: a path (``str`` or ``PathLike``: a ``str`` is always a path), or an
            iterable of lines.
        session_pattern, masks, similarity, depth: see :class:`LogSessionizer`.
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
    sessionizer = LogSessionizer(session_pattern, masks=masks, similarity=similarity, depth=depth)
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
    # Quoted by hand: repr() would double every backslash of the regex.
    return f"no line matches the session pattern '{sessionizer.pattern.pattern}' ({read})"
