"""The standard streams of the commands: whole documents to standard output (``--out -``),
every byte or an error naming it; standard input read as a log file is."""

from __future__ import annotations

import contextlib
import errno
import io
import sys
from collections.abc import Iterator
from typing import IO

__all__ = ["stdin_as_log", "write_stdout"]


@contextlib.contextmanager
def stdin_as_log() -> Iterator[IO[str]]:
    """Standard input read as a log or strace file is (INPUT ``-``): UTF-8 with bad bytes
    replaced, a line ending at ``\\n`` (or ``\\r\\n``) only, never at a lone ``\\r``."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text-only stream (main() under a StringIO stdin)
        yield sys.stdin
        return
    stream = io.TextIOWrapper(buffer, encoding="utf-8", errors="replace", newline="\n")
    try:
        yield stream
    finally:
        stream.detach()  # sys.stdin itself stays open


def write_stdout(data: bytes) -> None:
    """All of ``data`` to standard output, or an ``OSError`` naming it: one large write to
    a full disk or past a file-size limit wrote a part and said nothing (the buffered
    writer returns the count of a partial write rather than failing)."""
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (main() under redirect_stdout(StringIO()))
        sys.stdout.write(data.decode("utf-8", "surrogateescape"))
        return
    view = memoryview(data)
    try:
        while view:
            written = out.write(view)
            if not written:  # None: a non-blocking stream that took nothing
                raise OSError(errno.EAGAIN, "it took no more bytes")
            view = view[written:]
        out.flush()
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, "standard output") from None
