"""Reading a growing file or a pipe line by line as it is written (``tail -F``).

:func:`follow_lines` yields complete lines in batches as they arrive, survives log
rotation (by rename or by truncation) and never holds more than one line's worth of an
overlong line in memory. Several renames between two reads (``app.log`` rotated twice
within one poll) are caught up by the numbered names of ``logrotate``: the files between
the one being read (found again as ``app.log.K``) and the new ``app.log`` are
``app.log.K-1 … app.log.1``, read whole, oldest first, with a warning naming them.
``rnnkit score --follow`` parses what it yields with
:func:`~rnnkit.anomaly.stream_format.parse_stream_line`.
"""

from __future__ import annotations

import os
import select
import stat
import time
from collections.abc import Callable, Iterator

from rnnkit import messages
from rnnkit.data.events import MAX_LINE_BYTES
from rnnkit.data.limits import MAX_JSON_LINE_BYTES
from rnnkit.errors import DataError

__all__ = ["OVERLONG", "follow_lines"]

#: Stands for a line longer than MAX_LINE_BYTES in what :func:`follow_lines` yields.
OVERLONG = b"\0overlong"


def follow_lines(
    source: str,
    *,
    follow: bool = True,
    poll: float = 0.2,
    until_idle: float | None = None,
    read_size: int = 1 << 16,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[list[tuple[int, bytes]]]:
    """Complete lines of a growing file or a pipe, in batches as they arrive.

    Yields a list of ``(line number, line bytes without newline)`` per read; an empty list
    when ``poll`` seconds passed without a complete line (so the caller can close idle
    sessions). A line longer than :data:`~rnnkit.data.events.MAX_LINE_BYTES` is yielded
    as :data:`OVERLONG`. Blank lines are skipped (their numbers still count).

    Args:
        source: a path, or ``"-"`` for standard input.
        follow: at the end of a regular file, wait for more (``tail -f``); a pipe ends
            when its writer closes it.
        poll: seconds between checks for new data.
        until_idle: stop after this many seconds without new data (None: never).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "e.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"a": 1}\\n\\n{"b": 2}\\n{"c": 3}')
    >>> [batch for batch in follow_lines(path, follow=False) if batch]
    [[(1, b'{"a": 1}'), (3, b'{"b": 2}')], [(4, b'{"c": 3}')]]
    """
    # One loop over one file descriptor, not split further: its state (offset, the last
    # bytes read, the partial line, the line number, an overlong line being skipped) is
    # reset together wherever the file is truncated or rotated, and helpers would each
    # have to take and return all of it.
    if source == "-":
        fd, owned = 0, False
    else:
        fd, owned = _open(source), True
    try:
        limit = MAX_JSON_LINE_BYTES.value(default=MAX_LINE_BYTES)
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
        buffer = b""
        number = 0
        skipping = False  # inside an overlong line, until its newline
        last_data = clock()
        offset = 0
        tail = b""  # the last bytes read, up to offset: to notice a file rewritten under us
        head = b""  # and the first ones (a rewrite may end as the old content did)
        while True:
            if regular:
                size = os.fstat(fd).st_size
                if (
                    size < offset
                    or (tail and os.pread(fd, len(tail), offset - len(tail)) != tail)
                    or (head and os.pread(fd, len(head), 0) != head)
                ):
                    # Truncated (log rotation by copytruncate), even if it has grown back
                    # past our offset since: start over at 0. A partial line of the old
                    # content is dropped, never joined to the new content.
                    os.lseek(fd, 0, os.SEEK_SET)
                    offset, buffer, tail, head, number, skipping = 0, b"", b"", b"", 0, False
                chunk = os.read(fd, read_size)
                if not chunk and owned and follow and _renamed(fd, source):
                    # The name now points to a new file (rotation by rename, as `tail -F`
                    # follows): one last read of the old file, then its last line ends
                    # there and the new file is read from its start.
                    chunk = os.read(fd, read_size)
                    if not chunk:
                        if buffer.strip() and not skipping:
                            yield [(number + 1, _last_line(buffer, number))]
                        missed = _unread_rotations(source, os.fstat(fd))
                        os.close(fd)
                        fd = -1
                        if missed:
                            messages.warning(
                                f"{source} was rotated {len(missed) + 1} times since the last "
                                f"read; reading {', '.join(missed)} as well"
                            )
                        for name in missed:
                            yield from (b for b in follow_lines(name, follow=False) if b)
                        fd = _open(source)
                        regular = stat.S_ISREG(os.fstat(fd).st_mode)
                        offset, buffer, tail, head, number, skipping = 0, b"", b"", b"", 0, False
                        continue
                if not chunk:
                    if not follow:
                        break
                    if until_idle is not None and clock() - last_data >= until_idle:
                        break
                    time.sleep(poll)
                    yield []
                    continue
            else:
                ready, _, _ = select.select([fd], [], [], poll)
                if not ready:
                    if until_idle is not None and clock() - last_data >= until_idle:
                        break
                    yield []
                    continue
                chunk = os.read(fd, read_size)
                if not chunk:
                    break  # the writer closed the pipe
            offset += len(chunk)
            tail = (tail + chunk)[-64:]
            if len(head) < 64:
                head = (head + chunk)[:64]
            last_data = clock()
            batch, buffer, number, skipping = _complete_lines(
                buffer + chunk, number, skipping, limit
            )
            if batch:
                yield batch
        if buffer.strip() and not skipping:
            yield [(number + 1, _last_line(buffer, number))]  # a last line without newline
    finally:
        if owned and fd >= 0:
            os.close(fd)


#: The most numbered rotations (``app.log.1`` …) searched for the file that was being read.
def _open(source: str) -> int:
    """A file descriptor on ``source`` to read; a :class:`DataError` naming it where it
    cannot be read, or is a directory (``open`` takes one; the first read failed with a
    bare ``Is a directory``)."""
    try:
        fd = os.open(source, os.O_RDONLY)
    except FileNotFoundError:
        raise DataError("file not found", source) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", source) from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError("is a directory, not a data file", source)
    return fd


def _complete_lines(
    buffer: bytes, number: int, skipping: bool, limit: int
) -> tuple[list[tuple[int, bytes]], bytes, int, bool]:
    """The complete lines of ``buffer`` as ``(line number, bytes)`` (blank lines counted,
    not given; a line over ``limit`` bytes as :data:`OVERLONG`, and the rest of a line
    already reported overlong skipped), the partial line left, the last line number and
    whether the partial line is being skipped.

    >>> _complete_lines(b"a\\n\\nbb\\ncc", 0, False, 5)
    ([(1, b'a'), (3, b'bb')], b'cc', 3, False)
    >>> _complete_lines(b"rest\\nx\\n" + b"y" * 9, 4, True, 5)
    ([(6, b'x'), (7, b'\\x00overlong')], b'', 7, True)
    """
    lines = buffer.split(b"\n")
    buffer = lines.pop()
    batch = []
    for raw in lines:
        number += 1
        if number == 1:
            raw = _without_bom(raw)
        if skipping:
            skipping = False
            continue
        if len(raw) > limit:
            batch.append((number, OVERLONG))
        elif raw.strip():
            batch.append((number, raw.rstrip(b"\r")))
    if len(buffer) > limit:
        number += 1
        batch.append((number, OVERLONG))
        buffer, skipping = b"", True
    return batch, buffer, number, skipping


MAX_ROTATIONS = 20

#: UTF-8's byte-order mark, which Windows editors and tools write at a file's start.
_BOM = b"\xef\xbb\xbf"


def _last_line(buffer: bytes, number: int) -> bytes:
    """The partial line left at the end of a file, as a line (``number`` lines before it)."""
    line = buffer.rstrip(b"\r")
    return _without_bom(line) if number == 0 else line


def _without_bom(first: bytes) -> bytes:
    """A file's first line without a leading byte-order mark (not content: the other
    readers drop it too).

    >>> _without_bom(b"\\xef\\xbb\\xbf{}"), _without_bom(b"{}")
    (b'{}', b'{}')
    """
    return first[len(_BOM) :] if first.startswith(_BOM) else first


def _unread_rotations(source: str, old: os.stat_result) -> list[str]:
    """The rotated files between ``old`` (the file being read, now renamed) and the new
    ``source``, oldest first: when ``old`` is ``source.K`` with ``K > 1``, the files
    ``source.K-1 … source.1`` were written and rotated between two reads. Empty when
    ``old`` is ``source.1`` (one rotation) or not found under a numbered name."""
    names: list[str] = []
    for k in range(1, MAX_ROTATIONS + 1):
        name = f"{source}.{k}"
        try:
            found = os.stat(name)
        except OSError:
            return []
        if (found.st_ino, found.st_dev) == (old.st_ino, old.st_dev):
            return names[::-1]
        if stat.S_ISREG(found.st_mode):
            names.append(name)
    return []


def _renamed(fd: int, path: str) -> bool:
    """Whether ``path`` names another file than the open ``fd`` now (a rotation). While
    the name is missing (between the rename and the new file), keep the old one."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    old = os.fstat(fd)
    return (now.st_ino, now.st_dev) != (old.st_ino, old.st_dev)
