"""Whole documents to standard output (``--out -``): every byte, or an error naming it."""

from __future__ import annotations

import errno
import sys

__all__ = ["write_stdout"]


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
