"""strace output to event sessions: one session per traced process (or per file).

Reads what ``strace`` writes, in the forms it takes in practice:

- ``strace -f -o FILE``: every line starts with the pid (``1234  openat(...) = 3``);
- ``strace -f`` to the terminal: ``[pid  1234] `` prefixes, but only while more than one
  process is traced. An unprefixed line belongs to the sole live process (tracked through
  ``clone`` results and ``+++ exited`` lines), else to the first process, whose pid is the
  first prefixed one that no ``clone``/``fork`` returned;
- ``strace -ff -o FILE``: one file per pid (``FILE.1234``) without prefixes;
- ``-t``/``-tt``/``-ttt``/``-r`` timestamps, ``-T`` durations, ``-i`` instruction
  pointers, ``-y`` fd paths;
- ``name(args <unfinished ...>`` later completed by ``<... name resumed> ...) = ret``;
- ``+++ exited with N +++``, ``+++ killed by SIGSEGV +++``, ``--- SIGCHLD {...} ---``.

An event is the system call name, with ``with_result=True`` followed by ``:`` and the
result class: ``ok`` (a return value, negative only where the call's valid results are),
the errno name (``ENOENT`` for ``= -1 ENOENT (No such file...)``, ``ERESTARTSYS`` for an
interrupted call) or ``noreturn`` (``= ?``: ``exit_group``, a call cut short by the
process's death). A delivered signal is the event ``SIGCHLD``; a process killed by a
signal ends with ``killed:SIGKILL``. strace's "pid" is a thread id, so with ``-f`` each
thread of a program is its own session.

Lines that are not strace syntax (a traced program's own output interleaved on the
terminal, truncated last lines) are skipped and counted in :class:`StraceStats`; a file in
which no line parses is refused.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from os import PathLike
from typing import IO, Literal, cast

from rnnkit.data.events import Session
from rnnkit.data.lines import bounded_text_lines
from rnnkit.errors import ConfigError, DataError

__all__ = ["StraceStats", "parse_strace"]

# Optional prefixes, in strace's order: pid, timestamp, instruction pointer.
_PREFIX = re.compile(
    r"""^\s*(?:\[pid\s+(?P<bracket_pid>\d+)\]\s+|(?P<bare_pid>\d+)\s+)?   # -f forms
        (?:\d+(?::\d\d){0,2}(?:\.\d+)?\s+)?                           # -t -tt -ttt -r
        (?:\[[0-9a-f?]+\]\s+)?                                        # -i
    """,
    re.VERBOSE,
)
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
# The return value is found from the end of the line: arguments may contain ") = " inside
# strings (write(1, "x) = 5", 6) = 6), and greedy ``.*`` makes the last one win.
_RETURN = r"\)\s*=\s*(?P<ret>-?\d+|0x[0-9a-fA-F]+|\?)(?:<[^>]*>)?(?P<rest>(?:\s.*)?)$"
_CALL = re.compile(rf"^(?P<name>{_NAME})\(.*{_RETURN}")
_UNFINISHED = re.compile(rf"^(?P<name>{_NAME})\(.*<unfinished \.\.\.>\s*$")
_RESUMED = re.compile(rf"^<\.\.\. (?P<name>{_NAME}) resumed>.*{_RETURN}")
_RESUMED_UNFINISHED = re.compile(rf"^<\.\.\. (?P<name>{_NAME}) resumed>.*<unfinished \.\.\.>\s*$")
_CALL_START = re.compile(rf"{_NAME}\(|<\.\.\. {_NAME} resumed>")
_SIGNAL = re.compile(r"^--- (?P<signal>SIG[A-Z0-9+-]+|\d+)\b.*---\s*$")
_EXITED = re.compile(r"^\+\+\+ exited with -?\d+ \+\+\+\s*$")
_KILLED = re.compile(r"^\+\+\+ killed by (?P<signal>SIG[A-Z0-9+-]+|\d+)\b.*\+\+\+\s*$")
_ATTACHED = re.compile(r"strace: Process (?P<pid>\d+) attached")
# Lines that are strace's but carry no event: its own notes, signal-delivery stops,
# a thread superseded by another thread's execve.
_NOTE = re.compile(r"^(?:strace: |--- stopped by |\+\+\+ superseded by )")
# A thread's execve: the thread (pid N) takes over its leader's pid and is gone as N.
_SUPERSEDED = re.compile(r"^\+\+\+ superseded by execve in pid (?P<pid>\d+) \+\+\+")
_ERRNO = re.compile(r"^\s+(?P<errno>E[A-Z0-9]+)\b")
_ERRNO_NUMBER = re.compile(r"^\s+\(errno (?P<number>\d+)\)")
# Calls whose return value is the pid of a new task: that pid is a child, not the root.
_SPAWNERS = frozenset({"clone", "clone3", "fork", "vfork"})
# A -ff output file is named PREFIX.PID.
_FF_SUFFIX = re.compile(r"\.(\d+)$")

#: Longest line parsed; longer ones are skipped and counted. strace's own lines are short
#: unless -s asks for huge strings, and a runaway line must not be held in memory whole.
MAX_LINE_CHARS = 1024 * 1024
_OVERLONG = "\0overlong line"  # stands for a skipped line, compared by identity

# The process whose pid is not known yet: strace -f to a terminal prints the first
# process's lines without a prefix until it forks.
_ROOT = "root"


@dataclass
class StraceStats:
    """What :func:`parse_strace` read.

    Attributes:
        lines: non-blank lines read.
        events: events produced.
        skipped: lines that were not strace syntax (skipped).
        first_skipped: ``(source, line)`` of the first few skipped lines, for messages.
    """

    lines: int = 0
    events: int = 0
    skipped: int = 0
    first_skipped: list[tuple[str, int]] = field(default_factory=list)

    def _skip(self, source: str, line: int) -> None:
        self.skipped += 1
        if len(self.first_skipped) < 5:
            self.first_skipped.append((source, line))


def _result(ret: str, rest: str) -> str:
    """The result class of a return value: ``ok``, an errno name, or ``noreturn``."""
    errno = _ERRNO.match(rest)
    if errno and (ret == "-1" or ret == "?"):
        return errno.group("errno")
    number = _ERRNO_NUMBER.match(rest)
    if number and ret == "-1":
        return f"errno{number.group('number')}"  # an errno strace has no name for
    return "noreturn" if ret == "?" else "ok"


class _Trace:
    """Events of one trace file, keyed by pid, with the root-process bookkeeping."""

    def __init__(self, default_pid: str, with_result: bool) -> None:
        self.with_result = with_result
        # Each event is a one-item list (a cell), shared between its process's list and
        # the chronological timeline, so completing an <unfinished ...> call or
        # renaming the root process updates both.
        self.events: dict[str, list[list[str]]] = {default_pid: []}
        self.timeline: list[list[str]] = []
        # The placeholder event of a call while it is <unfinished ...>, by pid.
        self.pending: dict[str, list[str]] = {}
        self.children: set[str] = set()
        self.live: set[str] = {default_pid}
        # The root process: its pid (from a -ff file's name, or the first prefixed pid no
        # fork returned) and its session key; "root" while its pid is unknown.
        self.root_pid = default_pid if default_pid != _ROOT else None
        self.root_key = default_pid
        self.fixed_root = default_pid != _ROOT
        self.roots = 1
        # Whether this trace follows forks (-f): a prefixed line or an "attached" note was
        # seen. Then a child that made no call yet is running all the same (a daemon's
        # parent exits at once); without -f a child is never traced.
        self.following = False
        self.last_key = default_pid  # the process of the last event
        # The kernel gives a dead process's pid to a new one: after "+++ exited", the
        # pid's next process is a session of its own, keyed PID#2, PID#3, ...
        self.exited: set[str] = set()
        self.current: dict[str, str] = {}
        self.reuses: dict[str, int] = {}

    def _key(self, pid: str) -> str:
        """The session key of the process that has ``pid`` now."""
        key = self.current.get(pid, pid)
        if key in self.exited:
            n = self.reuses[pid] = self.reuses.get(pid, 1) + 1
            key = self.current[pid] = f"{pid}#{n}"
        return key

    def _pid_of(self, prefixed: str | None) -> str:
        if prefixed is None:
            # strace drops the prefix whenever a single process is traced: the root
            # before it forks, or whichever process outlived the others. A child that
            # printed nothing is not running in this trace (no -f: never traced).
            # (in the order the processes were first seen: never a set's order)
            running = [
                k
                for k in self.events
                if k in self.live and (self.following or self.events[k] or k == self.root_key)
            ]
            if len(running) == 1:
                return running[0]
            if not running:  # every process exited: the next trace appended (strace -A)
                self._new_root()
                key = self.root_key
            elif self.root_key in running:
                key = self.root_key
            else:  # the books are behind strace's (it prints no prefix for one process)
                key = self.last_key if self.last_key in running else running[0]
        else:
            self.following = True
            if self.root_pid is None and prefixed not in self.children:
                if self.root_key not in self.live:
                    # the unknown root exited: a trace appended, every line prefixed
                    self._new_root()
                self._resolve_root(prefixed)
            key = self._key(prefixed)
        if key not in self.events:
            self.events[key] = []
            self.live.add(key)
        return key

    def _new_root(self) -> None:
        """A new first process after all exited: in a -ff file, the file's pid again (a
        reuse); otherwise a process whose pid is unknown until a prefixed line says it."""
        # The forks of the trace before are not this one's: a child it never traced (no
        # -f) is not running here.
        self.children.clear()
        self.live = {k for k in self.live if self.events.get(k)}
        self.following = False
        if self.fixed_root:
            assert self.root_pid is not None
            self.root_key = self._key(self.root_pid)
            return
        self.roots += 1
        self.root_pid = None
        self.root_key = f"{_ROOT}#{self.roots}"

    def _resolve_root(self, pid: str) -> None:
        # The first prefixed pid that no fork returned is the root, seen unprefixed so far:
        # its session takes the pid's key, where it stood.
        self.root_pid = pid
        old, key = self.root_key, self._key(pid)
        if old in self.events:
            self.events = {(key if k == old else k): v for k, v in self.events.items()}
        if old in self.pending:
            self.pending[key] = self.pending.pop(old)
        if old in self.live:
            self.live.discard(old)
            self.live.add(key)
        self.root_key = key

    def _token(self, name: str, result: str) -> str:
        return f"{name}:{result}" if self.with_result else name

    def _add(self, pid: str, token: str) -> list[str]:
        self.last_key = pid
        cell = [token]
        self.events[pid].append(cell)
        self.timeline.append(cell)
        return cell

    def feed(self, text: str) -> bool:
        """Take one line; False when it is not strace syntax."""
        attached = _ATTACHED.search(text)
        if attached:
            # Also found mid-line, where strace's stderr note cut into a traced call.
            self.children.add(attached.group("pid"))
            self.following = True
        prefix = _PREFIX.match(text)
        assert prefix is not None  # every part of the prefix is optional
        body = text[prefix.end() :].rstrip()
        prefixed = prefix.group("bracket_pid") or prefix.group("bare_pid")

        call = _CALL.match(body)
        if call:
            pid = self._pid_of(prefixed)
            name = call.group("name")
            result = _result(call.group("ret"), call.group("rest"))
            self._add(pid, self._token(name, result))
            if name in _SPAWNERS and result == "ok" and call.group("ret").isdigit():
                self._spawned(call.group("ret"))
            return True
        unfinished = _UNFINISHED.match(body) or _RESUMED_UNFINISHED.match(body)
        if unfinished:
            pid = self._pid_of(prefixed)
            if pid not in self.pending:
                # noreturn stands unless the call resumes: the process may die in it.
                self.pending[pid] = self._add(
                    pid, self._token(unfinished.group("name"), "noreturn")
                )
            return True
        resumed = _RESUMED.match(body)
        if resumed:
            pid = self._pid_of(prefixed)
            name = resumed.group("name")
            result = _result(resumed.group("ret"), resumed.group("rest"))
            cell = self.pending.pop(pid, None)
            if cell is None:
                # Resumed without its start: strace attached in the middle of the call.
                self._add(pid, self._token(name, result))
            else:
                cell[0] = self._token(name, result)
            if name in _SPAWNERS and result == "ok" and resumed.group("ret").isdigit():
                self._spawned(resumed.group("ret"))
            return True
        signal = _SIGNAL.match(body)
        if signal:
            self._add(self._pid_of(prefixed), signal.group("signal"))
            return True
        killed = _KILLED.match(body)
        if killed or _EXITED.match(body):
            pid = self._pid_of(prefixed)
            if killed:
                self._add(pid, f"killed:{killed.group('signal')}")
            self.pending.pop(pid, None)
            self.live.discard(pid)
            self.exited.add(pid)
            return True
        superseded = _SUPERSEDED.match(body)
        if superseded:
            # The thread that called execve is gone as itself; its call resumes as the
            # process whose pid it took (the line's), and its session ends there.
            thread = self.current.get(superseded.group("pid"), superseded.group("pid"))
            self.live.discard(thread)
            self.exited.add(thread)
            unfinished_call = self.pending.pop(thread, None)
            if unfinished_call is not None:
                self.pending[self._pid_of(prefixed)] = unfinished_call
            return True
        return bool(_NOTE.match(body))

    def _spawned(self, child: str) -> None:
        self.children.add(child)
        key = self._key(child)
        self.live.add(key)
        self.events.setdefault(key, [])


def _bounded_lines(fileobj: IO[str]) -> Iterator[str]:
    """The file's lines, each over MAX_LINE_CHARS replaced by _OVERLONG, never read whole."""
    for line in bounded_text_lines(fileobj, MAX_LINE_CHARS):
        yield _OVERLONG if line is None else line


def _starts_call(text: str) -> bool:
    prefix = _PREFIX.match(text)
    assert prefix is not None
    return bool(_CALL_START.match(text, prefix.end()))


def _lines_of(source: str | PathLike[str] | Iterable[str]) -> tuple[str | None, Iterable[str]]:
    if isinstance(source, (str, PathLike)):
        return os.fspath(source), ()
    return None, source


def _read(trace: _Trace, stats: StraceStats, source_name: str, line_iter: Iterable[str]) -> None:
    """Feed the lines of one strace output to ``trace``, counting what is read and
    skipped in ``stats`` (a skipped line is named by ``source_name`` and its number)."""
    # On a terminal, the traced program's output lands inside strace's lines and
    # splits a call in two: 'write(1, "hi\\n", 3hi' then ')  = 3'. A failed line that
    # starts a call is held, and retried joined with the next failed line.
    held: tuple[int, str] | None = None
    for number, raw in enumerate(line_iter, start=1):
        if raw is _OVERLONG or len(raw) > MAX_LINE_CHARS:
            stats.lines += 1
            stats._skip(source_name, number)
            continue
        text = raw.rstrip("\r\n")
        if not text.strip():
            continue
        stats.lines += 1
        if trace.feed(text):
            if held is not None:
                stats._skip(source_name, held[0])
                held = None
            continue
        if held is not None and trace.feed(held[1] + text):
            held = None
            continue
        if held is not None:
            stats._skip(source_name, held[0])
            held = None
        if _starts_call(text):
            held = (number, text)
        else:
            stats._skip(source_name, number)
    if held is not None:
        stats._skip(source_name, held[0])


def parse_strace(
    source: str | PathLike[str] | Iterable[str],
    *,
    with_result: bool = True,
    per: Literal["pid", "file"] = "pid",
    name: str | None = None,
    label: int | None = None,
) -> tuple[list[Session], StraceStats]:
    """Turn one strace output (a file, or its lines) into sessions.

    Args:
        source: a path (``str`` or ``PathLike``), an open text stream, or an iterable
            of lines.
        with_result: events are ``name:result`` (``openat:ENOENT``) rather than ``name``.
        per: ``"pid"``, one session per traced process, id ``NAME:PID`` (just ``NAME`` for
            a single unprefixed process; a ``-ff`` file ``trace.1234`` is pid 1234; a pid
            the kernel reuses after its process exited is ``NAME:PID#2``, ``#3``, ...); or
            ``"file"``, the whole trace as one session with id ``NAME``.
        name: prefix of the session ids; default the path as given, or ``"strace"``.
        label: label given to every session (``0``/``1``), or None.

    Returns:
        The sessions in order of each process's first line (processes without events are
        left out), and the counts of what was read.

    Raises:
        DataError: no line of the input is strace output (naming the file).
        ConfigError: ``per`` is not ``"pid"`` or ``"file"``.
        OSError: the file cannot be read.

    >>> lines = [
    ...     '101   openat(AT_FDCWD, "/etc/hosts", O_RDONLY) = 3',
    ...     '101   clone(child_stack=NULL, flags=SIGCHLD) = 102',
    ...     '102   openat(AT_FDCWD, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory)',
    ...     '102   exit_group(1)                     = ?',
    ...     '102   +++ exited with 1 +++',
    ... ]
    >>> sessions, stats = parse_strace(lines)
    >>> for session in sessions:
    ...     print(session.session, session.events)
    strace:101 ['openat:ok', 'clone:ok']
    strace:102 ['openat:ENOENT', 'exit_group:noreturn']
    >>> stats.skipped
    0
    """
    if per not in ("pid", "file"):
        raise ConfigError(f"per must be 'pid' or 'file', got {per!r}")
    path, lines = _lines_of(source)
    source_name = name if name is not None else (path if path is not None else "strace")
    ff = _FF_SUFFIX.search(os.path.basename(path)) if path is not None else None
    trace = _Trace(ff.group(1) if ff else _ROOT, with_result)
    stats = StraceStats()

    if path is not None:
        # errors="replace": a traced program's binary output must not stop the parse;
        # newline="\n": a lone "\r" (a program's progress output) ends no line.
        with open(path, encoding="utf-8", errors="replace", newline="\n") as fileobj:
            _read(trace, stats, source_name, _bounded_lines(fileobj))
    elif isinstance(lines, io.TextIOBase):  # an open stream (standard input)
        _read(trace, stats, source_name, _bounded_lines(cast(IO[str], lines)))
    else:
        _read(trace, stats, source_name, lines)

    where = path if path is not None else name  # errors name standard input too
    if stats.lines == 0:
        raise DataError("no strace output (the input is empty)", path=where)
    if stats.skipped == stats.lines:
        raise DataError(
            f"not strace output: none of its {stats.lines} lines parses "
            "(expected lines like 'openat(...) = 3')",
            path=where,
        )

    if not trace.timeline:
        raise DataError("strace output without any system call", path=where)
    stats.events = len(trace.timeline)
    return _sessions(trace, per, source_name, label), stats


def _sessions(trace: _Trace, per: str, source_name: str, label: int | None) -> list[Session]:
    """The sessions of a parsed trace: one per process (``per="pid"``), or one of the
    whole file."""
    if per == "file":
        # One session in the order things happened, processes interleaved.
        return [Session(source_name, [cell[0] for cell in trace.timeline], label)]
    # A trace of one unknown pid (no -f) is named after the file alone; the processes
    # of several such traces appended (-A), after the file and #2, #3, ...
    keys = [key for key, cells in trace.events.items() if cells]
    unknown = all(key == _ROOT or key.startswith(_ROOT + "#") for key in keys)
    return [
        Session(
            source_name + key[len(_ROOT) :] if unknown else f"{source_name}:{key}",
            [c[0] for c in trace.events[key]],
            label,
        )
        for key in keys
    ]
