"""The lines of a binary stream, bounded, decoded one by one: an error names the exact line.

A text stream (``open(path, encoding="utf-8")``) decodes 8 KB ahead of the line it
returns, so its ``UnicodeDecodeError`` surfaces while the lines before the bad one are
still being read, with nothing that says which line the bad byte is on. Reading bytes
and decoding each line alone (:func:`~rnnkit.data.utf8.decode_utf8`) is exact by
construction: the line is the one being decoded, the byte is its index in that line, and
a character is never split (a line end is an ASCII byte, never part of a multi-byte
character), whatever the chunks the stream was read in. It works on a pipe the same way,
one line as soon as it has arrived.

A text stream a library user hands in cannot be read that way; its decoding error is
turned into the same exact error after the fact (:func:`text_stream_start`,
:func:`invalid_utf8_in_text_stream`): the bytes it read are read again from its
``buffer``.

Lines end as universal newlines end them (``\\n``, ``\\r\\n``, a lone ``\\r``), as
``open(..., newline="")`` splits them, the form the :mod:`csv` module reads.

:func:`bounded_text_lines` reads a text stream (logs, strace output, whose readers
replace bad bytes rather than refuse them) with the same bound on a line's length.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from os import PathLike
from typing import IO, Any

from rnnkit.data.limits import MAX_FILE_BYTES, Limit
from rnnkit.data.utf8 import decode_utf8, invalid_utf8
from rnnkit.errors import DataError

__all__ = [
    "bounded_text_lines",
    "invalid_utf8_in_text_stream",
    "open_binary",
    "split_lines",
    "text_lines",
    "text_stream_start",
]

_CR, _LF = 0x0D, 0x0A


def _end_length(raw: bytes) -> int:
    """Bytes of ``raw``'s line end: 2 for ``\\r\\n``, 1 for ``\\n`` or ``\\r``, else 0."""
    if raw.endswith(b"\r\n"):
        return 2
    return 1 if raw[-1:] in (b"\n", b"\r") else 0


def bounded_text_lines(stream: IO[str], max_chars: int) -> Iterator[str | None]:
    """The lines of a text stream (a log, an strace output), each read in pieces of at
    most ``max_chars + 1`` characters: a longer line is None, its rest drained in such
    pieces, never held whole (a binary blob, a runaway dump, ``/dev/zero``).

    >>> list(bounded_text_lines(io.StringIO("ab\\n" + "x" * 9 + "\\ncd"), 4))
    ['ab\\n', None, 'cd']
    """
    while True:
        line = stream.readline(max_chars + 1)
        if not line:
            return
        if len(line) > max_chars and not line.endswith("\n"):
            while line and not line.endswith("\n"):
                line = stream.readline(max_chars)
            yield None
        else:
            yield line


def open_binary(path: str | PathLike[str]) -> IO[bytes]:
    """``open(path, "rb")``, its failure a :class:`DataError` naming the file."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise DataError("file not found", str(path)) from None
    except OSError as exc:
        raise DataError(f"cannot read: {exc.strerror or exc}", str(path)) from None


def split_lines(stream: IO[bytes], max_bytes: int | None = None) -> Iterator[bytes]:
    """The lines of ``stream`` with their line ends (``\\n``, ``\\r\\n`` or a lone ``\\r``;
    the last line may have none).

    Each read is one ``readline`` of at most ``max_bytes + 2`` bytes (a line of
    ``max_bytes`` and its ``\\r\\n``), so a line without end (``/dev/zero``) costs one
    bounded read: a line longer than ``max_bytes`` is yielded cut, without its line end,
    and the caller refuses it (reading on after it would split that line in two).

    >>> import io
    >>> list(split_lines(io.BytesIO(b"a\\r\\nb\\rc\\n\\nd")))
    [b'a\\r\\n', b'b\\r', b'c\\n', b'\\n', b'd']
    >>> next(split_lines(io.BytesIO(b"abcdefgh\\n"), max_bytes=3))
    b'abcde'
    """
    pending = b""  # the start of a line a cut read left (no \n; a lone \r only at its end)
    while True:
        room = -1 if max_bytes is None else max_bytes + 2 - len(pending)
        chunk = stream.readline(room)
        if not chunk:
            if pending:
                yield pending
            return
        data = pending + chunk
        # readline stops at the first \n: data has at most one, as its last byte. Every
        # \r before that ends a line, unless a \n follows it; a \r as the last byte is
        # undecided until the next read (a \r\n cut by the bound).
        start = 0
        cr = data.find(b"\r")
        while 0 <= cr < len(data) - 1:
            if data[cr + 1] != _LF:
                yield data[start : cr + 1]
                start = cr + 1
            cr = data.find(b"\r", cr + 1)
        rest = data[start:]
        pending = b""
        if rest[-1] == _LF:
            yield rest
        elif max_bytes is not None and len(rest) - (rest[-1] == _CR) > max_bytes:
            yield rest  # too long: the caller stops here
        else:
            pending = rest


def text_lines(
    stream: IO[bytes],
    path: str | PathLike[str] | None,
    limit: Limit,
    *,
    file_limit: int | None = None,
) -> Iterator[tuple[int, str]]:
    """``(line number, text with its line end)`` of a UTF-8 stream, numbered from 1, each
    line decoded alone (invalid UTF-8: the one error naming ``path:line``, see
    :mod:`rnnkit.data.utf8`). A byte-order mark at the start is dropped.

    Args:
        stream: a binary stream: a file opened ``"rb"``, ``sys.stdin.buffer``.
        path: the name for errors.
        limit: the longest line, line end excluded, in ``limit.unit``: bytes, or
            characters (read as at most 4 bytes each, UTF-8's widest); its value in force
            (:meth:`~rnnkit.data.limits.Limit.value`).
        file_limit: the most bytes in all (:data:`~rnnkit.data.limits.MAX_FILE_BYTES`'s
            value), checked as the lines come; None: no limit.

    Raises:
        DataError: invalid UTF-8, a line or a file over its limit.

    >>> import io
    >>> from rnnkit.data.limits import MAX_LINE_CHARS
    >>> list(text_lines(io.BytesIO("\\ufeffa\\r\\nb".encode()), "in.txt", MAX_LINE_CHARS))
    [(1, 'a\\r\\n'), (2, 'b')]
    >>> list(text_lines(io.BytesIO(b"ok\\nok\\n\\xff\\n"), "in.txt", MAX_LINE_CHARS))
    Traceback (most recent call last):
    ...
    rnnkit.errors.DataError: in.txt:3: invalid UTF-8 at byte 1 of the line (byte 0xff)
    """
    most = limit.value()
    chars = limit.unit == "characters"
    max_bytes = 4 * most if chars else most
    too_long = limit.exceeded("line too long", most)
    total = 0
    for number, raw in enumerate(split_lines(stream, max_bytes), start=1):
        # The line end is looked at only for a line that may be too long: the common line
        # is within the limit with its end, and is checked by its length alone.
        if len(raw) > max_bytes and len(raw) - _end_length(raw) > max_bytes:
            raise DataError(too_long, path, number)
        total += len(raw)
        if file_limit is not None and total > file_limit:
            found = f"file of more than {file_limit:,} bytes"
            raise DataError(MAX_FILE_BYTES.exceeded(found, file_limit), path)
        text = decode_utf8(raw, path, number)
        if number == 1 and text.startswith("\ufeff"):
            text = text[1:]  # a byte-order mark from a Windows editor is not content
        if chars and len(text) > most and len(text) - _end_length(raw) > most:
            raise DataError(too_long, path, number)
        yield number, text


def text_stream_start(stream: IO[Any]) -> int | None:
    """The byte offset a text stream (``open(path)``) will read its next line from, or None
    where that is not known: a binary stream, a pipe, a position after ``next(stream)``.

    A text stream's :meth:`~io.TextIOBase.tell` is an opaque cookie; below ``2**64`` it is
    the plain byte offset with the decoder in its initial state (the high bits hold the
    decoder's pending bytes and flags), the only case the bytes can be read again from.
    """
    if not isinstance(stream, io.TextIOBase) or getattr(stream, "buffer", None) is None:
        return None
    try:
        cookie = stream.tell()
    except (OSError, ValueError):  # a pipe; telling disabled by next(); a closed stream
        return None
    return cookie if 0 <= cookie < 2**64 else None


def invalid_utf8_in_text_stream(
    stream: IO[Any],
    exc: UnicodeDecodeError,
    path: str | PathLike[str] | None,
    line: int,
    start: int | None,
    max_bytes: int,
) -> DataError:
    """The error for a text stream's ``UnicodeDecodeError`` raised while reading ``line``.

    The stream decodes in chunks of 8 KB ahead of the line it returns, so the bad byte is
    on ``line`` or a later one. Where the stream's bytes can be read again (its ``buffer``
    seeks, and ``start`` is :func:`text_stream_start` before the first line), they are,
    line by line as :func:`text_lines` reads them: the error is then the exact one of a
    binary stream (``path:N: invalid UTF-8 at byte B of the line (byte 0x..)``), and the
    buffer is put back where it was. Otherwise the error says what is known: the line
    being read and the byte.

    Args:
        stream: the text stream that raised ``exc``.
        exc: its decoding error.
        path, line: the file and the (1-based) line being read when it was raised.
        start: the byte offset of line 1 in ``stream.buffer``, or None.
        max_bytes: the longest line to read again, in bytes.

    >>> raw = b'ok\\n' * 5000 + b'\\xff\\n'
    >>> text = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
    >>> start = text_stream_start(text)
    >>> try:
    ...     while text.readline():
    ...         pass
    ... except UnicodeDecodeError as exc:
    ...     print(invalid_utf8_in_text_stream(text, exc, "in.txt", 2731, start, 100))
    in.txt:5001: invalid UTF-8 at byte 1 of the line (byte 0xff)
    """
    exact = None if start is None else _reread(stream, start, path, max_bytes)
    if exact is not None:
        return exact
    byte = exc.object[exc.start] if isinstance(exc.object, bytes) else None
    value = "" if byte is None else f" (byte 0x{byte:02x})"
    return DataError(
        f"invalid UTF-8{value} on this line or a later one (a text stream decodes ahead; "
        "open the file in binary mode for the exact line)",
        path,
        line,
    )


def _reread(
    stream: IO[Any], start: int, path: str | PathLike[str] | None, max_bytes: int
) -> DataError | None:
    """The exact error of the first undecodable line of ``stream.buffer`` from ``start``;
    None where the buffer cannot be read again, or reads valid now (the file changed)."""
    buffer = getattr(stream, "buffer", None)
    try:
        if buffer is None or not buffer.seekable():
            return None
        here = buffer.tell()
        try:
            buffer.seek(start)
            for number, raw in enumerate(split_lines(buffer, max_bytes), start=1):
                if len(raw) - _end_length(raw) > max_bytes:
                    return None  # cut by the bound: the lines after it would be miscounted
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    return invalid_utf8(raw, exc.start, path, number)
        finally:
            buffer.seek(here)
    except (OSError, ValueError):
        return None
    return None
